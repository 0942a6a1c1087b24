#!/usr/bin/env bash
# Called by systemd when the refresh fails (OnFailure= in paragen-refresh.service, through
# paragen-refresh-notify@.service): runs the operator's PARAGEN_NOTIFY_CMD with the failed unit's
# name, or, without one, writes an error to the journal.
set -euo pipefail
usage() {
  cat <<USAGE
usage: deploy/notify.sh UNIT

PARAGEN_NOTIFY_CMD   command run with UNIT as its last argument (e.g. a mail or chat hook); split
                     into words like a shell would, never run by one. Default: log to the journal.
USAGE
}
case "${1:-}" in -h|--help) usage; exit 0;; esac
unit=${1:?usage: deploy/notify.sh UNIT}
if [ -n "${PARAGEN_NOTIFY_CMD:-}" ]; then
  split='import shlex, sys; sys.stdout.write("".join(w + "\0" for w in shlex.split(sys.argv[1])))'
  mapfile -d '' -t cmd < <(python3 -c "$split" "$PARAGEN_NOTIFY_CMD")
  [ "${#cmd[@]}" -gt 0 ] || { echo "notify: PARAGEN_NOTIFY_CMD is empty after splitting" >&2; exit 2; }
  exec "${cmd[@]}" "$unit"
fi
msg="paragen refresh failed: $unit (journalctl -u $unit; logs in OUT_ROOT/logs/)"
if command -v logger >/dev/null 2>&1; then
  logger -t paragen-refresh -p user.err "$msg"
else
  echo "$msg" >&2
fi
