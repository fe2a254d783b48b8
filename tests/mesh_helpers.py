"""Shared helpers of the tests of rankmesh.mesh.FastDeviceMesh against torch's own DeviceMesh,
torch being the oracle (tests/test_mesh_*.py).

Every test builds one recipe twice in the same simulated world, once with torch
(``torch.distributed.device_mesh.init_device_mesh``, or ``DeviceMesh("cpu", rank_map.reshape(shape))``
when a rank map is given) and once with :func:`rankmesh.mesh.init_device_mesh`, and compares
everything torch exposes: the mesh tensor, shape, coordinates, local ranks, process-group ranks
and backends, ``_layout``, ``_rank_map``, ``_flatten_rank_map``, root structure, object identity
of derived meshes, ``==`` and ``hash`` (also across the two implementations), errors, pickling,
DTensor, FSDP2 and torch.compile.

Ranks are simulated on the fake backend: one process re-initialises the default group as rank 0,
the last rank and a random rank in turn.

Backends: in a world on the ``fake`` backend a dim overridden to ``"fake"`` and a dim on the
default backend are indistinguishable (``dist.get_backend``, ``_get_backend_name`` and the group
description are equal). So the property test runs its worlds on ``meshfake``, a backend registered
by tests/conftest.py that is the fake process group under another name: groups on the default backend report
``"meshfake"`` and overridden ones ``"fake"``.

No timing is asserted anywhere; speed is measured by the benchmarks.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the fake backend)
from rankmesh import _mesh_check
from rankmesh.mesh import FastDeviceMesh, init_device_mesh
from torch.distributed.device_mesh import DeviceMesh, _normalize_backend_override
from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh

from tests.conftest import FAKE

MESH_MARKS = [
    pytest.mark.skipif(
        not _mesh_check.fast_meshes_available(),
        reason=f"rankmesh falls back to torch's own DeviceMesh on torch {torch.__version__}",
    ),
    # torch deprecates slicing a flattened dim from the root; the property test does it on purpose.
    pytest.mark.filterwarnings("ignore:Slicing a flattened dim from root mesh"),
]


def ranks_of(pg) -> list[int]:
    return dist.get_process_group_ranks(pg)


def outcome(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), None)``, or ``(None, the exception)``: one call's result or error,
    to compare with the other implementation's."""
    try:
        return fn(*args, **kwargs), None
    except Exception as e:  # noqa: BLE001 - compared with the other side's outcome
        return None, e


def sampled_ranks(world_size: int, rnd: int) -> list[int]:
    """The first, the last and a random rank."""
    return sorted({0, world_size - 1, rnd % world_size})


def build_both(shape, names=None, rank_map=None, backend_override=None, rank_map_form=list):
    """The same root mesh from torch and from rankmesh, in the current world."""
    bo = None if backend_override is None else dict(backend_override)
    if rank_map is None:
        theirs = torch_init_device_mesh("cpu", tuple(shape), mesh_dim_names=names, backend_override=bo)
    else:
        norm = None if bo is None else tuple(_normalize_backend_override(dict(bo), len(shape), names))
        theirs = DeviceMesh(
            "cpu",
            torch.tensor(list(rank_map), dtype=torch.int).reshape(tuple(shape)),
            mesh_dim_names=names,
            backend_override=norm,
        )
    rm = None if rank_map is None else rank_map_form(list(rank_map))
    ours = init_device_mesh(
        "cpu",
        tuple(shape),
        mesh_dim_names=names,
        backend_override=None if backend_override is None else dict(backend_override),
        rank_map=rm,
    )
    return ours, theirs


def backend_name(pg) -> str:
    return str(dist.get_backend(pg))


def assert_same_group(pg, tpg, world_size: int) -> None:
    assert ranks_of(pg) == ranks_of(tpg)
    # rankmesh serves every size-1 dim of a multi-rank world with a fake group (it never
    # communicates); torch uses the default backend there. Everywhere else: torch's backend.
    want = FAKE if pg.size() == 1 and world_size > 1 else backend_name(tpg)
    assert backend_name(pg) == want, (ranks_of(pg), backend_name(pg), backend_name(tpg))


def assert_same_mesh(ours, theirs, our_root, their_root) -> None:
    """Everything torch exposes about a mesh, ours against torch's, on this rank."""
    assert type(ours) is FastDeviceMesh and isinstance(ours, DeviceMesh)
    assert type(theirs) is DeviceMesh
    world_size = dist.get_world_size()
    assert ours.device_type == theirs.device_type
    assert ours.mesh.dtype == theirs.mesh.dtype
    assert ours.mesh.tolist() == theirs.mesh.tolist()
    assert ours.shape == theirs.shape
    assert ours.ndim == theirs.ndim
    assert ours.size() == theirs.size()
    assert ours.mesh_dim_names == theirs.mesh_dim_names
    assert ours.get_coordinate() == theirs.get_coordinate()
    assert ours._is_current_rank_part_of_mesh() == theirs._is_current_rank_part_of_mesh()
    assert repr(ours) == repr(theirs)
    assert ours._layout == theirs._layout
    assert ours._rank_map.tolist() == theirs._rank_map.tolist()
    assert ours._flatten_rank_map == theirs._flatten_rank_map
    assert ours._get_root_mesh() is our_root
    assert theirs._get_root_mesh() is their_root
    assert len(ours._dim_group_names) == len(theirs._dim_group_names) == ours.ndim
    for i in range(ours.ndim):
        assert ours.size(i) == theirs.size(i)
        assert ours.get_local_rank(i) == theirs.get_local_rank(i)
        pg = ours.get_group(i)
        assert_same_group(pg, theirs.get_group(i), world_size)
        if ours.mesh_dim_names:
            name = ours.mesh_dim_names[i]
            by_name = ours.get_group(name)
            # torch looks a name up in the root's flattened dims first (a flatten may reuse the
            # name of a dim of a derived mesh): the same lookup on both sides
            assert_same_group(by_name, theirs.get_group(name), world_size)
            if name not in our_root._flatten_mapping:
                assert by_name is pg
            assert ours.get_local_rank(name) == theirs.get_local_rank(name)
    if ours.ndim == 1:
        assert ours.get_group() is ours.get_group(0)
        assert ours.get_local_rank() == theirs.get_local_rank()
    assert [ranks_of(g) for g in ours.get_all_groups()] == [ranks_of(g) for g in theirs.get_all_groups()]
    # torch's semantics: equal, in both directions, with the same hash.
    assert ours == theirs and theirs == ours
    assert not (ours != theirs) and not (theirs != ours)
    assert hash(ours) == hash(theirs)


def assert_same_relations(pairs) -> None:
    """Equality and identity among all meshes derived so far agree with torch's; our groups are
    one per distinct (ranks, backend, dim name)."""
    for i, (o1, t1) in enumerate(pairs):
        for o2, t2 in pairs[i + 1 :]:
            assert (o1 == o2) == (t1 == t2)
            assert (o1 == t2) == (t1 == t2)
            assert (o1 is o2) == (t1 is t2)
            if o1 == o2:
                assert hash(o1) == hash(o2)
    by_key: dict = {}
    for o, _ in pairs:
        for i in range(o.ndim):
            pg = o.get_group(i)
            key = (tuple(ranks_of(pg)), backend_name(pg), pg.group_desc)  # desc: mesh_<dim name>
            assert by_key.setdefault(key, pg) is pg, key
    assert len({id(pg) for pg in by_key.values()}) == len(by_key)
