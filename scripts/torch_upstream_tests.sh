#!/usr/bin/env bash
# Run PyTorch's own DTensor / DeviceMesh tests twice, with torch's code and with rankmesh's general
# patches (RANKMESH_ACCELERATE=1, in every rank the tests spawn), and list every test whose outcome
# (passed, failed, error, skipped) differs. Exit status 1 iff any does.
#
#   bash scripts/torch_upstream_tests.sh [PATH_TO_PYTORCH_GIT_CHECKOUT [TEST_FILE...]]
#
# The test files (default: the list below) are read from a git checkout of pytorch/pytorch (the
# argument or $PYTORCH_REPO) at the commit of the environment's torch (torch.version.git_version;
# $TORCH_TESTS_COMMIT overrides it) into a temporary directory; nothing of torch's is committed
# here. CI cannot reach GitHub, so this is a documented command rather than a CI step; a checkout:
#   git clone --filter=blob:none https://github.com/pytorch/pytorch
# $PYTHON (default .venv/bin/python) must have torch and the rankmesh wheel (its .pth file) installed.
# $TORCH_TESTS_OUT keeps the junit XML and logs (default: a temporary directory, removed);
# $PYTEST_ADDOPTS passes more pytest arguments (e.g. "-k 'not LocalTensor'"). On a CPU machine
# each file takes minutes: the DTensorTestBase tests spawn their ranks per test, with gloo.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REPO=${1:-${PYTORCH_REPO:-}}
[ $# -gt 0 ] && shift
FILES=("$@")
[ ${#FILES[@]} -gt 0 ] || FILES=(
  test/distributed/tensor/test_view_ops.py
  test/distributed/tensor/test_redistribute.py
  test/distributed/tensor/test_math_ops.py
  test/distributed/test_device_mesh.py
  test/distributed/tensor/test_dtensor.py
  test/distributed/tensor/test_api.py
  test/distributed/tensor/test_init.py
)
if [ -z "$REPO" ]; then
  echo "usage: $0 PATH_TO_PYTORCH_GIT_CHECKOUT [TEST_FILE...] (or set PYTORCH_REPO)" >&2
  exit 2
fi
PY=${PYTHON:-$ROOT/.venv/bin/python}
# torch's test base classes need expecttest, a torch dev dependency.
"$PY" -c "import expecttest" 2>/dev/null || "$PY" -m pip install -q expecttest
# The patched runs mean nothing unless the variable really installs the patches.
RANKMESH_ACCELERATE=1 "$PY" -c '
import torch.distributed.device_mesh as d
assert d.DeviceMesh._init_process_groups.__module__.startswith("rankmesh"), "RANKMESH_ACCELERATE=1 patches nothing"'
COMMIT=${TORCH_TESTS_COMMIT:-$("$PY" -c 'import torch; print(torch.version.git_version)')}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
OUT=${TORCH_TESTS_OUT:-$TMP/out}
mkdir -p "$OUT"
echo "torch $("$PY" -c 'import torch; print(torch.__version__)'), tests at $COMMIT; XML and logs in $OUT"
for f in "${FILES[@]}"; do
  mkdir -p "$TMP/src/$(dirname "$f")"
  git -C "$REPO" show "$COMMIT:$f" > "$TMP/src/$f"
done
cd "$TMP/src"
bash "$ROOT/scripts/run_both_ways.sh" "$PY" "$OUT" "${FILES[@]}"
