#!/usr/bin/env bash
# Slurm's accounting from Debian: slurmdbd (with its MySQL plugin) and MariaDB. The Slurm tests that read
# sacct (tests/slurm/test_accounting.py) start a private MariaDB and slurmdbd in the cluster's folder.
set -euo pipefail
if command -v slurmdbd >/dev/null 2>&1 && command -v mariadbd >/dev/null 2>&1 \
  && command -v mariadb-install-db >/dev/null 2>&1 && command -v mariadb >/dev/null 2>&1; then
  exit 0
fi
apt-get update -qq
# policy-rc.d keeps the packages from starting their services at install (the tests start their own,
# with their own configuration); one the machine already has is left as it is.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  slurmdbd mariadb-server >/dev/null
