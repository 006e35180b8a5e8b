#!/usr/bin/env bash
# Headless Chromium and its chromedriver from Debian: the dashboard's browser test loads the running
# `gpulens demo` and reads the flagged GPUs and their tips off the page (selenium comes with the dev extra).
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
