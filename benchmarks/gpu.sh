#!/usr/bin/env bash
# The GPU run in one command (see benchmarks/gpu.py): from the repository root on the GPU machine,
#
#     bash benchmarks/gpu.sh             # about 5.5 minutes on one H100 or H200; results into $OUT
#     bash benchmarks/gpu.sh --dry-run   # tiny sizes on the CPU
#
# The GPU machine has no network: lark, which its image lacks, is installed from the wheel in
# ${WHEELS:-wheels/} (fetch it beforehand with benchmarks/gpu_wheels.sh) into a folder of its own, so the
# image's Python is left as it was. The code runs from this checkout (PYTHONPATH): nothing is built.
set -euo pipefail
cd "$(dirname "$0")/.."
# the machine's image names its interpreter python3 only; ours may have python only
python="$(command -v python3 || command -v python)"
wheels="${WHEELS:-wheels}"
site="${TMPDIR:-/tmp}/mtpc-gpu-site"
missing=()
for module in lark scipy; do
    "$python" -c "import $module" 2>/dev/null || missing+=("$module")
done
if ((${#missing[@]})); then
    if compgen -G "$wheels/*.whl" >/dev/null; then
        "$python" -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target "$site" \
            "$wheels"/*.whl || echo "gpu.sh: could not install the wheels of $wheels" >&2
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "gpu.sh: ${missing[*]} missing and no wheels in $wheels (run benchmarks/gpu_wheels.sh)" >&2
    fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" benchmarks/gpu.py "$@"
