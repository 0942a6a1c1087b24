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
GPU machines: deploy/dask_gpu_workers.sh tcp://SCHEDULER:8786 on each starts P worker processes per
GPU, each seeing its GPU only (CUDA_VISIBLE_DEVICES); run the job with --device cuda
--processes_per_gpu P. With --local, GPUS=k spreads the N workers over k GPUs of this machine
(N/k per GPU, rounded up) and adds those two options to a generation job that lacks them.
USAGE
}
case "${1:-}" in -h|--help) usage; exit 0;; esac
JOB=${JOB:-generate}
case "$JOB" in generate|filter) ;; *) echo "JOB must be generate or filter, not $JOB" >&2; exit 2;; esac
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
pids=()
tmp=
# The local cluster's logs are kept only when the job failed (and named then), else removed.
cleanup() {
  status=$?
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  if [ -n "$tmp" ]; then
    if [ "$status" = 0 ]; then rm -rf "$tmp"; else echo "run_dask.sh: the local Dask cluster's logs: $tmp" >&2; fi
  fi
}
trap cleanup EXIT
if [ "${1:-}" = "--local" ]; then
  n=${2:?--local needs a worker count}; shift 2
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/paragen-dask-XXXXXX")
  "$PY" -m distributed.cli.dask_scheduler --host 127.0.0.1 --port 0 --scheduler-file "$tmp/s.json" \
      --dashboard-address :0 >"$tmp/scheduler.log" 2>&1 & pids+=($!)
  for _ in $(seq 100); do [ -s "$tmp/s.json" ] && break; sleep 0.2; done
  DASK_SCHEDULER=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['address'])" "$tmp/s.json")
  if [ -n "${GPUS:-}" ]; then
    case "$GPUS" in ''|*[!0-9]*|0) echo "run_dask.sh: GPUS must be a positive integer, not $GPUS" >&2; exit 2;; esac
    per=$(( (n + GPUS - 1) / GPUS ))
    GPUS=$GPUS PROCESSES_PER_GPU=$per PYTHON=$PY deploy/dask_gpu_workers.sh "$DASK_SCHEDULER" \
        >"$tmp/workers.log" 2>&1 & pids+=($!)
    if [ "$JOB" = generate ]; then
      case " $* " in *" --device"*) ;; *) set -- "$@" --device cuda;; esac
      case " $* " in *" --processes_per_gpu"*) ;; *) set -- "$@" --processes_per_gpu "$per";; esac
    fi
  else
    DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False \
    "$PY" -m distributed.cli.dask_worker "$DASK_SCHEDULER" --nworkers "$n" --nthreads 1 --no-dashboard \
        >"$tmp/workers.log" 2>&1 & pids+=($!)
  fi
fi
: "${DASK_SCHEDULER:?set DASK_SCHEDULER or use --local N}"
"$PY" -m "beam_pipelines.$JOB" --runner DaskRunner --dask_client_address "$DASK_SCHEDULER" "$@"
