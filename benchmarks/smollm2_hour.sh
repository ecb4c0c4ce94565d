#!/usr/bin/env bash
# An hour for the structure that drafted best at equal tokens (benchmarks/smollm2_rq2.sh: the CP, r = 8, n = 4):
# trained from scratch for $MINUTES minutes on the LM's own continuations of 2,048 standard-library prompts
# (runs/own2/stdlib-own.jsonl from benchmarks/smollm2_own_head.sh), then scored teacher-forced on the same
# held-out texts as the other heads; then $MORE minutes more from it on the continuations and the LM's chat
# answers together (runs/own2/features-train, what the shipped -own head saw): cp4-mixed; then $THIRD minutes
# more on the same text at half the learning rate: cp4-third.
#   bash benchmarks/smollm2_hour.sh [--dry-run]   (RUNS=runs/own2, MINUTES=60, MORE=60, THIRD=60; every step
#   resumes)
# One thread.
source "$(dirname "$0")/smollm2_common.sh"  # strict mode, --dry-run, run/logged, G (the GGUF), NX
R=${RUNS:-runs/own2}
MINUTES=${MINUTES:-60}
MORE=${MORE:-60}
THIRD=${THIRD:-60}
run mtpc features --model "$G" --data "$R/stdlib-own.jsonl" --out "$R/features-continuations" --val-sequences 16 \
    --dtype bf16 --threads 1 --no-progress
if ((dry)) || [[ ! -f $R/cp4-hour/head.json ]]; then
    run mtpc train --model "$G" --features "$R/features-continuations" --out "$R/cp4-hour" --circuit examples/cp.pc \
        -D n=4 -D r=8 --parameterisation tied --first-token-mlp 1024 --loss kl --draft-vocab 2048 \
        --minutes "$MINUTES" --seq-len 512 --batch-size 8 --val-every 500 --dtype bf16 --no-progress
fi
if ((dry)) || [[ ! -f $R/cp4-mixed/head.json ]]; then
    run mtpc train --model "$G" --init-head "$R/cp4-hour" --loss kl --features "$R/features-train" --out "$R/cp4-mixed" \
        --minutes "$MORE" --seq-len 512 --batch-size 8 --lr 0.001 --val-every 500 --dtype bf16 --no-progress
fi
if ((dry)) || [[ ! -f $R/cp4-third/head.json ]]; then
    run mtpc train --model "$G" --init-head "$R/cp4-mixed" --loss kl --features "$R/features-train" --out "$R/cp4-third" \
        --minutes "$THIRD" --seq-len 512 --batch-size 8 --lr 0.0005 --val-every 500 --dtype bf16 --no-progress
fi
for name in cp4-hour cp4-mixed cp4-third; do  # a score already written is kept
    for set in nx-own:runs/own/features-nx-own:train nx:runs/features-nx:val nx-chat:$R/features-nx-chat:train; do
        IFS=: read -r text store split <<< "$set"
        if ((dry)) || [[ ! -f $R/score-$name-$text.json ]]; then
            run python benchmarks/depth_acceptance.py --model "$G" --head "$R/$name" --features "$store" \
                --split "$split" --windows 2048 --out "$R/score-$name-$text.json"
        fi
    done
done
