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
# Command lines from the environment are split into words like a shell would (quotes respected)
# but never run through a shell: a ';', '$(...)' or '|' in them is just a character of an argument.
split_words() {  # split_words NAME STRING: the words of STRING into the array NAME
  local -n _out=$1
  local split='import shlex, sys; sys.stdout.write("".join(w + "\0" for w in shlex.split(sys.argv[1])))'
  if ! python3 -c "$split" "$2" >/dev/null 2>&1; then
    echo "refresh: cannot split $1 into words (unbalanced quotes?): $2" >&2
    exit 2
  fi
  mapfile -d '' -t _out < <(python3 -c "$split" "$2")
}
job_cmd=("$here/.venv/bin/python" -m beam_pipelines.generate)
filter_cmd=("$here/.venv/bin/python" -m beam_pipelines.filter)
[ -z "${PARAGEN_JOB_CMD:-}" ] || split_words job_cmd "$PARAGEN_JOB_CMD"
[ -z "${PARAGEN_FILTER_CMD:-}" ] || split_words filter_cmd "$PARAGEN_FILTER_CMD"
split_words filter_args "${FILTER_ARGS:-}"
[ "${#job_cmd[@]}" -gt 0 ] || { echo "refresh: PARAGEN_JOB_CMD is empty" >&2; exit 2; }
[ "${#filter_cmd[@]}" -gt 0 ] || { echo "refresh: PARAGEN_FILTER_CMD is empty" >&2; exit 2; }
RUN_ID=${RUN_ID:-$(date -u +%Y-%m-%d)}
# RUN_ID names a directory under OUT_ROOT: no path separators, no leading dot, no control characters.
if ! [[ "$RUN_ID" =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$ ]]; then
  echo "refresh: RUN_ID must be letters, digits, '.', '_' or '-' (not starting with '.'), got: $(printf '%q' "$RUN_ID")" >&2
  exit 2
fi
KEEP=${KEEP:-4}
[[ "$KEEP" =~ ^[1-9][0-9]*$ ]] || { echo "refresh: KEEP must be a positive integer, got: $KEEP" >&2; exit 2; }
mkdir -p "$OUT_ROOT/logs"
exec 9>"$OUT_ROOT/.refresh.lock"
if ! flock -n 9; then echo "refresh: another refresh holds $OUT_ROOT/.refresh.lock" >&2; exit 75; fi
out="$OUT_ROOT/$RUN_ID"
log="$OUT_ROOT/logs/$RUN_ID.log"
echo "refresh $RUN_ID -> $out (log $log)"
if ! (cd "$here" && "${job_cmd[@]}" --output "$out" --overwrite "$@") >"$log" 2>&1; then
  echo "refresh: job failed, latest unchanged; see $log" >&2
  exit 1
fi
if [ "${#filter_args[@]}" -gt 0 ]; then
  if ! (cd "$here" && "${filter_cmd[@]}" --input "$out" --output "$out/filtered" --overwrite "${filter_args[@]}") \
        >>"$log" 2>&1; then
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
