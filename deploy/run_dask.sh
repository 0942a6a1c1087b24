#!/usr/bin/env bash
# Run the generation (or filter, JOB=filter) job on a dask.distributed cluster (DaskRunner).
set -euo pipefail
usage() {
  cat <<USAGE
usage: DASK_SCHEDULER=tcp://host:8786 deploy/run_dask.sh JOB_ARGS...
       deploy/run_dask.sh --local N JOB_ARGS...   start a scheduler and N workers here, run, stop them

JOB=generate (default) or JOB=filter picks the job. Workers need the project installed
(scripts/bootstrap.sh) and the same paths for inputs, models and output. On each worker machine:
  DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False dask worker tcp://SCHEDULER:8786 --nthreads 1 --nworkers N
(Dask's statistical profiler keeps a call tree a second for the last 1,000 seconds: on a decoding
worker that is over 100 MB that the job does not need.)
Dask starts workers with OMP_NUM_THREADS=1, so each decodes on one core: use N = cores, or pass
the job's --torch_threads (cores / N) to give each worker its share.
USAGE
}
case "${1:-}" in -h|--help) usage; exit 0;; esac
JOB=${JOB:-generate}
case "$JOB" in generate|filter) ;; *) echo "JOB must be generate or filter, not $JOB" >&2; exit 2;; esac
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
pids=()
cleanup() { for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
if [ "${1:-}" = "--local" ]; then
  n=${2:?--local needs a worker count}; shift 2
  tmp=$(mktemp -d)
  "$PY" -m distributed.cli.dask_scheduler --host 127.0.0.1 --port 0 --scheduler-file "$tmp/s.json" \
      --dashboard-address :0 >"$tmp/scheduler.log" 2>&1 & pids+=($!)
  for _ in $(seq 100); do [ -s "$tmp/s.json" ] && break; sleep 0.2; done
  DASK_SCHEDULER=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['address'])" "$tmp/s.json")
  DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False \
  "$PY" -m distributed.cli.dask_worker "$DASK_SCHEDULER" --nworkers "$n" --nthreads 1 --no-dashboard \
      >"$tmp/workers.log" 2>&1 & pids+=($!)
fi
: "${DASK_SCHEDULER:?set DASK_SCHEDULER or use --local N}"
"$PY" -m "beam_pipelines.$JOB" --runner DaskRunner --dask_client_address "$DASK_SCHEDULER" "$@"
