#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set-up, Rust tests, then pytest (unit, property
# tests against torch, fake-backend scale tests, multi-process gloo via torchrun).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
echo "== cargo test (core, no Python)"
cargo test --locked -q
echo "== pytest"
set +e
python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$rc"
