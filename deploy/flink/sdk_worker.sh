#!/usr/bin/env bash
# Beam's PROCESS environment on a task manager without Docker or Beam's Go boot program: the command a
# Flink task manager runs to start a Python SDK worker of a job (beam_pipelines/process_worker.py):
#   ENV_TYPE=PROCESS BOOT=/path/to/checkout/deploy/flink/sdk_worker.sh deploy/run_flink.sh ...
# BOOT must be this file's path on the task managers' machines, in a checkout whose .venv the bootstrap
# made (or PARAGEN_PYTHON: an interpreter with the project installed). Beam gives the arguments.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
PY=${PARAGEN_PYTHON:-$here/.venv/bin/python}
[ -x "$PY" ] || { echo "sdk_worker.sh: no Python at $PY (set PARAGEN_PYTHON)" >&2; exit 2; }
exec "$PY" -m beam_pipelines.process_worker "$@"
