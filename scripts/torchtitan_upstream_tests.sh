#!/usr/bin/env bash
# Run torchtitan's own ParallelDims tests, at the commit rankmesh.ParallelDims follows (183a0d2,
# "Use new DeviceMesh unflatten to rewrite parallel_dims"), against rankmesh.ParallelDims.
#
#   bash scripts/torchtitan_upstream_tests.sh [PATH_TO_TORCHTITAN_GIT_CHECKOUT [PYTEST_ARGS...]]
#
# The test file is read from a git checkout of pytorch/torchtitan (the argument, $TORCHTITAN_REPO,
# or a fresh clone from GitHub) into a temporary directory; nothing of torchtitan is committed
# here. The tests import `torchtitan.distributed.ParallelDims` and patch
# `torchtitan.distributed.parallel_dims.device_type`; a three-file shim package, first on
# PYTHONPATH, makes that module *be* rankmesh.torchtitan.parallel_dims. CI cannot reach GitHub, so this is a
# documented command rather than a CI step (the result is in the README).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
COMMIT=183a0d2e7241747537fc8f98af056519aff33eab
REPO=${1:-${TORCHTITAN_REPO:-}}
[ $# -gt 0 ] && shift  # the rest goes to pytest
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
if [ -z "$REPO" ]; then
  git clone -q --filter=blob:none https://github.com/pytorch/torchtitan "$TMP/torchtitan-src"
  REPO=$TMP/torchtitan-src
fi
git -C "$REPO" show "$COMMIT:tests/unit_tests/test_parallel_dims.py" > "$TMP/test_parallel_dims.py"
mkdir -p "$TMP/shim/torchtitan/distributed"
echo '"""Shim: torchtitan.distributed is rankmesh here (scripts/torchtitan_upstream_tests.sh)."""' \
  > "$TMP/shim/torchtitan/__init__.py"
echo 'from rankmesh.torchtitan.parallel_dims import ParallelDims  # noqa: F401' > "$TMP/shim/torchtitan/distributed/__init__.py"
cat > "$TMP/shim/torchtitan/distributed/parallel_dims.py" <<'PY'
import sys

import rankmesh.torchtitan.parallel_dims as _rankmesh_parallel_dims

sys.modules[__name__] = _rankmesh_parallel_dims
PY
PY=${PYTHON:-$ROOT/.venv/bin/python}
# torch's DTensorTestBase (the 8-rank test's base class) needs expecttest, a torchtitan dev dep.
"$PY" -c "import expecttest" 2>/dev/null || "$PY" -m pip install -q expecttest
cd "$TMP"
PYTHONPATH="$TMP/shim${PYTHONPATH:+:$PYTHONPATH}" "$PY" - <<'PY'
import torchtitan.distributed.parallel_dims as m, rankmesh.torchtitan.parallel_dims as r
assert m is r, m
print("torchtitan.distributed.parallel_dims is", m.__name__, "from", m.__file__)
PY
PYTHONPATH="$TMP/shim${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pytest -q -p no:cacheprovider --rootdir "$TMP" \
  "$TMP/test_parallel_dims.py" "$@"
