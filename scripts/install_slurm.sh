#!/usr/bin/env bash
# SLURM and munge from Debian's packages, for the tests that start a real single-node SLURM
# cluster (tests/slurm_cluster.py: the daemons run in the foreground from a temporary folder; no
# system service is configured or started). Needs root (or sudo) and apt.
set -euo pipefail
if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
  echo "SLURM already installed: $(slurmctld -V)"; exit 0
fi
bash "$(dirname "$0")/apt_install.sh" --no-install-recommends slurm-wlm munge
echo "SLURM installed: $(slurmctld -V)"
