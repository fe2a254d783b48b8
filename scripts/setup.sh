#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: a virtual environment in .venv with torch (CPU use of the
# default PyPI wheel, cached by pip), the test tools, and rankmesh itself built by maturin.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.deps-$(sha256sum requirements-dev.txt | cut -c1-16)
if [ ! -f "$stamp" ]; then
  python -m pip install -q --upgrade pip
  python -m pip install -q -r requirements-dev.txt
  touch "$stamp"
fi
# Build the extension in release mode and install it into the venv (editable: python/ is on the path).
python -m maturin develop --release -q --features python >/dev/null
