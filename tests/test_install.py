"""What a user installs: the abi3 wheel scripts/setup.sh builds into dist/ and installs.

``scripts/test.sh`` (CI) sets ``RANKMESH_TEST_INSTALLED=1``: then the suite must be running
against that installed wheel, not against the source tree, and the wheel must hold every module,
stub and marker file of the source tree (a file the wheel leaves out fails here, and would fail
the tests that import it). ``rankmesh --version`` prints Cargo.toml's version.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import rankmesh

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "python" / "rankmesh"
SHIPPED = (".py", ".pyi", ".typed")


def _cargo_version() -> str:
    package = (REPO / "Cargo.toml").read_text().split("[package]", 1)[1].split("\n[", 1)[0]
    return re.search(r'^version = "([^"]+)"$', package, re.M).group(1)


def test_version_command_prints_cargos_version():
    out = subprocess.run(
        [sys.executable, "-m", "rankmesh", "--version"], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    assert out.startswith(f"rankmesh {_cargo_version()} ("), out
    assert str(Path(rankmesh.__file__).parent) in out


@pytest.mark.skipif(
    os.environ.get("RANKMESH_TEST_INSTALLED") != "1",
    reason="set by scripts/test.sh; a development environment (RANKMESH_EDITABLE=1) runs the source tree",
)
def test_the_suite_runs_against_the_installed_wheel():
    package = Path(rankmesh.__file__).resolve().parent
    assert package != SOURCE.resolve() and SOURCE.parent.resolve() not in package.parents, package
    assert "site-packages" in package.parts, package
    dist = importlib.metadata.distribution("rankmesh")
    origin = json.loads(dist.read_text("direct_url.json") or "{}")
    assert not origin.get("dir_info", {}).get("editable"), origin
    assert origin.get("url", "").endswith(".whl"), origin
    assert "-abi3-" in origin["url"], origin  # one wheel for every CPython >= 3.10
    shipped = {p.relative_to(package) for p in package.rglob("*") if p.suffix in SHIPPED}
    source = {p.relative_to(SOURCE) for p in SOURCE.rglob("*") if p.suffix in SHIPPED}
    assert not source - shipped, f"the wheel leaves out {sorted(map(str, source - shipped))}"
    assert any(p.name.startswith("_native") and p.suffix == ".so" for p in package.iterdir())


def test_bench_results_go_to_the_repository_it_runs_from(monkeypatch, tmp_path):
    from rankmesh.bench import results_dir

    monkeypatch.chdir(REPO)
    assert results_dir(None) == REPO / "benches" / "results"
    assert results_dir(tmp_path / "mine") == tmp_path / "mine"
    # elsewhere: ./bench-results, never a folder found from where the package is installed (an
    # editable install's source tree included)
    monkeypatch.chdir(tmp_path)
    assert results_dir(None) == Path("bench-results") and (tmp_path / "bench-results").is_dir()
