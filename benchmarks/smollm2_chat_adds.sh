#!/usr/bin/env bash
# What the LM's chat answers add: the shipped SmolLM2 head trained the same steps on its own continuations alone
# and on continuations and answers together (the stores benchmarks/smollm2_hour.sh and smollm2_own_head.sh make),
# scored teacher-forced on the three held-out texts.
#   bash benchmarks/smollm2_chat_adds.sh [--dry-run]   (RUNS=runs/own2, STEPS=120; a trained head is kept)
source "$(dirname "$0")/smollm2_common.sh"  # strict mode, --dry-run, run/logged, G (the GGUF), NX
R=${RUNS:-runs/own2}
STEPS=${STEPS:-120}
for pair in continuations:features-continuations mixed:features-train; do
    name=adds-${pair%%:*} store=$R/${pair#*:}
    if ((dry)) || [[ ! -f $R/$name/head.json ]]; then
        run mtpc train --model "$G" --init-head models/heads/smollm2-ff4-k2048 --loss kl --features "$store" \
            --out "$R/$name" --steps "$STEPS" --seq-len 512 --batch-size 8 --lr 0.001 --val-every 100000 --dtype bf16 \
            --no-progress
    fi
    for text in nx-own:runs/own/features-nx-own:train nx:runs/features-nx:val nx-chat:$R/features-nx-chat:train; do
        IFS=: read -r tag features split <<< "$text"
        run python benchmarks/depth_acceptance.py --model "$G" --head "$R/$name" --features "$features" \
            --split "$split" --windows 2048 --out "$R/score-$name-$tag.json"
    done
done
