#!/usr/bin/env bash
# Submit the generation (or filter) job to a Flink cluster through Beam's portable FlinkRunner.
set -euo pipefail
usage() {
  cat <<USAGE
usage: FLINK_MASTER=host:8081 IMAGE=registry/paragen:TAG deploy/run_flink.sh JOB_ARGS...
       LOCAL=1 deploy/run_flink.sh JOB_ARGS...      (the same submission, checked on this machine)

Runs python -m beam_pipelines.\$JOB with --runner FlinkRunner. JOB_ARGS are the job's own
options (--input, --output, --forward_model, --backward_model, --preset, ...). Paths are bucket
URLs (s3://, gs://, hdfs://) that every task manager reads and writes through the jobs' storage
layer (models are copied once per machine); credentials come from the task managers'
environment (AWS_*, GOOGLE_APPLICATION_CREDENTIALS). A local path works only on a filesystem
every task manager mounts at the same path.
LOCAL=1 takes the path a Flink submission takes on the Python side without a Flink cluster: it
starts Beam's own Python job service (the portable Job API, what Flink's job server answers) and
an EXTERNAL worker pool on loopback, submits the job to them with --runner PortableRunner (the
pipeline serialised, artifacts staged: --setup_file), and the SDK harness processes the pool
starts run it, sharing nothing with the submitting process; both services stop at the end. Run
it on a small input before a cluster sees the job.
Environment:
  LOCAL              1: check the submission on this machine (above); FLINK_MASTER and IMAGE unused
  JOB                generate (default) or filter
  FLINK_MASTER       Flink REST address (required)
  IMAGE              SDK harness image built from deploy/Dockerfile (required unless ENV_TYPE=PROCESS)
  FLINK_VERSION      Flink version of the cluster (default 1.19; Beam 2.77 supports 1.19 1.20 2.0 2.1 2.2)
  PARALLELISM        default parallelism (default 8)
  ENV_TYPE           how task managers start the Python SDK worker: DOCKER (default: the IMAGE),
                     PROCESS (BOOT on every task manager, i.e. the image's /opt/apache/beam/boot
                     when the task managers run in it) or EXTERNAL (a worker pool at WORKER_POOL,
                     e.g. a sidecar started with /opt/apache/beam/boot --worker_pool)
  BOOT               PROCESS: the boot program (default /opt/apache/beam/boot)
  WORKER_POOL        EXTERNAL: host:port of the worker pool (default localhost:50000)
  JOB_SERVER_JAR     a local copy of Beam's Flink job-server jar. Without it Beam downloads the jar
                     (beam-runners-flink-<version>-job-server) from a Java package repository
                     (Maven Central) at submit time, which a machine without that access cannot do
  GPUS               GPUs per task manager machine (default: none). Each machine then runs
                     GPUS x PROCESSES_PER_GPU SDK worker processes (--sdk_worker_parallelism); each
                     claims a GPU (a lock file per slot in the machine's temporary directory) and the
                     generation job gets --device cuda --processes_per_gpu. Needs ENV_TYPE PROCESS
                     or EXTERNAL (the SDK workers are then processes of one machine or container with
                     the GPUs); Beam's DOCKER environment gives its containers no GPU
  PROCESSES_PER_GPU  SDK worker processes per GPU (default 4)
  RESTARTS           restarts of a failed job, RESTART_DELAY_MS apart (default 3 and 30000): a
                     fixed-delay restart strategy for this job (--number_of_execution_retries,
                     --execution_retry_delay). Beam sets none, and Flink without checkpointing then
                     fails a batch job at its first failed task ("no restart"). 0: the cluster's
                     restart-strategy.type decides. A restarted task's work units are written again
                     under new names, never twice in the output
  PYTHON             interpreter (default .venv/bin/python if there, else python3)
USAGE
}
case "${1:-}" in -h|--help) usage; exit 0;; esac
JOB=${JOB:-generate}
case "$JOB" in generate|filter) ;; *) echo "JOB must be generate or filter, not $JOB" >&2; exit 2;; esac
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -n "${PYTHON:-}" ] || [ ! -x .venv/bin/python ] || PY=.venv/bin/python
if [ "${LOCAL:-0}" = 1 ]; then
  exec "$PY" deploy/portable_local.py "$JOB" "$@"
fi
: "${FLINK_MASTER:?set FLINK_MASTER (see --help)}"
ENV_TYPE=${ENV_TYPE:-DOCKER}
args=(--runner FlinkRunner --flink_master "$FLINK_MASTER" --flink_version "${FLINK_VERSION:-1.19}"
      --parallelism "${PARALLELISM:-8}" --environment_type "$ENV_TYPE")
case "$ENV_TYPE" in
  DOCKER)
    : "${IMAGE:?set IMAGE to the worker image (deploy/Dockerfile)}"
    args+=(--environment_config "$IMAGE");;
  PROCESS) args+=(--environment_config "{\"command\": \"${BOOT:-/opt/apache/beam/boot}\"}");;
  EXTERNAL) args+=(--environment_config "${WORKER_POOL:-localhost:50000}");;
  *) echo "ENV_TYPE must be DOCKER, PROCESS or EXTERNAL, not $ENV_TYPE" >&2; exit 2;;
esac
[ -n "${JOB_SERVER_JAR:-}" ] && args+=(--flink_job_server_jar "$JOB_SERVER_JAR")
restarts=${RESTARTS:-3}
case "$restarts${RESTART_DELAY_MS:-30000}" in *[!0-9]*) echo "run_flink.sh: RESTARTS and RESTART_DELAY_MS must be integers >= 0" >&2; exit 2;; esac
[ "$restarts" -gt 0 ] && args+=(--number_of_execution_retries "$restarts" --execution_retry_delay "${RESTART_DELAY_MS:-30000}")
if [ -n "${GPUS:-}" ]; then
  per=${PROCESSES_PER_GPU:-4}
  case "$GPUS$per" in *[!0-9]*) echo "run_flink.sh: GPUS and PROCESSES_PER_GPU must be positive integers" >&2; exit 2;; esac
  if [ "$GPUS" -lt 1 ] || [ "$per" -lt 1 ]; then echo "run_flink.sh: GPUS and PROCESSES_PER_GPU must be >= 1" >&2; exit 2; fi
  if [ "$ENV_TYPE" = DOCKER ]; then
    echo "run_flink.sh: GPUS needs ENV_TYPE=PROCESS or EXTERNAL: Beam's DOCKER environment starts containers without GPUs" >&2
    exit 2
  fi
  args+=(--sdk_worker_parallelism "$((GPUS * per))")
  if [ "$JOB" = generate ]; then args+=(--device cuda --processes_per_gpu "$per"); fi
fi
exec "$PY" -m "beam_pipelines.$JOB" "${args[@]}" "$@"
