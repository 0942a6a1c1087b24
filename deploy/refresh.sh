#!/usr/bin/env bash
# One scheduled corpus refresh: a dated output directory, `latest` moved only on success,
# old runs pruned, never two refreshes at once.
set -euo pipefail
usage() {
  cat <<USAGE
usage: OUT_ROOT=/data/paraphrases deploy/refresh.sh JOB_ARGS...   (JOB_ARGS without --output)

Writes OUT_ROOT/YYYY-MM-DD/ (RUN_ID overrides the date), then atomically points OUT_ROOT/latest
at it; keeps the newest KEEP runs (default 4); logs to OUT_ROOT/logs/. Submits with
PARAGEN_JOB_CMD (default: python -m beam_pipelines.generate; use deploy/run_flink.sh or
deploy/run_dataflow.sh for a cluster). With FILTER_ARGS set (e.g. "--config paranmt --encoder
/models/enc"), the filter job then scores the new run into OUT_ROOT/RUN_ID/filtered with
PARAGEN_FILTER_CMD (default: python -m beam_pipelines.filter). Exits non-zero, and leaves latest
alone, if a job fails.
USAGE
}
case "${1:-}" in -h|--help) usage; exit 0;; esac
: "${OUT_ROOT:?set OUT_ROOT (see --help)}"
here=$(cd "$(dirname "$0")/.." && pwd)
JOB_CMD=${PARAGEN_JOB_CMD:-"$here/.venv/bin/python -m beam_pipelines.generate"}
FILTER_CMD=${PARAGEN_FILTER_CMD:-"$here/.venv/bin/python -m beam_pipelines.filter"}
RUN_ID=${RUN_ID:-$(date -u +%Y-%m-%d)}
KEEP=${KEEP:-4}
mkdir -p "$OUT_ROOT/logs"
exec 9>"$OUT_ROOT/.refresh.lock"
if ! flock -n 9; then echo "refresh: another refresh holds $OUT_ROOT/.refresh.lock" >&2; exit 75; fi
out="$OUT_ROOT/$RUN_ID"
log="$OUT_ROOT/logs/$RUN_ID.log"
echo "refresh $RUN_ID -> $out (log $log)"
# JOB_CMD is a shell command line (it may carry its own quoting); the job's arguments follow it.
if ! (cd "$here" && bash -c "$JOB_CMD \"\$@\"" paragen-job --output "$out" --overwrite "$@") >"$log" 2>&1; then
  echo "refresh: job failed, latest unchanged; see $log" >&2
  exit 1
fi
if [ -n "${FILTER_ARGS:-}" ]; then
  # FILTER_ARGS is word-split on purpose: it holds several options.
  if ! (cd "$here" && bash -c "$FILTER_CMD \"\$@\" $FILTER_ARGS" paragen-filter --input "$out" \
          --output "$out/filtered" --overwrite) >>"$log" 2>&1; then
    echo "refresh: filter job failed, latest unchanged; see $log" >&2
    exit 1
  fi
fi
ln -sfn "$RUN_ID" "$OUT_ROOT/.latest.tmp" && mv -T "$OUT_ROOT/.latest.tmp" "$OUT_ROOT/latest"
# Prune: newest KEEP run directories (names sort by date) stay.
mapfile -t runs < <(find "$OUT_ROOT" -mindepth 1 -maxdepth 1 -type d ! -name logs ! -name '.*' -printf '%f\n' | sort)
if [ "${#runs[@]}" -gt "$KEEP" ]; then
  for old in "${runs[@]:0:${#runs[@]}-KEEP}"; do rm -rf "${OUT_ROOT:?}/$old"; done
fi
echo "refresh $RUN_ID done; latest -> $RUN_ID"
