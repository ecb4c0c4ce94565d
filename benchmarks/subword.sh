#!/usr/bin/env bash
# The subword reference of models/ (models/subword-lm and models/heads/subword-btree4-r4-tied), on one CPU thread.
#
#   benchmarks/subword.sh lm        # a 2,048-token byte-level BPE trained on the stdlib's training files,
#                                   # then a d = 192 Llama on its tokens for $LM_MINUTES (25) minutes, fp32;
#                                   # the folder is copied (without checkpoint.pt) to $MODEL
#   benchmarks/subword.sh distill   # the LM's own continuations (T = 1) of prompts from its training files
#   benchmarks/subword.sh head      # a tied head (BTree, n = 4, r = 4) distilled with --loss kl for $HEAD_MINUTES (15)
#   benchmarks/subword.sh first     # stage 2: that head 20 more minutes, reading each window's first token (--first-token)
#   benchmarks/subword.sh mlp       # stage 3: 45 more minutes, reading it through a residual MLP (--first-token-mlp 384)
#   benchmarks/subword.sh ship      # copy the stage-3 head (without checkpoint.pt) to $SHIP_HEAD
#   benchmarks/subword.sh bench     # T = 1 bench on held-out third-party files: plain (eager, compiled), the tied
#                                   # head (timings: run it on a quiet machine; BENCH_FLAGS adds options:
#                                   # a later --num-prompts or --max-new-tokens wins)
#   benchmarks/subword.sh           # lm, distill, head, first, mlp, ship, in this order (about two hours)
#   benchmarks/subword.sh --dry-run [STAGE]   # print the commands a stage would run, run none of them
#   benchmarks/subword.sh --help
#
# Everything goes under $RUNS (default runs/subword). Rerunning a stage resumes it from its checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/recipe.sh  # --help, --dry-run (DRY_RUN) and run: a command, or its printed line
export OMP_NUM_THREADS=1 RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false

RUNS=${RUNS:-runs/subword}
LM_MINUTES=${LM_MINUTES:-25}
HEAD_MINUTES=${HEAD_MINUTES:-15}
LM_RUN=${LM_RUN:-$RUNS/lm}
MODEL=${MODEL:-models/subword-lm}  # the shipped LM: what distill, head and bench use
HEAD=${HEAD:-$RUNS/head-btree4-r4-tied}
FIRST=$RUNS/head-first  # stage 2
MLP=$RUNS/head-mlp  # stage 3, the shipped one
DATA=$RUNS/distill-t1.jsonl
BENCH=${BENCH:-$RUNS/bench}
SHIP_HEAD=${SHIP_HEAD:-models/heads/subword-btree4-r4-tied}
BENCH_MODEL=${BENCH_MODEL:-$MODEL}
BENCH_HEAD=${BENCH_HEAD:-$SHIP_HEAD}
BENCH_FLAGS=${BENCH_FLAGS:-}
STAGE=${1:-all}


lm() {
    run mkdir -p "$RUNS"
    run python -m mtpc.cli tiny-lm --out "$LM_RUN" --bpe-vocab 2048 --minutes "$LM_MINUTES" --precision fp32 --seed 0 \
        --d-model 192 --heads 4 --ffn 512 --context 1024 --save-every 25 --no-progress
    run mkdir -p "$MODEL"
    run find "$LM_RUN" -maxdepth 1 -type f ! -name checkpoint.pt ! -name .mtpc.lock -exec cp {} "$MODEL/" \;
}

distill() {
    run python -m mtpc.cli distill-data --model "$MODEL" --out "$DATA" --num-prompts 2048 --max-new-tokens 256 \
        --batch-size 32 --temperature 1 --seed 0 --no-progress
}

head() {
    run python -m mtpc.cli train --model "$MODEL" --out "$HEAD" --minutes "$HEAD_MINUTES" --circuit examples/btree.pc \
        -D n=4 -D r=4 -D v=2048 --parameterisation tied --loss kl --data "$DATA" --seq-len 512 --batch-size 8 \
        --window-stride 2 --precision fp32 --seed 0 --no-progress
}

# the later stages continue a head from its weights (--init-head) at peak rate 1e-3, one thread
continued() {  # OUT INIT MINUTES FLAG
    run python -m mtpc.cli train --model "$MODEL" --init-head "$2" --out "$1" --minutes "$3" "$4" --loss kl \
        --data "$DATA" --lr 1e-3 --seq-len 512 --batch-size 8 --window-stride 2 --precision fp32 --seed 0 --no-progress
}

first() {
    continued "$FIRST" "$HEAD" 20 --first-token
}

mlp() {
    continued "$MLP" "$FIRST" 45 "--first-token-mlp=384"
}

ship() {
    run mkdir -p "$SHIP_HEAD"
    run find "$MLP" -maxdepth 1 -type f ! -name checkpoint.pt ! -name .mtpc.lock -exec cp {} "$SHIP_HEAD/" \;
}

bench() {  # held-out files of $CORPUS (default: the installed networkx package, code neither the BPE nor the LM
    # saw) as prompts, T = 1, eager and compiled, one thread; $BENCH_FLAGS e.g. for a smoke run
    local corpus=${CORPUS:-$(python -c "import networkx; print(networkx.__path__[0])")}
    # shellcheck disable=SC2086
    run python -m mtpc.cli bench --model "$BENCH_MODEL" --heads "$BENCH_HEAD" --corpus "$corpus" --num-prompts 8 \
        --repeats 2 --prompt-len 64 --max-new-tokens 128 --mode sample --temperature 1 --compile --threads 1 \
        --out "$BENCH" --no-progress $BENCH_FLAGS
}

case $STAGE in
    lm) lm ;;
    distill) distill ;;
    head) head ;;
    first) first ;;
    mlp) mlp ;;
    ship) ship ;;
    bench) bench ;;
    all) lm; distill; head; first; mlp; ship ;;
    *) echo "unknown stage $STAGE (lm, distill, head, first, mlp, ship, bench)" >&2; exit 2 ;;
esac
