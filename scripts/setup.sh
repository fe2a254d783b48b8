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
# The key of the sources that go into the wheel and the sdist (maturin: the crate of Cargo.toml and
# Cargo.lock with rust/, python/ with python/rankmesh.data, pyproject.toml, README.md as the
# project's readme), tracked or new but not ignored, by name and content, and the Rust compiler's
# version; empty (every run builds) outside a git work tree.
source_key() {
  git rev-parse --is-inside-work-tree >/dev/null 2>&1 || return 0
  {
    rustc -V 2>/dev/null || echo "no rustc"
    git ls-files -z --cached --others --exclude-standard -- Cargo.toml Cargo.lock pyproject.toml README.md rust python |
      sort -zu | while IFS= read -r -d '' f; do
        if [ -f "$f" ]; then sha256sum -- "$f"; fi  # a tracked file deleted in the work tree: left out
      done
  } | sha256sum | cut -c1-16
}
# Whether dist/ holds one wheel and the sdist built from the sources of key $1 (dist/.source-key,
# written after each build) and this environment's rankmesh was installed from that wheel file
# (pip's direct_url.json; not editable), its modules and native extension in place.
wheel_installed() {
  local wheels=(dist/rankmesh-*-abi3-*.whl)
  [ "${#wheels[@]}" -eq 1 ] && [ -f "${wheels[0]}" ] && ls dist/rankmesh-*.tar.gz >/dev/null 2>&1 || return 1
  [ "$(cat dist/.source-key 2>/dev/null)" = "$1" ] || return 1
  python -I - "${wheels[0]}" <<'PY'
import importlib.metadata as md, json, sys
from pathlib import Path
from urllib.parse import unquote, urlparse
try:
    dist = md.distribution("rankmesh")
except md.PackageNotFoundError:
    sys.exit(1)
origin = json.loads(dist.read_text("direct_url.json") or "{}")
url = urlparse(origin.get("url", ""))
same = url.scheme == "file" and Path(unquote(url.path)).resolve() == Path(sys.argv[1]).resolve()
files = [f for f in dist.files or [] if f.suffix in (".py", ".so")]
native = any(f.name.startswith("_native") and f.suffix == ".so" for f in files)
present = all(Path(dist.locate_file(f)).is_file() for f in files)
sys.exit(0 if same and not origin.get("dir_info", {}).get("editable") and native and present else 1)
PY
}
if [ "${RANKMESH_EDITABLE:-0}" = "1" ]; then
  # Development: build the extension in release mode, install editable (python/ is on the path).
  # An extension left by an older non-abi3 build would shadow the new one (Python tries
  # _native.cpython-3XX-*.so before _native.abi3.so), so clear them first.
  rm -f python/rankmesh/_native.*.so
  python -m maturin develop --release -q >/dev/null
else
  # What a user gets: one abi3 wheel (CPython >= 3.10) and an sdist in dist/, the wheel installed
  # like any other (not editable: the source tree is not on the path, so tests see what ships).
  # A release build takes minutes, so it is skipped when nothing that goes into the wheel changed
  # since this environment installed it: a stamp in the environment (as for the dependencies; a
  # fresh clone has none, so it always builds) keyed by the sources' contents and the Rust
  # compiler, while dist/ still holds a build of the same key and the installed rankmesh is that
  # wheel (RANKMESH_EDITABLE=1 in between means a rebuild). Environments of other torch versions
  # share dist/: a build of the same sources by either serves both.
  key=$(source_key) || key=
  wheel_stamp=$VENV/.wheel-$key
  if [ -n "$key" ] && [ -f "$wheel_stamp" ] && wheel_installed "$key"; then
    echo "rankmesh: sources unchanged since $VENV installed $(ls dist/rankmesh-*-abi3-*.whl); not rebuilt" \
      "(rm $VENV/.wheel-* to force a build)" >&2
  else
    rm -f dist/rankmesh-*.whl dist/rankmesh-*.tar.gz dist/.source-key "$VENV"/.wheel-*
    python -m maturin build --release --sdist -o dist -q >/dev/null
    python -m pip install -q --force-reinstall --no-deps dist/rankmesh-*-abi3-*.whl
    if [ -n "$key" ]; then
      echo "$key" >dist/.source-key
      touch "$wheel_stamp"
    fi
  fi
fi
