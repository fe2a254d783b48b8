#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set-up, Rust tests, lint (cargo fmt, clippy, ruff check and format;
# any finding fails the run), then pytest (unit, property tests against torch, fake-backend scale
# tests, multi-process gloo via torchrun) on the newest and on the oldest supported torch, each
# against rankmesh's abi3 wheel installed into that environment (scripts/setup.sh), not the
# source tree.
#
#   bash scripts/test.sh                              # torch 2.15.0 and 2.13.0
#   RANKMESH_TORCH_VERSIONS=2.15.0 bash scripts/test.sh -x -q   # one torch, pytest flags
set -euo pipefail
cd "$(dirname "$0")/.."
# A hang fails its step with a message instead of holding CI until its time runs out: cargo test
# takes seconds (10 minutes is a hang; pytest's own per-test limit is in pyproject.toml).
echo "== cargo test (core, no Python)"
if ! timeout -k 30 600 cargo test --locked -q; then
  echo "== cargo test FAILED or hung (killed after 600 s)" >&2
  exit 1
fi
echo "== lint: cargo fmt --check, cargo clippy -D warnings"
cargo fmt --check
PYO3_PYTHON=${PYO3_PYTHON:-$(command -v python3)} cargo clippy --locked -q --all-targets --features python -- -D warnings
status=0
linted=
for v in ${RANKMESH_TORCH_VERSIONS:-2.15.0 2.13.0}; do
  echo "== set-up: torch $v"
  RANKMESH_TORCH=$v bash scripts/setup.sh
  venv=$([ "$v" = "2.15.0" ] && echo .venv || echo ".venv-torch$v")
  if [ -z "$linted" ]; then
    echo "== lint: ruff check and ruff format --check (pyproject.toml: line length 120)"
    "$venv/bin/ruff" check .
    "$venv/bin/ruff" format --check .
    linted=1
  fi
  echo "== pytest on torch $v (against the installed wheel: $(ls dist/rankmesh-*-abi3-*.whl))"
  set +e
  RANKMESH_TEST_INSTALLED=1 "$venv/bin/python" -m pytest "$@"
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
