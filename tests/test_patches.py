"""The registry of what rankmesh changes in torch and frameworks (rankmesh.patches): every switch
``RANKMESH_DISABLE`` takes is a patch of the registry or ``fast_groups``, and a name it does not
know is said once instead of being ignored."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("torch")
from rankmesh import _once, _patch, patches  # noqa: E402


def test_every_switch_is_a_patch_or_fast_groups():
    assert set(patches.REGISTRY) | {"fast_groups", "rank_tables"} == _patch.SWITCHES
    for name, p in patches.REGISTRY.items():
        assert p.name == name and p.why and p.versions and "." in p.target


def test_a_patch_outside_the_switches_is_refused():
    with pytest.raises(ValueError, match="SWITCHES"):
        _patch.Patch("bogus", "os", "sep", lambda o: o, why="", gate=_patch.Gate("torch"))


def test_every_table_entry_is_pinned_and_every_pinned_release_has_one():
    """Both directions: a release pinned in rankmesh._dependencies without a table entry, and an
    entry whose release is not pinned, each fail here (a new release is the pin plus one entry)."""
    from rankmesh._dependencies import DEPENDENCIES
    from rankmesh._known import TABLES

    for dependency, table in TABLES.items():
        assert tuple(table) == DEPENDENCIES[dependency].releases, dependency
        for release, entry in table.items():
            for path, digest in entry.bodies.items():
                assert path.count(".") >= 2 and len(digest) == 16 and int(digest, 16) >= 0, (release, path)


def test_every_gate_finds_each_of_its_bodies_in_every_release_it_applies_to():
    """A release pasted without one of the paths a patch or fast path needs fails here, not at run
    time (where it would only warn and turn the fast path off)."""
    from rankmesh._known import TABLES

    gates = patches.gates()
    assert {"fast_groups new_group", "fast_groups split_group", "fast_meshes"} <= set(gates)
    for what, gate in gates.items():
        assert gate.releases, what
        table = TABLES[gate.dependency]
        for release in gate.releases:
            missing = [p for p in gate.paths if p not in table[release].bodies]
            assert not missing, (what, release, missing)
    # the split path applies where the table says rankmesh reproduces split_group
    split = gates["fast_groups split_group"].releases
    assert split == tuple(r for r, e in TABLES["torch"].items() if e.facts["split_group"])
    assert all(e.facts["scheme"] in ("group_count", "pg_names") for e in TABLES["torch"].values())


def test_a_gate_on_a_path_no_release_has_is_refused():
    with pytest.raises(ValueError, match=r"are in no release of torch's table"):
        _patch.Gate("torch", ["torch.distributed.get_rank"])
    with pytest.raises(ValueError, match="has no table"):
        _patch.Gate("numpy")


def test_the_installed_code_is_recognised_where_its_release_is_read():
    """Every patch, fast path and the self-check's ``_concatenate`` recognise the torch and frameworks
    installed here, unless their release is not one they read (2.13 and 2.14 for the split_group
    path, a framework that is not installed)."""
    for what, gate in patches.gates().items():
        reason = gate.recognise()
        if gate.release() is not None:
            assert reason is None, (what, reason)
        else:
            assert reason is not None and ("is not a version" in reason or "is not installed" in reason), what


def test_versions_are_rendered_from_the_table():
    for p in patches.REGISTRY.values():
        assert p.versions.startswith(f"{p.gate.dependency} {', '.join(p.gate.releases)}"), p.versions


def test_an_unknown_disable_name_warns_once_and_the_known_ones_still_count(disable, monkeypatch):
    monkeypatch.setattr(_once, "_seen", set())
    disable("fastgroups, concatenate")
    with pytest.warns(RuntimeWarning, match=r"names \['fastgroups'\], which rankmesh does not know"):
        assert _patch.disabled("concatenate")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not _patch.disabled("fast_groups")  # the typo disables nothing, and is said once
    disable("all")
    assert all(_patch.disabled(n) for n in _patch.SWITCHES)
    disable(None)
    assert not any(_patch.disabled(n) for n in _patch.SWITCHES)


def test_an_unknown_patch_name_is_a_typed_error_and_still_a_key_error():
    from rankmesh.errors import ERROR_KINDS, UnknownNameError

    assert patches.get("concatenate") is patches.REGISTRY["concatenate"]
    with pytest.raises(KeyError) as info:  # code written for the registry's dict keeps catching it
        patches.get("nope")
    e = info.value
    assert isinstance(e, UnknownNameError) and e.kind == "unknown_patch"
    assert (e.field, e.value) == ("name", "nope")
    assert e.ctx == {"patches": tuple(sorted(patches.REGISTRY))} and set(e.ctx) == set(ERROR_KINDS[e.kind])
    assert str(e).startswith("no rankmesh patch 'nope'; the patches are ")
    assert all(name in str(e) for name in patches.REGISTRY)


def _decorated(fn):
    return fn


@_decorated
def _ends_in_a_call(a, b):
    return max(
        a,
        b,
    )


def _ends_in_a_block(xs):
    total = 0
    for x in xs:
        total += x
        # a comment inside, at the end
    return total


def test_source_hash_cuts_the_same_text_as_inspect_getsource():
    """The body hash reads a function straight from its file (no tokenizing), yet cuts exactly what
    inspect.getsource does: decorators in, a last statement spread over lines in, whatever line the
    interpreter gives the last instruction."""
    import hashlib
    import inspect

    from torch.distributed import distributed_c10d as c10d
    from torch.distributed.device_mesh import DeviceMesh

    def by_tokens(fn):
        text = "\n".join(line.strip() for line in inspect.getsource(fn).splitlines() if line.strip())
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    fns = [_ends_in_a_call, _ends_in_a_block, c10d.new_group, c10d.split_group, c10d._new_group_with_tag]
    fns += [DeviceMesh.__init__, DeviceMesh._concatenate if hasattr(DeviceMesh, "_concatenate") else DeviceMesh.size]
    for fn in fns:
        assert _patch.source_hash(fn) == by_tokens(inspect.unwrap(fn)), fn


def test_the_hashes_command_prints_the_table_entries_of_what_is_installed():
    """``python -m rankmesh.patches hashes`` prints, per dependency installed, its release's table
    entry: for a release the table has read it is the table's own, every path of it (so pasting the
    output for a new release is the whole edit)."""
    import re
    import subprocess
    import sys

    from rankmesh._dependencies import release_of
    from rankmesh._known import TABLES

    cmd = [sys.executable, "-W", "ignore", "-m", "rankmesh.patches", "hashes"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    printed = dict(re.findall(r'^            "([\w.]+)": "([0-9a-f]{16})",$', out.stdout, re.M))
    checked = 0
    for dependency, table in TABLES.items():
        release = release_of(dependency)
        if release is None:
            continue
        assert f'    "{release}": Release(' in out.stdout
        for path, digest in table[release].bodies.items():
            assert printed[path] == digest, (dependency, path)
            checked += 1
    assert checked >= 9
    bad = subprocess.run([sys.executable, "-m", "rankmesh.patches"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "usage: python -m rankmesh.patches hashes" in bad.stderr


def test_the_readme_table_renders_each_patchs_releases_from_the_table():
    """The README's "recognises" column is each patch's ``versions``, rendered from its gate: a new
    release pasted into the table and not into the README fails here."""
    from pathlib import Path

    readme = Path(__file__).resolve().parents[1] / "README.md"
    if not readme.is_file():
        pytest.skip("no README (an sdist)")
    rows = {line.split(" | ")[0][3:-1]: line for line in readme.read_text().splitlines() if line.startswith("| `")}
    for name, p in patches.REGISTRY.items():
        assert rows[name].endswith(f" | {p.versions} |"), (name, p.versions)
