#!/usr/bin/env bash
# Does the LM's own text make a better draft head? SmolLM2-135M-Instruct's own continuations of standard-library
# prompts against the same number of tokens of the standard library's own text: the shipped head
# (models/heads/smollm2-ff4-k2048) trained further on each for the same steps, then scored on held-out text it
# never saw: networkx's sources (teacher-forced, as mtpc train validates) and SmolLM2's own greedy
# continuations of networkx prompts (the text a decoder verifies). One thread per job, two jobs at a time.
#   bash benchmarks/smollm2_own_text.sh [--dry-run]   (RUNS=runs/own by default; every step resumes; --dry-run
#                                                    prints the commands and runs nothing)
# Each head's scores go to $RUNS/score-*.json (benchmarks/depth_acceptance.py's records).
source "$(dirname "$0")/smollm2_common.sh"  # strict mode, --dry-run, run/logged, G (the GGUF), NX
R=${RUNS:-runs/own}
HEAD=models/heads/smollm2-ff4-k2048
STEPS=${STEPS:-60}
mkdir -p "$R"
# 1. the LM's own text: continuations of standard-library prompts (its training side), half greedy, half at T = 0.7;
#    and, held out, its greedy continuations of networkx prompts
run mtpc distill-data --model "$G" --out "$R/stdlib-own.jsonl" --num-prompts 512 --prompt-len 64 --max-new-tokens 192 \
    --batch-size 16 --greedy-fraction 0.5 --temperature 0.7 --dtype bf16 --seed 0 --no-progress
run mtpc distill-data --model "$G" --data "$NX" --out "$R/nx-own.jsonl" --num-prompts 64 --prompt-len 64 \
    --max-new-tokens 192 --batch-size 16 --greedy-fraction 1 --dtype bf16 --seed 1 --no-progress
# 2. the LM's hidden states over each (one pass), the standard library's own text cut to as many sequences
run mtpc features --model "$G" --data "$R/stdlib-own.jsonl" --out "$R/features-own" --val-sequences 8 --dtype bf16 \
    --threads 1 --no-progress
OWN_TOKENS=262144  # a dry run's stand-in: the real count is read from the store
((dry)) || OWN_TOKENS=$(python -c "import json; d = json.load(open('$R/features-own/features.json')); print(d['settings']['seq_len'] * sum(s['sequences'] for s in d['shards'].values() if s['split'] == 'train'))")
run mtpc features --model "$G" --out "$R/features-std" --max-tokens "$OWN_TOKENS" --val-sequences 8 --dtype bf16 \
    --threads 1 --no-progress &
run mtpc features --model "$G" --data "$R/nx-own.jsonl" --out "$R/features-nx-own" --val-sequences 1 \
    --dtype bf16 --threads 1 --no-progress &
wait
# 3. the shipped head trained on, the same steps on each (the shipped head's own settings)
# (the head keeps its circuit, draft vocabulary, tying and first-token MLP; a lower peak lr: it is trained already)
TRAIN="--model $G --init-head $HEAD --loss kl --steps $STEPS --seq-len 512 --batch-size 8 --lr 0.0005 --dtype bf16
       --no-progress"
logged "$R/train-own.log" mtpc train $TRAIN --features "$R/features-own" --out "$R/head-own" &
logged "$R/train-std.log" mtpc train $TRAIN --features "$R/features-std" --out "$R/head-std" &
wait
# 4. per-depth acceptance of each head on the held-out text (the LM runs no more: the stores hold its states)
# (networkx is in no head's training text: the store's training split is held-out text too)
run python benchmarks/depth_acceptance.py --model "$G" --head "$HEAD" --features "$R/features-nx-own" --split train \
    --windows 2048 --out "$R/score-shipped-nx-own.json"
for h in own std; do
    run python benchmarks/depth_acceptance.py --model "$G" --head "$R/head-$h" --features "$R/features-nx-own" \
        --split train --windows 2048 --out "$R/score-$h-nx-own.json"
done
