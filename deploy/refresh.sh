#!/usr/bin/env bash
# One scheduled corpus refresh (beam_pipelines/refresh.py): an incremental generation run, the
# filter job if configured, then `latest` moved and old runs pruned; never two at once.
set -euo pipefail
usage() {
  cat <<USAGE
usage: OUT_ROOT=/data/paraphrases deploy/refresh.sh JOB_ARGS...   (JOB_ARGS without --output)

Runs python -m beam_pipelines.refresh --root OUT_ROOT -- JOB_ARGS: a new run under
OUT_ROOT/runs/<run id> that reuses the output of the input shards that did not change since the
run OUT_ROOT/latest.json names; then OUT_ROOT/latest/ (a copy of its manifest that any reader
opens) and latest.json point at it. OUT_ROOT may be a bucket URL (gs://, s3://). With nothing
changed it publishes nothing and says so. A failed job leaves latest where it was and exits non-zero. Logs:
OUT_ROOT/logs/<run id>.log.
Environment:
  OUT_ROOT            where the runs live (required)
  KEEP                committed runs kept (default 4; runs latest or a kept run uses are kept too)
  FILTER_ARGS         the filter job's options, e.g. "--config paranmt --encoder /models/enc"
                      (default: no filter job); split into words, never run by a shell
  PARAGEN_JOB_CMD     run the generation job as this command, e.g. deploy/run_dataflow.sh
                      (default: in the refresh's process); split into words the same way
  PARAGEN_FILTER_CMD  the same for the filter job
  PYTHON              the interpreter (default .venv/bin/python if there, else python3)
USAGE
}
case "${1:-}" in -h|--help) usage; exit 0;; esac
: "${OUT_ROOT:?set OUT_ROOT (see --help)}"
here=$(cd "$(dirname "$0")/.." && pwd)
args=(--root "$OUT_ROOT" --keep "${KEEP:-4}")
[ -z "${FILTER_ARGS:-}" ] || args+=("--filter_args=$FILTER_ARGS")
[ -z "${PARAGEN_JOB_CMD:-}" ] || args+=("--job_cmd=$PARAGEN_JOB_CMD")
[ -z "${PARAGEN_FILTER_CMD:-}" ] || args+=("--filter_cmd=$PARAGEN_FILTER_CMD")
cd "$here"
PY=${PYTHON:-python3}
[ -n "${PYTHON:-}" ] || [ ! -x .venv/bin/python ] || PY=.venv/bin/python
exec "$PY" -m beam_pipelines.refresh "${args[@]}" -- "$@"
