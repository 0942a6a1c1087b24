#!/usr/bin/env bash
# Create (or update) the project virtualenv with pinned dependencies. Idempotent.
#   VENV=path   where to put it (default .venv)
#   TORCH=cuda  the CUDA build of torch 2.13.0 (PyPI's wheel for Linux x86_64: it brings its CUDA
#               runtime as nvidia-* packages, about 4 GB more; the machine needs only the NVIDIA
#               driver), replacing a CPU build already in the venv; default: the build this
#               machine's pip picks. Packages come from wherever your pip configuration says (an
#               index, a mirror, a proxy): this script names no host. TORCH=cuda asks for
#               "torch==2.13.0,!=2.13.0+cpu", which rules out a CPU-only build (a local wheel, or
#               PyTorch's CPU index) wherever it is found.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# shellcheck source=/dev/null
. "$VENV/bin/activate"
pip install -q --disable-pip-version-check "pip==25.3" "setuptools>=70" wheel
# Build prerequisites of fairseq-fixed's C++/Cython extensions, then the locked set.
case "${TORCH:-}" in
  cuda)
    if ! python -c "import torch, sys; sys.exit(torch.version.cuda is None)" 2>/dev/null; then
      pip uninstall -q -y torch 2>/dev/null || true
      echo "installing the CUDA build of torch (about 4 GB)..." >&2
      pip install -q --disable-pip-version-check "torch==2.13.0,!=2.13.0+cpu"
    fi;;
  ""|cpu) ;;
  *) echo "TORCH must be cuda or cpu, not $TORCH" >&2; exit 2;;
esac
pip install -q --disable-pip-version-check torch==2.13.0 numpy==2.4.6 Cython==3.3.1
pip install -q --disable-pip-version-check -r requirements.txt
if ! python -c "import fairseq, fastBPE" 2>/dev/null; then
  echo "building fairseq-fixed and fastBPE (compiles extensions, a few minutes the first time)..." >&2
  pip install -q --disable-pip-version-check --no-build-isolation --no-deps -r requirements-fairseq.txt
fi
pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
python -c "import fairseq, apache_beam, torch; print('environment ready:', 'torch', torch.__version__, 'beam', apache_beam.__version__, 'fairseq', fairseq.__version__)" 2>/dev/null
if [ "${TORCH:-}" = cuda ]; then
  python -c "import torch; print('CUDA', torch.version.cuda, '-', torch.cuda.device_count(), 'GPU(s) visible:', ', '.join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) or 'none (is the NVIDIA driver installed?)')"
fi
# The tree_edit filter's parser comes from Debian's packages; without it that filter (and its
# test) is skipped, everything else works.
if [ "${SKIP_PARSER:-0}" != 1 ]; then
  bash scripts/install_parser.sh >/dev/null 2>&1 || echo "note: link-grammar not installed (needs apt and root); the tree_edit filter is unavailable" >&2
fi
# SLURM's daemons, for the tests that run the jobs under a real SLURM (tests/test_slurm.py, skipped
# without them); the jobs themselves need only sbatch on a cluster's nodes.
if [ "${SKIP_SLURM:-0}" != 1 ]; then
  bash scripts/install_slurm.sh >/dev/null 2>&1 || echo "note: SLURM not installed (needs apt and root); its tests are skipped" >&2
fi
# Flink 1.19 (from the package index) and Beam's Flink job server (from Maven Central) in .flink/, for
# the tests that run the jobs on a real Flink session cluster (tests/test_flink.py, skipped without
# them); needs Java 17 and Maven.
if [ "${SKIP_FLINK:-0}" != 1 ]; then
  PYTHON="$VENV/bin/python" bash scripts/install_flink.sh || echo "note: Flink not installed (scripts/install_flink.sh, above); its tests are skipped" >&2
fi
# Hadoop's MiniDFSCluster (from Maven Central) in .hdfs/, for the tests that run the storage layer
# and the jobs on a real HDFS over WebHDFS (tests/hdfs_cluster.py, skipped without it); needs Java 17
# and Maven. Users reach HDFS with nothing installed (webhdfs://).
if [ "${SKIP_HDFS:-0}" != 1 ]; then
  bash scripts/install_hdfs.sh || echo "note: the tests' HDFS not installed (scripts/install_hdfs.sh, above); its tests are skipped" >&2
fi
