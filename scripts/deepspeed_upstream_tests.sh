#!/usr/bin/env bash
# Run DeepSpeed's own tests of its pipeline topology, grid, PipelineModule and groups twice, with
# DeepSpeed's code and under the one switch (RANKMESH_ACCELERATE=1, in every rank the tests
# spawn), and list every test whose outcome (passed, failed, error, skipped) differs. Exit status
# 1 iff any does.
#
#   bash scripts/deepspeed_upstream_tests.sh PATH_TO_DEEPSPEED_GIT_CHECKOUT [TEST_FILE...]
#
# The sdist on PyPI ships no tests: they are read from a git checkout of deepspeedai/DeepSpeed at
# $DEEPSPEED_TESTS_TAG (default v0.19.5, the newest tag: 0.19.6-0.19.8 have none; topology.py is the
# same file in v0.19.5 and the 0.19.8 sdist) into a temporary directory, run from its tests/ as
# DeepSpeed's CI runs them (gloo on CPU: DS_ACCELERATOR=cpu). Nothing of DeepSpeed's is committed
# here. CI cannot reach GitHub, so this is a documented command rather than a CI step; a checkout:
#   git clone --filter=blob:none https://github.com/deepspeedai/DeepSpeed
# $PYTHON (default .venv/bin/python) must have DeepSpeed and the rankmesh wheel (its .pth file);
# DeepSpeed's CPU all-reduce op is JIT-built by its DistributedTest worlds, which needs ninja (pip)
# and a C++ compiler. $DEEPSPEED_TESTS_OUT keeps the junit XML and logs (default: removed).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REPO=${1:-${DEEPSPEED_REPO:-}}
[ $# -gt 0 ] && shift
FILES=("$@")
[ ${#FILES[@]} -gt 0 ] || FILES=(
  unit/runtime/pipe/test_topology.py
  unit/utils/test_groups.py
  unit/pipe/test_pipe_module.py
  unit/runtime/pipe/test_pipe.py
  unit/model_parallelism/test_autotp_training.py
)
if [ -z "$REPO" ]; then
  echo "usage: $0 PATH_TO_DEEPSPEED_GIT_CHECKOUT [TEST_FILE...] (or set DEEPSPEED_REPO)" >&2
  exit 2
fi
PY=${PYTHON:-$ROOT/.venv/bin/python}
"$PY" -c "import ninja" 2>/dev/null || "$PY" -m pip install -q ninja
# ninja on the path; gloo on CPU; LOCAL_SIZE: the CPU accelerator's "device" count, which
# DistributedTest compares with its world size (without it the 4-rank tests skip as "not enough GPUs")
export PATH="$(dirname "$PY"):$PATH" DS_ACCELERATOR=cpu LOCAL_SIZE=${LOCAL_SIZE:-8}
# The patched runs mean nothing unless the variable really installs the patches.
RANKMESH_ACCELERATE=1 "$PY" -c '
import deepspeed.runtime.pipe.topology as t
assert t.PipelineParallelGrid.__init__.__module__ == "rankmesh.deepspeed", "RANKMESH_ACCELERATE=1 patches nothing"' 2>/dev/null
TAG=${DEEPSPEED_TESTS_TAG:-v0.19.5}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
OUT=${DEEPSPEED_TESTS_OUT:-$TMP/out}
mkdir -p "$OUT"
echo "deepspeed $("$PY" -c 'import deepspeed; print(deepspeed.__version__)' 2>/dev/null), tests at $TAG; XML and logs in $OUT"
git -C "$REPO" archive "$TAG" tests 2>/dev/null | tar -x -C "$TMP"
cd "$TMP/tests"
bash "$ROOT/scripts/run_both_ways.sh" "$PY" "$OUT" "${FILES[@]}"
