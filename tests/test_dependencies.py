"""One home for optional dependencies and versions (rankmesh._dependencies): what the package
imports is declared, the table agrees with pyproject.toml's extras, and the one policy (warn once,
fall back to stock) answers for every version rankmesh has not read."""

from __future__ import annotations

import ast
import sys
import warnings
from pathlib import Path

import pytest
import rankmesh
from rankmesh import _dependencies, _once
from rankmesh._dependencies import DEPENDENCIES, Dependency

PACKAGE = Path(rankmesh.__file__).resolve().parent
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
#: What the package needs on every install (pyproject's ``dependencies``).
REQUIRED = {"numpy", "packaging"}


def third_party_imports(package: Path) -> dict[str, set[str]]:
    """Top-level names of every non-stdlib, non-rankmesh import in the package, with the files."""
    found: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                # _rankmesh_autostart: rankmesh's own start-up module, beside the package in the wheel
                if top not in sys.stdlib_module_names and top not in ("rankmesh", "_rankmesh_autostart", "__future__"):
                    found.setdefault(top, set()).add(path.name)
    return found


#: Frameworks the benchmark times as themselves (``rankmesh bench --recipe <framework>``), imported
#: only by rankmesh/bench/frameworks.py inside the recipe that needs them: no part of rankmesh uses
#: them, so they are requirements of that recipe alone (requirements-dev.txt), not dependencies.
BENCHMARKED = {"transformers", "accelerate", "nemo_automodel", "deepspeed"}


def undeclared(found: dict[str, set[str]]) -> set[str]:
    declared = REQUIRED | {d.module.split(".")[0] for d in DEPENDENCIES.values()}
    benchmarked = {name for name in BENCHMARKED if found.get(name) == {"frameworks.py"}}
    return set(found) - declared - benchmarked


def test_every_package_rankmesh_imports_is_declared():
    found = third_party_imports(PACKAGE)
    assert {"numpy", "torch", "megatron", "torchtitan"} <= set(found)  # the walk sees imports
    assert undeclared(found) == set()


def test_the_declaration_check_finds_an_undeclared_import():
    assert undeclared({"numpy": {"a.py"}, "scipy": {"b.py"}}) == {"scipy"}
    # a benchmarked framework imported anywhere but the benchmark's registry is undeclared
    assert undeclared({"transformers": {"frameworks.py"}}) == set()
    assert undeclared({"transformers": {"frameworks.py", "mesh.py"}}) == {"transformers"}


def test_pyproject_declares_what_the_table_names():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    required = {r.split(">")[0].split("=")[0].split("<")[0].strip() for r in project["dependencies"]}
    assert required == REQUIRED
    extras = project["optional-dependencies"]
    for dep in DEPENDENCIES.values():
        if dep.distribution == "spmd_types":  # torchtitan 0.3.0 pulls it in
            continue
        listed = {r.split(">")[0].split("=")[0].split("<")[0].strip() for r in extras[dep.extra]}
        assert dep.distribution in listed, (dep.distribution, dep.extra)


@pytest.mark.parametrize(
    "releases, version, ok",
    [
        (("0.16",), "0.16.1", True),
        (("0.16",), "0.16.0rc1", True),
        (("0.16",), "0.17.0", False),
        (("0.16",), "0.1", False),
        (("0.3.0",), "0.3.0", True),
        (("0.3.0",), "0.3.0+local", True),
        (("0.3.0",), "0.3.1", False),
        (("2.13", "2.15"), "2.15.0+cu132", True),
        (("2.13", "2.15"), "2.14.1", False),
        (("2.13",), "not a version", False),
    ],
)
def test_a_release_holds_its_versions(releases, version, ok):
    assert Dependency("x", "x", releases, "x", "").supports(version) is ok


def test_unsupported_names_the_version_and_the_releases(monkeypatch):
    monkeypatch.setattr(_dependencies, "_versions", {"megatron-core": "0.15.2", "torchtitan": None})
    assert _dependencies.unsupported("megatron-core") == (
        "megatron-core 0.15.2 is not a version rankmesh has read (supported: 0.16)"
    )
    assert "supported: 0.16.1" in _dependencies.unsupported("megatron-core", ("0.16.1",))
    assert _dependencies.unsupported("torchtitan") == "torchtitan is not installed (pip install 'rankmesh[torchtitan]')"
    monkeypatch.setattr(_dependencies, "_versions", {"megatron-core": "0.16.1"})
    assert _dependencies.unsupported("megatron-core") is None


def test_available_looks_without_importing(monkeypatch):
    monkeypatch.setitem(DEPENDENCIES, "nope", Dependency("nope", "rankmesh_nope_pkg.sub", ("1",), "x", ""))
    assert _dependencies.available("nope") is False  # a missing parent package is not an error
    monkeypatch.setitem(DEPENDENCIES, "json", Dependency("json", "json.decoder", ("1",), "x", ""))
    assert _dependencies.available("json") is True


def test_the_policy_warns_once_per_package_and_reason(monkeypatch):
    monkeypatch.setattr(_once, "_seen", set())
    with pytest.warns(RuntimeWarning, match=r"^rankmesh: x 1 is not read; stock runs$"):
        _dependencies.warn_unsupported("x", "x 1 is not read", "stock runs")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _dependencies.warn_unsupported("x", "x 1 is not read", "stock runs")
    with pytest.warns(RuntimeWarning, match="x 2"):
        _dependencies.warn_unsupported("x", "x 2 is not read", "stock runs")


def test_report_lists_every_dependency():
    rows = {name: (v, ok) for name, v, _, ok in _dependencies.report()}
    assert set(rows) == set(DEPENDENCIES)
    torch_version, torch_ok = rows["torch"]
    assert torch_version is None or torch_ok  # CI runs torch versions rankmesh has read


def test_a_source_checkout_without_metadata_is_read_from_the_module(monkeypatch):
    """Megatron-LM run from a checkout on PYTHONPATH has no install metadata: the version comes from
    megatron.core.package_info, so rankmesh neither calls it missing nor refuses it."""
    pytest.importorskip("megatron.core")
    from importlib import metadata

    real = metadata.version

    def no_metadata(name):
        if name == "megatron-core":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(_dependencies.metadata, "version", no_metadata)
    monkeypatch.setattr(_dependencies, "_versions", {})
    import megatron.core.package_info as info

    assert _dependencies.version("megatron-core") == info.__version__
    nope = Dependency("nope", "rankmesh_nope_pkg", ("1",), "x", "", "rankmesh_nope_pkg:v")
    monkeypatch.setitem(DEPENDENCIES, "nope", nope)
    monkeypatch.setattr(_dependencies, "_versions", {})
    assert _dependencies.version("nope") is None


def test_every_extra_names_only_packages_of_the_table_and_pins_what_it_reads():
    """pyproject's extras list nothing the table does not know; each admits every release rankmesh
    has read; torch and megatron-core have no upper bound (a release rankmesh has not read runs its
    own code, so a pin would only downgrade a newer install), torchtitan's extra installs exactly
    the release its patch has read."""
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement
    from packaging.version import Version

    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    for extra, reqs in extras.items():
        for text in reqs:
            req = Requirement(text)
            dep = DEPENDENCIES.get(req.name)
            assert dep is not None, f"[{extra}] {req.name} is not in rankmesh._dependencies.DEPENDENCIES"
            if dep.distribution in ("torch", "torchtitan", "megatron-core"):
                for release in dep.releases:
                    assert req.specifier.contains(Version(release + ".0" * (2 - release.count("."))))
                last = Version(dep.releases[-1]).release
                after = ".".join(map(str, (*last[:-1], last[-1] + 1)))
                newer = req.specifier.contains(Version(after + ".0" * (2 - after.count("."))))
                assert newer is (dep.distribution != "torchtitan"), (req, after)
