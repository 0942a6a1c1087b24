#!/usr/bin/env bash
# Run one paragen job inside a SLURM batch job that requeues itself before its time limit:
#   requeued.sh generate|filter JOB_ARGS...     (generate.sbatch and cluster.sbatch exec it)
# The batch job's --signal=B:USR1@SECONDS gives this script SIGUSR1 before the time limit: it stops
# the job (SIGTERM: every committed work unit kept, exit 143 within 20 s) and requeues the batch
# job, whose next start runs the same command and continues the run. A preemption or
# `scontrol requeue` (SIGTERM to every process of the job) ends the job the same way, and SLURM
# itself requeues it (--requeue). A usage mistake (exit 2) or a run with no row (3) is not
# requeued by this script.
set -uo pipefail
job_module=${1:-}
case "$job_module" in
  generate|filter) shift;;
  *) echo "usage: requeued.sh generate|filter JOB_ARGS..." >&2; exit 2;;
esac
PY=${PYTHON:-python3}
[ -n "${PYTHON:-}" ] || [ ! -x .venv/bin/python ] || PY=.venv/bin/python
echo "paragen: batch job ${SLURM_JOB_ID:-?} start ${SLURM_RESTART_COUNT:-0} on $(hostname): $job_module" >&2
requeue=0
# shellcheck disable=SC2329  # called through the trap below
on_time_limit() { requeue=1; kill -TERM "$job" 2>/dev/null; }
trap on_time_limit USR1
"$PY" -m "beam_pipelines.$job_module" "$@" &
job=$!
status=0
wait "$job" || status=$?
while kill -0 "$job" 2>/dev/null; do wait "$job" || status=$?; done    # wait returns early on a trapped signal
if [ "$requeue" = 1 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
  echo "paragen: time limit near: requeued batch job $SLURM_JOB_ID; its next start continues the run" >&2
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
