#!/usr/bin/env bash
# Fetch the wheel the GPU machine lacks (it has no network) into ${WHEELS:-wheels/}: lark, circuitc's
# parser, for CPython 3.12. Everything else the run imports (torch, transformers, peft, networkx,
# opt_einsum, safetensors, tqdm, matplotlib, jinja2, scipy, pytest) is in the machine's image. The
# wheel travels with the checkout, whose whole size a device run caps at 64 MiB: fetch nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
wheels="${WHEELS:-wheels}"
python -m pip download --quiet --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$wheels" lark
ls -l "$wheels"
