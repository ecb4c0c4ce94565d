#!/usr/bin/env bash
# Fetch the wheels the GPU machine lacks (it has no network) into ${WHEELS:-wheels/}: lark (circuitc's
# parser) and scipy (the tests' chi-square), for CPython 3.12 on x86-64 Linux. About 35 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
wheels="${WHEELS:-wheels}"
python -m pip download --quiet --only-binary=:all: --no-deps --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$wheels" lark scipy
ls -l "$wheels"
