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
        _patch.Patch("bogus", "os", "sep", lambda o: o, why="", versions="", code=_patch.KnownCode("torch", {}))


def _every_known_code() -> dict[str, _patch.KnownCode]:
    from rankmesh import _fast_groups_check, _torch_compat

    out = {f"patch {n}": p.code for n, p in patches.REGISTRY.items()}
    out |= {f"fast_groups {n}": c for n, c in _fast_groups_check.KNOWN_BODIES.items()}
    return out | {"self-check concatenate": _torch_compat.CONCATENATE_CODE}


def test_every_body_hash_is_kept_in_one_shape():
    """Per release read, ``{dotted path: {16 hex digits}}``; each release one of the dependency's."""
    from rankmesh._dependencies import DEPENDENCIES

    for what, code in _every_known_code().items():
        assert code.releases and all(DEPENDENCIES[code.dependency].supports(r) for r in code.releases), what
        for bodies in code.bodies.values():
            for path, hashes in bodies.items():
                assert path.count(".") >= 2 and isinstance(hashes, frozenset), (what, path)
                assert all(len(h) == 16 and int(h, 16) >= 0 for h in hashes), (what, path)


def test_a_release_the_dependency_does_not_list_is_refused():
    with pytest.raises(ValueError, match=r"torch \['3.0'\] is not among the releases"):
        _patch.KnownCode("torch", {"3.0": {}})


def test_the_installed_code_is_recognised_where_its_release_is_read():
    """Every patch, fast path and the self-check's ``_concatenate`` recognise the torch and frameworks
    installed here, unless their release is not one they read (torch 2.14 for the general patches,
    2.13 and 2.14 for the split_group path, a framework that is not installed)."""
    for what, code in _every_known_code().items():
        reason = code.recognise()
        if code.release() is not None:
            assert reason is None, (what, reason)
        else:
            assert reason is not None and ("is not a version" in reason or "is not installed" in reason), what


def test_an_unknown_disable_name_warns_once_and_the_known_ones_still_count(monkeypatch):
    monkeypatch.setattr(_once, "_seen", set())
    monkeypatch.setenv("RANKMESH_DISABLE", "fastgroups, concatenate")
    with pytest.warns(RuntimeWarning, match=r"names \['fastgroups'\], which rankmesh does not know"):
        assert _patch.disabled("concatenate")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not _patch.disabled("fast_groups")  # the typo disables nothing, and is said once
    monkeypatch.setenv("RANKMESH_DISABLE", "all")
    assert all(_patch.disabled(n) for n in _patch.SWITCHES)
    monkeypatch.delenv("RANKMESH_DISABLE")
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
    """``python -m rankmesh.patches hashes`` prints, per known code, the installed release's
    entries; for a release the table has read they are the table's own (so pasting the output for a
    new release is the whole edit)."""
    import re
    import subprocess
    import sys

    cmd = [sys.executable, "-W", "ignore", "-m", "rankmesh.patches", "hashes"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    printed = dict(re.findall(r'^    "([\w.]+)": frozenset\(\{"([0-9a-f]{16})"\}\),$', out.stdout, re.M))
    checked = 0
    for name, code in patches.known_code().items():
        release = code.release()
        if release is None:
            continue
        assert f"# {name}: {code.dependency} " in out.stdout
        for path, known in code.bodies[release].items():
            assert printed[path] in known, (name, path, printed[path], known)
            checked += 1
    assert checked >= 20
    bad = subprocess.run([sys.executable, "-m", "rankmesh.patches"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "usage: python -m rankmesh.patches hashes" in bad.stderr
