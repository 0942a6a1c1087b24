#!/usr/bin/env bash
# The tree_edit filter's parser: link-grammar from Debian's packages (constituent trees, English
# dictionary included, nothing downloaded at run time). filtering/syntax.py imports the Debian
# module into the project's Python 3.11 virtualenv. Needs root (or sudo) and apt.
set -euo pipefail
if python3 -c "import sys; sys.path.insert(0, '/usr/lib/python3/dist-packages'); import linkgrammar" 2>/dev/null; then
  echo "link-grammar already installed"; exit 0
fi
bash "$(dirname "$0")/apt_install.sh" link-grammar python3-link-grammar
echo "link-grammar installed"
