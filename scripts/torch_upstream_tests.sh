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
for f in "${FILES[@]}"; do
  name=$(basename "$f" .py)
  for mode in stock patched; do
    flag=0
    [ "$mode" = patched ] && flag=1
    start=$SECONDS
    RANKMESH_ACCELERATE=$flag "$PY" -m pytest -q -p no:cacheprovider "$f" \
      --junitxml="$OUT/$name-$mode.xml" > "$OUT/$name-$mode.log" 2>&1 || true
    echo "$name $mode: $((SECONDS - start)) s, $(tail -n 1 "$OUT/$name-$mode.log")"
  done
done
"$PY" - "$OUT" "${FILES[@]}" <<'PY'
"""Per-file counts, stock against patched, and every test whose outcome differs."""
import os
import sys
import xml.etree.ElementTree as ET

RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


def outcomes(path):
    """{test id: outcome} from one junit XML file (None when pytest wrote none)."""
    if not os.path.exists(path):
        return None
    found = {}
    for case in ET.parse(path).iter("testcase"):
        key = f"{case.get('classname')}::{case.get('name')}"
        tags = {child.tag for child in case}
        now = next((o for t, o in (("error", "error"), ("failure", "failed"), ("skipped", "skipped")) if t in tags), "passed")
        # pytest can report a test twice (a failure, then an error in teardown): keep the worst
        found[key] = max(found.get(key, now), now, key=RANK.get)
    return found


def counts(found):
    if found is None:
        return "no XML"
    return "/".join(str(sum(o == k for o in found.values())) for k in RANK)


out, files = sys.argv[1], sys.argv[2:]
differ = []
print(f"\n{'file':<28} {'stock p/s/f/e':>16} {'patched p/s/f/e':>16}")
for f in files:
    name = os.path.basename(f)[: -len(".py")]
    stock, patched = (outcomes(os.path.join(out, f"{name}-{m}.xml")) for m in ("stock", "patched"))
    print(f"{name:<28} {counts(stock):>16} {counts(patched):>16}")
    if stock is None or patched is None:
        differ.append(f"{name}: no XML from the {'stock' if stock is None else 'patched'} run")
        continue
    for key in sorted(stock.keys() | patched.keys()):
        a, b = stock.get(key, "absent"), patched.get(key, "absent")
        if a != b:
            differ.append(f"{key}: stock {a}, patched {b}")
print(f"\n{len(differ)} outcome(s) differ" + (":" if differ else ""))
for line in differ:
    print("  " + line)
sys.exit(1 if differ else 0)
PY
