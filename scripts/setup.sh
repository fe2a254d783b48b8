#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: a virtual environment with torch (CPU use of the default
# PyPI wheel), the test tools, and rankmesh itself: its abi3 wheel and sdist built by maturin into
# dist/, the wheel installed into the environment.
#
#   bash scripts/setup.sh                 # .venv with the newest supported torch (2.15.0)
#   RANKMESH_TORCH=2.13.0 bash scripts/setup.sh   # .venv-torch2.13.0 with the oldest
#   RANKMESH_EDITABLE=1 bash scripts/setup.sh     # maturin develop instead: edits to python/ take
#                                                 # effect without re-running this
#
# Supported torch: 2.13, 2.14, 2.15 (CI runs the suite on 2.15.0 and 2.13.0).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=${RANKMESH_TORCH:-2.15.0}
VENV=${RANKMESH_VENV:-$([ "$TORCH" = "2.15.0" ] && echo .venv || echo ".venv-torch$TORCH")}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
. "$VENV/bin/activate"
stamp=$VENV/.deps-$( (cat requirements-dev.txt; echo "torch==$TORCH") | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  python -m pip install -q --upgrade pip
  python -m pip install -q "torch==$TORCH" -r requirements-dev.txt
  # Test oracles whose own pins conflict with the ones above: requirements-dev.txt's
  # "# no-deps: <requirement>" lines, installed without their dependencies.
  sed -n 's/^# no-deps: //p' requirements-dev.txt | xargs -r -d '\n' python -m pip install -q --no-deps
  touch "$stamp"
fi
if [ "${RANKMESH_EDITABLE:-0}" = "1" ]; then
  # Development: build the extension in release mode, install editable (python/ is on the path).
  # An extension left by an older non-abi3 build would shadow the new one (Python tries
  # _native.cpython-3XX-*.so before _native.abi3.so), so clear them first.
  rm -f python/rankmesh/_native.*.so
  python -m maturin develop --release -q >/dev/null
else
  # What a user gets: one abi3 wheel (CPython >= 3.10) and an sdist in dist/, the wheel installed
  # like any other (not editable: the source tree is not on the path, so tests see what ships).
  rm -f dist/rankmesh-*.whl dist/rankmesh-*.tar.gz
  python -m maturin build --release --sdist -o dist -q >/dev/null
  python -m pip install -q --force-reinstall --no-deps dist/rankmesh-*-abi3-*.whl
fi
