#!/usr/bin/env bash
# The main job, from a fresh machine: build a torchtitan-style 131,072-rank mesh for one rank on
# the fake backend with rankmesh and with stock torch, and print groups, process groups and timings.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
exec python -m rankmesh.bench.demo "$@"
