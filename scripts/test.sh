#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set-up, Rust tests, then pytest (unit, property
# tests against torch, fake-backend scale tests, multi-process gloo via torchrun) on the newest
# and on the oldest supported torch.
#
#   bash scripts/test.sh                              # torch 2.15.0 and 2.13.0
#   RANKMESH_TORCH_VERSIONS=2.15.0 bash scripts/test.sh -x -q   # one torch, pytest flags
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== cargo test (core, no Python)"
cargo test --locked -q
status=0
for v in ${RANKMESH_TORCH_VERSIONS:-2.15.0 2.13.0}; do
  echo "== set-up: torch $v"
  RANKMESH_TORCH=$v bash scripts/setup.sh
  venv=$([ "$v" = "2.15.0" ] && echo .venv || echo ".venv-torch$v")
  echo "== pytest on torch $v"
  set +e
  "$venv/bin/python" -m pytest "$@"
  rc=$?
  set -e
  if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests on torch $v: that is a failure" >&2
    rc=1
  fi
  if [ "$rc" -ne 0 ]; then
    echo "== pytest on torch $v FAILED (exit $rc)" >&2
    status=$rc
  fi
done
exit "$status"
