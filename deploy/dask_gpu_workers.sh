#!/usr/bin/env bash
# Start Dask workers for this machine's GPUs: one `dask worker` per GPU, each seeing only its GPU
# (CUDA_VISIBLE_DEVICES), with PROCESSES_PER_GPU worker processes that share it.
set -euo pipefail
usage() {
  cat <<USAGE
usage: [GPUS=k] [PROCESSES_PER_GPU=P] deploy/dask_gpu_workers.sh SCHEDULER_ADDRESS

Runs on every GPU machine of a Dask cluster (deploy/run_dask.sh --local with GPUS set runs it
for you). It starts k x P worker processes, P per GPU, and waits for them; stop it with Ctrl-C or
a signal, which stops them all. Run the job with --device cuda --processes_per_gpu P, so that each
process plans its batches for its share of the GPU's memory.
Environment:
  GPUS               GPUs to use (default: every GPU nvidia-smi lists)
  PROCESSES_PER_GPU  worker processes per GPU (default 4: one process's host work, such as
                     tokenization and clustering, overlaps the others' decoding)
  MPS                auto (default): with more than one process per GPU, start a CUDA MPS control
                     daemon for them (pipe and log directories in a fresh temporary folder, quit
                     when this script ends), so their kernels overlap on the GPU instead of
                     taking turns; the GPU's compute mode is left as it is. A daemon the
                     environment already names (CUDA_MPS_PIPE_DIRECTORY) is used as it is.
                     on: the same, and fail if it cannot start; off: no MPS
  PYTHON             interpreter (default .venv/bin/python)
USAGE
}
case "${1:-}" in -h|--help) usage; exit 0;; "") usage >&2; exit 2;; esac
scheduler=$1
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if [ -z "${GPUS:-}" ]; then
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU " || true)
fi
case "$GPUS" in ''|*[!0-9]*|0) echo "dask_gpu_workers.sh: no GPU found (set GPUS=k to name how many)" >&2; exit 2;; esac
per=${PROCESSES_PER_GPU:-4}
case "$per" in ''|*[!0-9]*|0) echo "dask_gpu_workers.sh: PROCESSES_PER_GPU must be a positive integer, not $per" >&2; exit 2;; esac
mps=${MPS:-auto}
case "$mps" in auto|on|off) ;; *) echo "dask_gpu_workers.sh: MPS must be auto, on or off, not $mps" >&2; exit 2;; esac
pids=()
mps_dir=
stop() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
  if [ -n "$mps_dir" ]; then
    echo quit | nvidia-cuda-mps-control || echo "dask_gpu_workers.sh: the MPS daemon did not answer quit" >&2
    rm -rf "$mps_dir"
  fi
}
trap stop EXIT
trap 'exit 143' INT TERM
if [ "$mps" != off ] && [ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && { [ "$per" -gt 1 ] || [ "$mps" = on ]; }; then
  if command -v nvidia-cuda-mps-control >/dev/null; then
    mps_dir=$(mktemp -d "${TMPDIR:-/tmp}/paragen-mps-XXXXXX")
    mkdir "$mps_dir/pipe" "$mps_dir/log"
    export CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe CUDA_MPS_LOG_DIRECTORY=$mps_dir/log
    if nvidia-cuda-mps-control -d; then
      echo "dask_gpu_workers.sh: CUDA MPS control daemon started (pipes in $CUDA_MPS_PIPE_DIRECTORY)" >&2
    else
      rm -rf "$mps_dir"; mps_dir=
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
      [ "$mps" = on ] && { echo "dask_gpu_workers.sh: MPS=on but nvidia-cuda-mps-control -d failed" >&2; exit 1; }
      echo "dask_gpu_workers.sh: CUDA MPS not started; the worker processes take turns on each GPU" >&2
    fi
  elif [ "$mps" = on ]; then
    echo "dask_gpu_workers.sh: MPS=on but nvidia-cuda-mps-control is not on PATH" >&2; exit 2
  fi
fi
for ((gpu = 0; gpu < GPUS; gpu++)); do
  # Dask's statistical profiler keeps a call tree a second: over 100 MB a decoding worker does not need.
  CUDA_VISIBLE_DEVICES=$gpu DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False \
  "$PY" -m distributed.cli.dask_worker "$scheduler" --nworkers "$per" --nthreads 1 --no-dashboard \
      --name "gpu$gpu" & pids+=($!)
done
wait
