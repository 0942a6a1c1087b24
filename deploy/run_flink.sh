#!/usr/bin/env bash
# Submit the generation (or filter) job to a Flink cluster through Beam's portable FlinkRunner.
set -euo pipefail
usage() {
  cat <<USAGE
usage: FLINK_MASTER=host:8081 ENV_TYPE=EXTERNAL WORKER_POOL=localhost:50000 deploy/run_flink.sh JOB_ARGS...
       FLINK_MASTER=host:8081 IMAGE=registry/paragen:TAG deploy/run_flink.sh JOB_ARGS...
       LOCAL=1 deploy/run_flink.sh JOB_ARGS...      (the same submission, checked on this machine)

Runs python -m beam_pipelines.\$JOB with --runner FlinkRunner against the Flink session cluster
whose REST address is FLINK_MASTER. Beam's Flink job server runs on this machine for the
submission (JOB_SERVER_JAR, started and stopped by Beam). JOB_ARGS are the job's own options
(--input, --output, --forward_model, --backward_model, --preset, ...). Paths are bucket URLs
(s3://, gs://) that every task manager reads and writes through the jobs' storage layer (models
are copied once per machine); credentials come from the SDK workers' environment (AWS_*,
GOOGLE_APPLICATION_CREDENTIALS). A local path works only on a filesystem every task manager
mounts at the same path. The Flink job is named paragen-JOB-<run id>; a stop of this command
(SIGTERM, Ctrl-C) cancels it, and the same command continues the run (docs/operations.md "On Flink").
Tested (tests/test_flink.py) on Flink 1.19.3 with two task managers, ENV_TYPE=EXTERNAL and Beam's
Flink runner 2.62.0 built by scripts/install_flink.sh.
LOCAL=1 takes the path a Flink submission takes on the Python side without a Flink cluster: it
starts Beam's own Python job service (the portable Job API, what Flink's job server answers) and
an EXTERNAL worker pool on loopback, submits the job to them with --runner PortableRunner (the
pipeline serialised, artifacts staged: --setup_file), and the SDK harness processes the pool
starts run it, sharing nothing with the submitting process; both services stop at the end.
Environment:
  LOCAL              1: check the submission on this machine (above); FLINK_MASTER and IMAGE unused
  JOB                generate (default) or filter
  FLINK_MASTER       Flink REST address, host:port (required)
  FLINK_VERSION      Flink version of the cluster (default 1.19, the version tested; Beam's Python
                     SDK takes 1.19 1.20 2.0 2.1 2.2, the job server jar must match the cluster's)
  JOB_SERVER_JAR     Beam's Flink job server jar (default .flink/job-server/beam-flink-job-server.jar,
                     which scripts/install_flink.sh builds from Maven Central with
                     deploy/flink/pom.xml). Without one, Beam downloads its own at submit time
                     (beam-runners-flink-<version>-job-server), which needs access to a Java package
                     repository that serves it
  ENV_TYPE           how task managers start the Python SDK workers: DOCKER (default: the IMAGE;
                     needs Docker on every task manager), EXTERNAL (a worker pool at WORKER_POOL
                     beside each task manager, no Docker: python -m
                     apache_beam.runners.worker.worker_pool_main --service_port 50000 in the
                     project's venv, or /opt/apache/beam/boot --worker_pool in the image) or
                     PROCESS (BOOT run by every task manager)
  IMAGE              ENV_TYPE=DOCKER: the SDK harness image built from deploy/Dockerfile (required there)
  WORKER_POOL        ENV_TYPE=EXTERNAL: host:port of the worker pool (default localhost:50000)
  BOOT               ENV_TYPE=PROCESS: the boot program (default /opt/apache/beam/boot)
  PARALLELISM        default parallelism (default 8)
  GPUS               GPUs per task manager machine (default: none). Each machine then runs
                     GPUS x PROCESSES_PER_GPU SDK worker processes (--sdk_worker_parallelism); each
                     claims a GPU (a lock file per slot in the machine's temporary directory) and the
                     generation job gets --device cuda --processes_per_gpu. Needs ENV_TYPE PROCESS
                     or EXTERNAL (the SDK workers are then processes of one machine or container with
                     the GPUs); Beam's DOCKER environment gives its containers no GPU. Not run on a
                     GPU cluster yet
  PROCESSES_PER_GPU  SDK worker processes per GPU (default 4)
  Restarts           a batch job is restarted after a failed task (a lost task manager) only if the
                     cluster's configuration has a restart strategy (restart-strategy.type:
                     fixed-delay, with attempts and a delay above heartbeat.timeout); Beam's per-job
                     restart options do not reach batch jobs of its Flink runner. The job says at its
                     start when the cluster would not restart it; a failed run is continued by the
                     same command. A restarted task's work units are written again under new names,
                     never twice in the output
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
jar=${JOB_SERVER_JAR:-}
[ -n "$jar" ] || [ ! -f .flink/job-server/beam-flink-job-server.jar ] || jar=$PWD/.flink/job-server/beam-flink-job-server.jar
if [ -n "$jar" ]; then
  [ -f "$jar" ] || { echo "run_flink.sh: JOB_SERVER_JAR $jar: no such file (scripts/install_flink.sh builds one)" >&2; exit 2; }
  args+=(--flink_job_server_jar "$jar")
fi
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
