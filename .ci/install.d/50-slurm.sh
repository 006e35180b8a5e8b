#!/usr/bin/env bash
# Slurm 22.05 and MUNGE from Debian: the Slurm tests (tests/slurm/) start munged, slurmctld and slurmd on
# loopback, submit real jobs with sbatch and run deploy/slurm/epilog.sh as the node's epilog. Accounting too:
# slurmdbd (with its MySQL plugin) and MariaDB, which the tests that read sacct start privately in the cluster's
# folder (tests/slurm/cluster.py, accounting=True).
set -euo pipefail
if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
  && command -v munged >/dev/null 2>&1 && command -v sbatch >/dev/null 2>&1 \
  && command -v slurmdbd >/dev/null 2>&1 && command -v mariadbd >/dev/null 2>&1 \
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
  slurmctld slurmd slurm-client munge slurmdbd mariadb-server >/dev/null
