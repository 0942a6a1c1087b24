#!/usr/bin/env bash
# Submit the generation (or filter) job to Google Cloud Dataflow (Runner v2, custom container, optional GPUs).
set -euo pipefail
usage() {
  cat <<USAGE
usage: PROJECT=my-project REGION=europe-west4 TEMP=gs://bucket/tmp IMAGE=REGION-docker.pkg.dev/... \\
       deploy/run_dataflow.sh JOB_ARGS...

JOB_ARGS are the options of the job named by JOB (generate, the default, or filter). Paths are
Cloud Storage URLs (gs://bucket/...): --input, --output and the model directories
(--forward_model, --backward_model, --encoder, ...) are read and written by every worker through
the jobs' storage layer, models copied once per worker VM; no mount is needed. A local path
would not exist on the workers, so one is refused here.
Environment:
  PROJECT REGION TEMP IMAGE   required
  GPU                 accelerator type, e.g. nvidia-tesla-t4 (default: none, CPU workers with
                      one SDK process per vCPU and --torch_threads 1)
  MACHINE_TYPE        default: one the GPU can be attached to (T4, P4, P100, V100: n1-standard-8;
                      L4: g2-standard-8; A100 40 GB: a2-highgpu-1g; A100 80 GB: a2-ultragpu-1g;
                      H100: a3-highgpu-1g), n1-standard-8 without a GPU
  DISK_SIZE_GB        worker boot disk (default 100: the GPU image with torch's CUDA libraries is
                      about 12 GB, and Dataflow pulls it onto every worker; 50 without a GPU)
  GPU_SHARING         mps (default): one SDK process per vCPU shares the VM's GPU through NVIDIA
                      MPS, so one process's host work (tokenization, clustering, writing) overlaps
                      the others' decoding, and the generation job gets --device cuda
                      --processes_per_gpu <vCPUs>; single: one SDK process per VM
                      (no_use_multiple_sdk_containers), --processes_per_gpu 1
  MAX_WORKERS         default 16
  PYTHON              interpreter (default .venv/bin/python if there, else python3)
USAGE
}
case "${1:-}" in -h|--help) usage; exit 0;; esac
JOB=${JOB:-generate}
case "$JOB" in generate|filter) ;; *) echo "JOB must be generate or filter, not $JOB" >&2; exit 2;; esac
: "${PROJECT:?}" "${REGION:?}" "${TEMP:?}" "${IMAGE:?}"
# Each GPU type can only be attached to some machine families (Compute Engine's GPU platforms).
machine_for_gpu() {
  case "$1" in
    nvidia-tesla-t4|nvidia-tesla-p4|nvidia-tesla-p100|nvidia-tesla-v100) echo n1-standard-8;;
    nvidia-l4) echo g2-standard-8;;
    nvidia-tesla-a100) echo a2-highgpu-1g;;
    nvidia-a100-80gb) echo a2-ultragpu-1g;;
    nvidia-h100-80gb) echo a3-highgpu-1g;;
    *) echo "run_dataflow.sh: unknown GPU type $1 (set MACHINE_TYPE yourself)" >&2; return 2;;
  esac
}
# vCPUs of a machine type: Dataflow starts one Python SDK process per vCPU.
vcpus_of() {
  case "$1" in
    a2-highgpu-1g|a2-ultragpu-1g) echo 12;;
    a3-highgpu-1g) echo 26;;
    *-[0-9]*) echo "${1##*-}";;
    *) echo 1;;
  esac
}
if [ -n "${GPU:-}" ] && [ -z "${MACHINE_TYPE:-}" ]; then
  MACHINE_TYPE=$(machine_for_gpu "$GPU") || exit 2
fi
args=(--runner DataflowRunner --project "$PROJECT" --region "$REGION" --temp_location "$TEMP"
      --sdk_container_image "$IMAGE" --experiments=use_runner_v2
      --machine_type "${MACHINE_TYPE:-n1-standard-8}" --max_num_workers "${MAX_WORKERS:-16}")
if [ -n "${GPU:-}" ]; then
  args+=(--disk_size_gb "${DISK_SIZE_GB:-100}")
else
  args+=(--disk_size_gb "${DISK_SIZE_GB:-50}")
fi
if [ -n "${GPU:-}" ]; then
  # One GPU per VM (scale out with VMs): NVIDIA MPS on Dataflow needs a single-GPU worker.
  case "${GPU_SHARING:-mps}" in
    mps)
      procs=$(vcpus_of "${MACHINE_TYPE:-n1-standard-8}")
      args+=(--dataflow_service_options "worker_accelerator=type:${GPU};count:1;install-nvidia-driver;use_nvidia_mps")
      if [ "$JOB" = generate ]; then args+=(--device cuda --processes_per_gpu "$procs" --torch_threads 1); fi;;
    single)
      args+=(--dataflow_service_options "worker_accelerator=type:${GPU};count:1;install-nvidia-driver"
             --experiments=no_use_multiple_sdk_containers)
      if [ "$JOB" = generate ]; then args+=(--device cuda --processes_per_gpu 1); fi;;
    *) echo "run_dataflow.sh: GPU_SHARING must be mps or single, not ${GPU_SHARING}" >&2; exit 2;;
  esac
else
  # Dataflow starts one Python SDK process per vCPU: one torch thread each, or they oversubscribe
  # the cores (JOB_ARGS may override with their own --torch_threads, the last one wins).
  args+=(--torch_threads 1)
fi
# Every path option must be a gs:// URL: the workers cannot see this machine's files. --input may
# take several values; --opt=value and --opt value are both read.
path_options=" --input --output --previous --forward_model --backward_model --encoder --lm_model --spm_model --bitext_encoder --bitext_mlp --divergence_model "
refuse() { echo "run_dataflow.sh: $1: Dataflow workers cannot read local paths; use a gs:// URL" >&2; exit 2; }
values_of=""
for arg in "$@"; do
  case "$arg" in
    --*=*)
      values_of=""
      case "$path_options" in *" ${arg%%=*} "*) case "${arg#*=}" in gs://*) ;; *) refuse "$arg";; esac;; esac;;
    -*)
      case "$path_options" in *" $arg "*) values_of=$arg;; *) values_of="";; esac;;
    *)
      if [ -n "$values_of" ]; then
        case "$arg" in gs://*) ;; *) refuse "$values_of $arg";; esac
        [ "$values_of" = --input ] || values_of=""
      fi;;
  esac
done
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -n "${PYTHON:-}" ] || [ ! -x .venv/bin/python ] || PY=.venv/bin/python
exec "$PY" -m "beam_pipelines.$JOB" "${args[@]}" "$@"
