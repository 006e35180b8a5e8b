#!/usr/bin/env bash
# Alertmanager and amtool from Debian: the shipped Alertmanager configuration is checked, routed and run
# end to end (tests/deploy/test_alertmanager.py).
set -euo pipefail
if command -v prometheus-alertmanager >/dev/null 2>&1 && command -v amtool >/dev/null 2>&1; then
  exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus-alertmanager >/dev/null
