#!/usr/bin/env bash
# Everything that needs a GPU, in one call, for the day one is lent: the GPU tests (`pytest -m gpu`,
# skipped elsewhere), then the probe benchmark against torch's own ceilings. Nothing is fetched.
# Exit status: non-zero if either fails.
set -uo pipefail
cd "$(dirname "$0")/.."
python -m pytest -q -m gpu tests
tests=$?
python bench/gpu_probe_bench.py
bench=$?
exit $(( tests != 0 || bench != 0 ))
