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
  MACHINE_TYPE        default n1-standard-8
  MAX_WORKERS         default 16
USAGE
}
case "${1:-}" in -h|--help) usage; exit 0;; esac
JOB=${JOB:-generate}
case "$JOB" in generate|filter) ;; *) echo "JOB must be generate or filter, not $JOB" >&2; exit 2;; esac
: "${PROJECT:?}" "${REGION:?}" "${TEMP:?}" "${IMAGE:?}"
args=(--runner DataflowRunner --project "$PROJECT" --region "$REGION" --temp_location "$TEMP"
      --sdk_container_image "$IMAGE" --experiments=use_runner_v2
      --machine_type "${MACHINE_TYPE:-n1-standard-8}" --max_num_workers "${MAX_WORKERS:-16}")
if [ -n "${GPU:-}" ]; then
  # One SDK process per VM, so the models are loaded once onto the GPU.
  args+=(--dataflow_service_options "worker_accelerator=type:${GPU};count:1;install-nvidia-driver"
         --experiments=no_use_multiple_sdk_containers)
else
  # Dataflow starts one Python SDK process per vCPU: one torch thread each, or they oversubscribe
  # the cores (JOB_ARGS may override with their own --torch_threads, the last one wins).
  args+=(--torch_threads 1)
fi
# Every path option must be a gs:// URL: the workers cannot see this machine's files.
prev=""
for arg in "$@"; do
  case "$prev" in
    --input|--output|--forward_model|--backward_model|--encoder|--lm_model|--spm_model)
      case "$arg" in gs://*) ;; *) echo "run_dataflow.sh: $prev $arg: Dataflow workers cannot read local paths; use a gs:// URL" >&2; exit 2;; esac;;
  esac
  case "$arg" in
    --input=*|--output=*|--forward_model=*|--backward_model=*|--encoder=*)
      case "${arg#*=}" in gs://*) ;; *) echo "run_dataflow.sh: $arg: Dataflow workers cannot read local paths; use a gs:// URL" >&2; exit 2;; esac;;
  esac
  prev=$arg
done
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" -m "beam_pipelines.$JOB" "${args[@]}" "$@"
