#!/usr/bin/env bash
# Run each pytest file twice from the current directory, with the framework's own code and with
# RANKMESH_ACCELERATE=1 (every rank the tests spawn inherits it), keep junit XML and logs in OUT,
# and list every test whose outcome differs (scripts/junit_compare.py; exit status 1 iff any does).
# The upstream-test scripts (torch_upstream_tests.sh, deepspeed_upstream_tests.sh) end with it.
#
#   bash scripts/run_both_ways.sh PYTHON OUT TEST_FILE...
set -euo pipefail
PY=$1
OUT=$2
shift 2
for f in "$@"; do
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
"$PY" "$(dirname "$0")/junit_compare.py" "$OUT" "$@"
