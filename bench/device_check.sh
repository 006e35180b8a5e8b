#!/usr/bin/env bash
# Everything that needs a GPU, in one call, for the day one is lent. Nothing is fetched there: run
# bench/device_wheels.sh here first and carry .whl. Steps:
#   1. install the carried wheels and gpulens itself (no dependencies: the image has the rest);
#   2. the GPU tests (`pytest -m gpu`, skipped elsewhere): the NVML adapter's contract on the real
#      driver, the probes' CUDA paths, and the referees (gpustat, nvitop, nvitop-exporter) against the
#      agent on the real GPUs;
#   3. the probe benchmark against torch's own ceilings.
# Exit status: non-zero if any step fails.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade .whl/*.whl || exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c "import importlib.metadata as m; print('nvidia-ml-py', m.version('nvidia-ml-py'))"
python3 -m pytest -q -p no:cacheprovider -m gpu tests
tests=$?
python3 bench/gpu_probe_bench.py
bench=$?
exit $(( tests != 0 || bench != 0 ))
