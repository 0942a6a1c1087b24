#!/usr/bin/env bash
# Debian's packages PKG... with apt, as root (or with sudo -n). Waits for another apt or dpkg
# (a second bootstrap on the same machine, unattended upgrades) instead of failing at its lock:
# two bootstraps started together once left the SLURM tests skipped in one of them.
#   bash scripts/apt_install.sh [APT-GET OPTION...] PACKAGE...
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: apt_install.sh [APT-GET OPTION...] PACKAGE..." >&2; exit 2; }
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"   # -n: fail rather than wait for a password
WAIT=(-o DPkg::Lock::Timeout=600)                  # dpkg's lock: wait up to 10 min
# the package lists' lock has no timeout of its own: try again for up to 10 min
for try in $(seq 20); do
  $SUDO apt-get "${WAIT[@]}" update -qq && break
  [ "$try" -lt 20 ] || exit 1
  echo "apt-get update failed (another apt running?); trying again in 30 s" >&2
  sleep 30
done
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get "${WAIT[@]}" install -y -qq "$@"
