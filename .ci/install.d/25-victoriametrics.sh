#!/usr/bin/env bash
# VictoriaMetrics, vmagent and vmalert from Debian: the rules load in vmalert, and the dashboard and the
# reports answer the same on VictoriaMetrics as on Prometheus (tests/deploy/test_victoriametrics.py).
set -euo pipefail
if command -v victoria-metrics >/dev/null 2>&1 && command -v vmagent >/dev/null 2>&1 \
    && command -v vmalert >/dev/null 2>&1; then
  exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends victoria-metrics >/dev/null
