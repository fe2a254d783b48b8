"""The Python surface of ``rankmesh.MeshLayout``: array types, value semantics (==, hash,
pickle), the stable fingerprint, repr, the docstring examples, the type stubs, and a smoke test
at a million ranks."""

from __future__ import annotations

import ast
import doctest
import importlib.metadata
import inspect
import json
import os
import pickle
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import rankmesh
import rankmesh._native
import rankmesh.errors
import torch
from rankmesh import MeshLayout
from torch.distributed._mesh_layout import _FlatLayout, _MeshLayout

PINNED_FINGERPRINT = 2829958925554225088  # world 8 -> (dp=2, tp=4); same literal as rust/layout.rs
REVERSED_8 = [7, 6, 5, 4, 3, 2, 1, 0]


def dp_tp(rank_map=None) -> MeshLayout:
    return MeshLayout.world(8, rank_map).unflatten("world", (2, 4), ("dp", "tp"))


def example_layouts() -> list[MeshLayout]:
    """A few layouts of every kind: plain, with a rank map, sliced, non-adjacent flatten."""
    perm = np.random.default_rng(1).permutation(48)
    m = MeshLayout.world(48, perm).unflatten(0, (2, 2, 3, 4), ("pp", "dp", "cp", "tp"))
    return [
        dp_tp(),
        dp_tp(REVERSED_8),
        MeshLayout.world(1),
        m,
        m["dp", "tp"],
        m["pp", "cp"].flatten(),
        m["dp", "tp"].flatten("dp_tp").unflatten(0, (2, 2, 2), ("a", "b", "c")),
    ]


# ------------------------------------------------------------------------------ arrays


def assert_int32_array(a, shape):
    assert isinstance(a, np.ndarray)
    assert a.dtype == np.int32
    assert a.flags.c_contiguous
    assert a.shape == tuple(shape)
    t = torch.from_numpy(a)
    assert t.dtype == torch.int32 and tuple(t.shape) == tuple(shape)
    assert t.data_ptr() == a.ctypes.data  # shares the memory, no copy
    np.testing.assert_array_equal(t.numpy(), a)


@pytest.mark.parametrize("layout", example_layouts(), ids=repr)
def test_arrays_are_int32_c_contiguous(layout):
    assert_int32_array(layout.groups(), (layout.num_copies, *layout.shape))
    for rank in {0, layout.world_size - 1, layout.world_size // 2}:
        assert_int32_array(layout.mesh_of(rank), layout.shape)
        for d in range(layout.ndim):
            assert_int32_array(layout.group(rank, d), (layout.size(d),))
    rank_map = layout.rank_map()
    if rank_map is not None:
        assert_int32_array(rank_map, (layout.world_size,))


def test_arrays_are_fresh_copies_of_nothing_shared():
    """Each call returns a new array: writing to one does not change the layout."""
    m = dp_tp(REVERSED_8)
    g = m.groups()
    g[...] = -1
    assert m.groups().min() == 0
    r = m.rank_map()
    r[0] = 0
    assert m.rank_map().tolist() == REVERSED_8


def test_queries_accept_numpy_and_torch_ints_and_arrays():
    m = MeshLayout.world(8, torch.tensor(REVERSED_8)).unflatten(np.int64(0), (np.int32(2), 4), ["dp", "tp"])
    assert m == dp_tp(np.array(REVERSED_8, dtype=np.int16))
    assert m.group(np.int64(6), np.int8(1)).tolist() == m.group(6, "tp").tolist()
    assert m.coordinate_of(torch.tensor(6).item()) == m.coordinate_of(6)
    # rank maps may be any integer dtype and any strides
    assert MeshLayout.world(4, np.array([0, 1, 2, 3], dtype=np.uint8)) == MeshLayout.world(4)
    assert MeshLayout.world(4, np.arange(4)[::-1]) == MeshLayout.world(4, [3, 2, 1, 0])


# ------------------------------------------------------------------------------ accessors


def test_accessors():
    m = MeshLayout.world(48).unflatten(0, (2, 2, 3, 4), ("pp", "dp", "cp", "tp"))
    assert m.shape == (2, 2, 3, 4)
    assert m.names == ("pp", "dp", "cp", "tp")
    assert m.ndim == len(m) == 4
    assert m.world_size == 48
    assert m.size() == 48 and m.num_copies == 1
    assert [m.size(d) for d in range(4)] == [2, 2, 3, 4]
    assert m.size("cp") == m.size(2) == m.size(-2) == 3
    assert m.modes("pp") == [(2, 24)] and m.modes("tp") == [(4, 1)]
    assert m.rank_map() is None
    sub = m["dp", "tp"]
    assert sub.shape == (2, 4) and sub.num_copies == 6 and sub.size() == 8
    assert m["cp"] == m[("cp",)] == m[["cp"]]
    flat = m["pp", "cp"].flatten()
    assert flat.names == ("pp_cp",) and flat.modes(0) == [(2, 24), (3, 4)]
    assert m["pp", "cp"].flatten("pc").names == ("pc",)
    assert m.coordinate_of(47) == (1, 1, 2, 3)
    assert m.copy_index_of(47) == 0 and sub.copy_index_of(47) == 5


def test_layouts_are_immutable():
    m = dp_tp()
    with pytest.raises(AttributeError):
        m.shape = (8,)
    with pytest.raises(AttributeError):
        m.anything = 1
    m.unflatten("tp", (2, 2), ("a", "b"))
    m["dp"]
    m.flatten()
    assert m == dp_tp() and m.shape == (2, 4)
    with pytest.raises(TypeError):
        MeshLayout()


# ------------------------------------------------------------------------------ values


@pytest.mark.parametrize("layout", example_layouts(), ids=repr)
def test_pickle_round_trip(layout):
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(layout, protocol=protocol))
        assert back == layout
        assert hash(back) == hash(layout)
        assert back.fingerprint() == layout.fingerprint()
        assert repr(back) == repr(layout)
        np.testing.assert_array_equal(back.groups(), layout.groups())
        if layout.rank_map() is None:
            assert back.rank_map() is None
        else:
            np.testing.assert_array_equal(back.rank_map(), layout.rank_map())


def test_equality_and_hash():
    a, b = dp_tp(), dp_tp()
    assert a == b and not (a != b) and hash(a) == hash(b)
    assert len({a, b, dp_tp(REVERSED_8)}) == 2
    assert {a: 1}[b] == 1
    different = [
        dp_tp(REVERSED_8),
        MeshLayout.world(8).unflatten(0, (4, 2), ("dp", "tp")),
        MeshLayout.world(8).unflatten(0, (2, 4), ("dp", "cp")),
        MeshLayout.world(16).unflatten(0, (2, 4, 2), ("dp", "tp", "x"))["dp", "tp"],
        MeshLayout.world(8),
    ]
    for other in different:
        assert a != other and not (a == other)
        assert a.fingerprint() != other.fingerprint()
    assert a != "MeshLayout" and a != None  # noqa: E711
    assert a != 1


def test_identity_rank_map_is_no_rank_map():
    for identity in [list(range(8)), np.arange(8), torch.arange(8, dtype=torch.int32), range(8)]:
        m = dp_tp(identity)
        assert m == dp_tp()
        assert hash(m) == hash(dp_tp())
        assert m.fingerprint() == dp_tp().fingerprint() == PINNED_FINGERPRINT
        assert m.rank_map() is None
        assert repr(m) == repr(dp_tp())


def test_same_ops_in_another_order_give_equal_layouts():
    # the same (dp, tp) mesh reached through different op sequences compares and hashes equal
    direct = MeshLayout.world(16).unflatten(0, (2, 2, 4), ("pp", "dp", "tp"))["dp", "tp"]
    via_flatten = (
        MeshLayout.world(16)
        .unflatten(0, (2, 8), ("pp", "rest"))["rest"]
        .flatten("r")
        .unflatten(0, (2, 4), ("dp", "tp"))
    )
    assert direct == via_flatten
    assert direct.fingerprint() == via_flatten.fingerprint()


def test_fingerprint_is_pinned():
    assert dp_tp().fingerprint() == PINNED_FINGERPRINT
    assert hash(dp_tp()) == PINNED_FINGERPRINT  # small enough to be its own hash


def test_fingerprint_is_stable_across_processes():
    """Same layouts, fresh interpreters with other hash seeds: same fingerprints and hashes.
    (The script rebuilds the layouts from this module's source, without importing torch.)"""
    here = [[m.fingerprint(), hash(m)] for m in example_layouts()]
    assert len({f for f, _ in here}) == len(here)
    script = "\n".join(
        [
            "import json",
            "import numpy as np",
            "from rankmesh import MeshLayout",
            f"REVERSED_8 = {REVERSED_8!r}",
            inspect.getsource(dp_tp),
            inspect.getsource(example_layouts),
            "print(json.dumps([[m.fingerprint(), hash(m)] for m in example_layouts()]))",
        ]
    )
    for seed in ["0", "4242"]:
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True, timeout=120
        )
        assert json.loads(out.stdout) == here, seed


def test_repr():
    assert repr(dp_tp()) == "MeshLayout([dp=2 (2):(4), tp=4 (4):(1)], world_size=8)"
    assert repr(dp_tp(REVERSED_8)) == "MeshLayout([dp=2 (2):(4), tp=4 (4):(1)], world_size=8, rank_map=<permutation>)"
    ac = MeshLayout.world(18).unflatten(0, (2, 3, 3), ("a", "b", "c"))["a", "c"].flatten()
    assert repr(ac) == "MeshLayout([a_c=6 (2,3):(9,1)], world_size=18)"
    one = MeshLayout.world(4).unflatten(0, (1, 4), ("pp", "tp"))
    assert repr(one) == "MeshLayout([pp=1 ():(), tp=4 (4):(1)], world_size=4)"


# ------------------------------------------------------------------------------ threads


def test_concurrent_queries_agree():
    """Queries release the GIL; concurrent callers still see the same answers."""
    m = MeshLayout.world(4096, np.random.default_rng(3).permutation(4096)).unflatten(
        0, (4, 8, 16, 8), ("pp", "dp", "cp", "tp")
    )
    want = m["dp", "tp"].groups()
    results, errors = [], []

    def work():
        try:
            for _ in range(20):
                results.append(np.array_equal(m["dp", "tp"].groups(), want))
                results.append(m.group(4095, "cp").tolist() == m.group(4095, 2).tolist())
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(results) and len(results) == 160


# ------------------------------------------------------------------------------ a million ranks


def test_million_rank_smoke():
    w = 2**20
    perm = np.random.default_rng(2024).permutation(w)
    sizes = (16, 8, 128, 8, 8)
    names = ("pp", "dp_replicate", "fsdp", "cp", "tp")
    m = MeshLayout.world(w, perm).unflatten("world", sizes, names)
    assert m.shape == sizes and m.world_size == w and m.num_copies == 1
    rng = np.random.default_rng(7)
    ranks = [0, w - 1, *rng.integers(0, w, 16).tolist()]
    rank_map = torch.from_numpy(perm.astype(np.int32))

    subs = {name: m[name] for name in names}
    subs["dp_shard_cp"] = m["fsdp", "cp"].flatten("dp_shard_cp")
    subs["dp_cp"] = m["dp_replicate", "cp"].flatten("dp_cp")  # non-adjacent
    subs["dp_replicate,fsdp"] = m["dp_replicate", "fsdp"]
    for key, sub in subs.items():
        g = sub.groups()
        size = sub.size()
        assert g.shape == (w // size, *sub.shape) and g.dtype == np.int32
        flat = g.reshape(w // size, size)
        # a partition of the world: every rank exactly once
        seen = np.zeros(w, dtype=np.int64)
        np.add.at(seen, flat.ravel(), 1)
        assert (seen == 1).all(), key
        # torch's own layout code, fed our modes, gives the same groups
        axes = [_FlatLayout(*zip(*sub.modes(d))) if sub.modes(d) else _FlatLayout((1,), (1,)) for d in range(sub.ndim)]
        np.testing.assert_array_equal(g, _MeshLayout(axes).remap_to_tensor(rank_map).numpy())
        row_of = np.empty(w, dtype=np.int64)
        row_of[flat] = np.arange(flat.shape[0])[:, None]
        for r in ranks:
            row = row_of[r]
            assert sub.copy_index_of(r) == row
            np.testing.assert_array_equal(sub.mesh_of(r), g[row])
            if sub.ndim == 1:
                np.testing.assert_array_equal(sub.group(r, 0), flat[row])
    for r in ranks:
        local = m.mesh_of(r)
        coord = m.coordinate_of(r)
        assert local[coord] == r
        for d, name in enumerate(names):
            line = list(coord)
            line[d] = slice(None)
            np.testing.assert_array_equal(m.group(r, name), local[tuple(line)])
            np.testing.assert_array_equal(m.group(r, d), subs[name].mesh_of(r))


# ------------------------------------------------------------------------------ docs and stubs


@pytest.mark.parametrize("module", [rankmesh, rankmesh.errors], ids=lambda m: m.__name__)
def test_module_docstring_examples_run(module):
    result = doctest.testmod(module, verbose=False, report=True)
    assert result.attempted > 0, f"no examples found in {module.__name__}"
    assert result.failed == 0


STUB = Path(rankmesh.__file__).with_name("_native.pyi")


def _stub_tree() -> ast.Module:
    return ast.parse(STUB.read_text())


def test_stub_declares_exactly_what_the_extension_exports():
    tree = _stub_tree()
    top = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top.add(node.target.id)
    runtime = {n for n in dir(rankmesh._native) if not n.startswith("__")} | {"__version__"}
    assert top == runtime

    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MeshLayout"]
    declared = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    native = rankmesh._native.MeshLayout
    public = {n for n in vars(native) if not n.startswith("_")}
    assert public <= declared, public - declared
    for dunder in ["__getitem__", "__eq__", "__hash__", "__len__", "__repr__", "__reduce__"]:
        assert dunder in declared and hasattr(native, dunder)
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("__"):
            assert ast.get_docstring(node), f"{node.name} has no docstring in the stub"
    assert rankmesh._native.MAX_WORLD_SIZE == 2**31 - 1


def test_one_version_from_cargo_toml():
    """``rankmesh.__version__``, the extension's and the installed wheel's are Cargo.toml's."""
    cargo = Path(__file__).resolve().parents[1] / "Cargo.toml"
    package = cargo.read_text().split("[package]", 1)[1].split("\n[", 1)[0]
    version = re.search(r'^version = "([^"]+)"$', package, re.M).group(1)
    assert rankmesh.__version__ == rankmesh._native.__version__ == version
    assert importlib.metadata.version("rankmesh") == version  # maturin's PEP 440 spelling of a release
