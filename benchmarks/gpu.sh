#!/usr/bin/env bash
# The GPU run in one command (see benchmarks/gpu.py): from the repository root on the GPU machine,
#
#     bash benchmarks/gpu.sh             # ~9 minutes on one H200; results into $OUT
#     bash benchmarks/gpu.sh --dry-run   # tiny sizes on the CPU
#
# The GPU machine has no network: packages it lacks (lark; scipy for the tests) are installed from the
# wheels in ${WHEELS:-wheels/} (fetch them beforehand with benchmarks/gpu_wheels.sh). The code runs from
# this checkout (PYTHONPATH), so nothing needs to be built or installed for it.
set -euo pipefail
cd "$(dirname "$0")/.."
wheels="${WHEELS:-wheels}"
missing=()
for module in lark scipy; do
    python -c "import $module" 2>/dev/null || missing+=("$module")
done
if ((${#missing[@]})); then
    if [[ -d "$wheels" ]]; then
        python -m pip install --quiet --no-index --no-deps --find-links "$wheels" "${missing[@]}" \
            || echo "gpu.sh: could not install ${missing[*]} from $wheels" >&2
    else
        echo "gpu.sh: ${missing[*]} missing and no wheel folder $wheels (run benchmarks/gpu_wheels.sh)" >&2
    fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec python benchmarks/gpu.py "$@"
