#!/usr/bin/env bash
# The MtPC paper's RQ2 on SmolLM2-135M-Instruct at equal tokens seen (not equal minutes): FF, CP, HMM and BTree
# heads at n = 4, and the FF with a LoRA draft path on the last layer, each trained from scratch for the same
# steps on the same cached features of the LM's own text (benchmarks/smollm2_own_text.sh makes them), then
# scored teacher-forced on held-out text none of them saw: SmolLM2's own greedy continuations of networkx
# prompts (the text a decoder verifies) and networkx's sources.
#   bash benchmarks/smollm2_rq2.sh [--dry-run]   (RUNS=runs/rq2, OWN=runs/own by default; a head already
#                                               trained is kept, so a killed run goes on where it stopped)
#   python benchmarks/smollm2_rq2.py collect     # the records -> benchmarks/results/rq2_smollm2.json
# One thread per job; the trainings run one at a time (their tokens per second are part of the record).
source "$(dirname "$0")/smollm2_common.sh"  # strict mode, --dry-run, run/logged, G (the GGUF), NX
R=${RUNS:-runs/rq2}
OWN=${OWN:-runs/own}
STEPS=${STEPS:-64}  # x 8 sequences x 512 tokens: 262,144 tokens seen by every head
mkdir -p "$R"
# the LM's inner states for the LoRA row: the input of its last layer, over the same text and the held-out text
run mtpc features --model "$G" --data "$OWN/stdlib-own.jsonl" --out "$R/features-own-inner1" --draft-layers 1 \
    --val-sequences 8 --dtype bf16 --threads 1 --no-progress
run mtpc features --model "$G" --data "$OWN/nx-own.jsonl" --out "$R/features-nx-own-inner1" --draft-layers 1 \
    --val-sequences 1 --dtype bf16 --threads 1 --no-progress
common=(--model "$G" --parameterisation tied --first-token-mlp 1024 --loss kl --draft-vocab 2048 --steps "$STEPS"
        --seq-len 512 --batch-size 8 --val-every 1000 --dtype bf16 --no-progress)
train() {  # train NAME FEATURES ARGS...
    local name=$1 features=$2; shift 2
    if ((dry)); then echo mtpc train "${common[@]}" --features "$features" --out "$R/$name" "$@"; return 0; fi
    [[ -f $R/$name/head.json ]] || mtpc train "${common[@]}" --features "$features" --out "$R/$name" "$@" \
        > "$R/$name.log" 2>&1
}
score() {  # score NAME HELD-OUT-STORE TAG
    run python benchmarks/depth_acceptance.py --model "$G" --head "$R/$1" --features "$2" --split train \
        --windows 2048 --out "$R/score-$1-$3.json"
}
train ff4 "$OWN/features-own" --circuit examples/ff.pc -D n=4
train cp4 "$OWN/features-own" --circuit examples/cp.pc -D n=4 -D r=8
train hmm4 "$OWN/features-own" --circuit examples/hmm.pc -D n=4 -D r=8
train btree4 "$OWN/features-own" --circuit examples/btree.pc -D n=4 -D r=4
train ff4-lora1 "$R/features-own-inner1" --circuit examples/ff.pc -D n=4 --lora-layers 1
for h in ff4 cp4 hmm4 btree4; do score $h "$OWN/features-nx-own" nx-own; done
score ff4-lora1 "$R/features-nx-own-inner1" nx-own
# 3. in decoding, alone on the machine: greedy, eager, one thread, the README bench's held-out networkx prompts
#    (tokens per cycle and milliseconds per cycle; EXTRA_HEADS="DIR ..." benches more heads in the same run)
run mtpc bench --model "$G" --heads "$R/ff4" "$R/cp4" "$R/hmm4" "$R/btree4" "$R/ff4-lora1" \
    models/heads/smollm2-ff4-k2048 ${EXTRA_HEADS:-} --corpus "$NX" --num-prompts 6 --repeats 1 --prompt-len 128 \
    --max-new-tokens 128 --threads 1 --dtype bf16 --mode greedy --no-progress --out docs/bench/smollm2-rq2
run python benchmarks/results_file.py strip-paths docs/bench/smollm2-rq2
