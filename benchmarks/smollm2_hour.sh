#!/usr/bin/env bash
# An hour for the structure that drafted best at equal tokens (benchmarks/smollm2_rq2.sh: the CP, r = 8, n = 4):
# trained from scratch for $MINUTES minutes on the LM's own continuations of 2,048 standard-library prompts
# (runs/own2/stdlib-own.jsonl from benchmarks/smollm2_own_head.sh), then scored teacher-forced on the same
# held-out texts as the other heads.
#   bash benchmarks/smollm2_hour.sh [--dry-run]   (RUNS=runs/own2, MINUTES=60; every step resumes)
# One thread.
source "$(dirname "$0")/smollm2_common.sh"  # strict mode, --dry-run, run/logged, G (the GGUF), NX
R=${RUNS:-runs/own2}
MINUTES=${MINUTES:-60}
run mtpc features --model "$G" --data "$R/stdlib-own.jsonl" --out "$R/features-continuations" --val-sequences 16 \
    --dtype bf16 --threads 1 --no-progress
if ((dry)) || [[ ! -f $R/cp4-hour/head.json ]]; then
    run mtpc train --model "$G" --features "$R/features-continuations" --out "$R/cp4-hour" --circuit examples/cp.pc \
        -D n=4 -D r=8 --parameterisation tied --first-token-mlp 1024 --loss kl --draft-vocab 2048 \
        --minutes "$MINUTES" --seq-len 512 --batch-size 8 --val-every 500 --dtype bf16 --no-progress
fi
run python benchmarks/depth_acceptance.py --model "$G" --head "$R/cp4-hour" --features runs/own/features-nx-own \
    --split train --windows 2048 --out "$R/score-cp4-hour-nx-own.json"
run python benchmarks/depth_acceptance.py --model "$G" --head "$R/cp4-hour" --features runs/features-nx \
    --windows 2048 --out "$R/score-cp4-hour-nx.json"
run python benchmarks/depth_acceptance.py --model "$G" --head "$R/cp4-hour" --features "$R/features-nx-chat" \
    --split train --windows 2048 --out "$R/score-cp4-hour-nx-chat.json"
