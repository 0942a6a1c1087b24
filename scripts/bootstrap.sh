#!/usr/bin/env bash
# Create (or update) the project virtualenv with pinned dependencies. Idempotent.
#   VENV=path  where to put it (default .venv)
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
pip install -q --disable-pip-version-check torch==2.13.0 numpy==2.4.6 Cython==3.3.1
pip install -q --disable-pip-version-check -r requirements.txt
if ! python -c "import fairseq, fastBPE" 2>/dev/null; then
  echo "building fairseq-fixed and fastBPE (compiles extensions, a few minutes the first time)..." >&2
  pip install -q --disable-pip-version-check --no-build-isolation --no-deps -r requirements-fairseq.txt
fi
pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
python -c "import fairseq, apache_beam, torch; print('environment ready:', 'torch', torch.__version__, 'beam', apache_beam.__version__, 'fairseq', fairseq.__version__)" 2>/dev/null
# The tree_edit filter's parser comes from Debian's packages; without it that filter (and its
# test) is skipped, everything else works.
if [ "${SKIP_PARSER:-0}" != 1 ]; then
  bash scripts/install_parser.sh >/dev/null 2>&1 || echo "note: link-grammar not installed (needs apt and root); the tree_edit filter is unavailable" >&2
fi
