#!/usr/bin/env bash
# A SmolLM2 head trained on the LM's own text at volume: its continuations of 2,048 standard-library prompts and
# its answers to 1,024 instructions written from the standard library's module names and docstrings
# (`mtpc distill-data --chat`), the shipped head (models/heads/smollm2-ff4-k2048) trained on from them for
# $MINUTES minutes; then it and the shipped head scored teacher-forced on held-out text neither saw: the LM's own
# greedy continuations of networkx prompts, networkx's sources, and the LM's greedy answers to instructions about
# networkx.
#   bash benchmarks/smollm2_own_head.sh [--dry-run]   (RUNS=runs/own2, MINUTES=30; every step resumes)
# Needs runs/own/features-nx-own (benchmarks/smollm2_own_text.sh) and runs/features-nx (docs/results.md, "Per
# depth"). One thread per job.
source "$(dirname "$0")/smollm2_common.sh"  # strict mode, --dry-run, run/logged, G (the GGUF), NX
R=${RUNS:-runs/own2}
MINUTES=${MINUTES:-30}
HEAD=models/heads/smollm2-ff4-k2048
mkdir -p "$R"
# 1. the LM's own text: continuations (half greedy, half T = 0.7) and chat answers (likewise); held out, its
#    greedy answers to instructions about networkx
run mtpc distill-data --model "$G" --out "$R/stdlib-own.jsonl" --num-prompts 2048 --prompt-len 64 \
    --max-new-tokens 192 --batch-size 32 --greedy-fraction 0.5 --temperature 0.7 --dtype bf16 --seed 0 --no-progress
run mtpc distill-data --model "$G" --chat --out "$R/stdlib-chat.jsonl" --num-prompts 1024 --max-new-tokens 256 \
    --batch-size 32 --greedy-fraction 0.5 --temperature 0.7 --dtype bf16 --seed 0 --no-progress
run mtpc distill-data --model "$G" --chat --data "$NX" --out "$R/nx-chat.jsonl" --num-prompts 64 \
    --max-new-tokens 256 --batch-size 32 --greedy-fraction 1 --dtype bf16 --seed 1 --no-progress
# 2. the LM's hidden states over both training files (one store) and over the held-out answers
run mtpc features --model "$G" --data "$R/stdlib-*.jsonl" --out "$R/features-train" --val-sequences 16 \
    --dtype bf16 --threads 1 --no-progress
run mtpc features --model "$G" --data "$R/nx-chat.jsonl" --out "$R/features-nx-chat" --val-sequences 1 \
    --dtype bf16 --threads 1 --no-progress
# 3. the shipped head trained on (it keeps its circuit, draft vocabulary, tying and first-token MLP)
if ((dry)) || [[ ! -f $R/head/head.json ]]; then
    run mtpc train --model "$G" --init-head "$HEAD" --loss kl --features "$R/features-train" --out "$R/head" \
        --minutes "$MINUTES" --seq-len 512 --batch-size 8 --lr 0.001 --val-every 200 --dtype bf16 --no-progress
fi
# 4. both heads on the three held-out texts
for h in shipped:$HEAD own:$R/head; do
    name=${h%%:*} folder=${h#*:}
    run python benchmarks/depth_acceptance.py --model "$G" --head "$folder" --features runs/own/features-nx-own \
        --split train --windows 2048 --out "$R/score-$name-nx-own.json"
    run python benchmarks/depth_acceptance.py --model "$G" --head "$folder" --features runs/features-nx \
        --windows 2048 --out "$R/score-$name-nx.json"
    run python benchmarks/depth_acceptance.py --model "$G" --head "$folder" --features "$R/features-nx-chat" \
        --split train --windows 2048 --out "$R/score-$name-nx-chat.json"
done
