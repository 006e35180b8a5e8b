#!/usr/bin/env bash
# Run HERE before a device run: fetches, from the package registry, the wheels bench/device_check.sh
# needs that the GPU machine's image lacks (bcrypt for the agent; the referees gpustat, nvitop and
# nvitop-exporter; trustme and its cryptography for the TLS tests) into .whl/, which git ignores.
# Then call the device tool with carry [".whl"]. The machine runs Python 3.12 on x86-64 and reaches
# no network.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir .whl
python3 -m pip wheel --quiet --no-deps gpustat==1.1.1 -w .whl  # published as a source archive only
python3 -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl bcrypt nvitop nvitop-exporter trustme blessed
du -sh .whl
