"""The process groups behind the fast meshes: one per distinct partition, backend and dim name,
shared across meshes, torch's backend and description (helpers: tests/mesh_helpers.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the fake backend)
from rankmesh.mesh import init_device_mesh
from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh

from tests.conftest import FAKE, MESHFAKE, fake_world
from tests.mesh_helpers import (
    MESH_MARKS,
    assert_same_mesh,
    backend_name,
    ranks_of,
)

pytestmark = MESH_MARKS


def test_meshes_of_one_world_share_one_group_per_partition_and_name_across_unflattens():
    with fake_world(8, 5, MESHFAKE):
        world = init_device_mesh("cpu", (8,), mesh_dim_names=("world",))
        assert world.get_group() is dist.group.WORLD
        m1 = world._unflatten(0, (2, 4), ("dp", "tp"))
        m2 = world._unflatten(0, (2, 2, 2), ("a", "b", "c"), backend_override={"b": FAKE})
        m3 = world._unflatten(0, (1, 2, 4), ("x", "dp", "tp"))
        assert [ranks_of(m1.get_group(n)) for n in ("dp", "tp")] == [[1, 5], [4, 5, 6, 7]]
        assert [ranks_of(m2.get_group(n)) for n in ("a", "b", "c")] == [[1, 5], [5, 7], [4, 5]]
        # the same partition under the same name, whichever unflatten made the dim: one object
        assert m3.get_group("tp") is m1.get_group("tp") and m3.get_group("dp") is m1.get_group("dp")
        assert m1["dp", "tp"]["tp"].get_group() is m1.get_group("tp")
        # the same ranks under another name: a group of its own, as in torch (FSDP2 keys its
        # parameter groups by process group and needs one mesh per group)
        assert ranks_of(m2.get_group("a")) == ranks_of(m1.get_group("dp"))
        assert m2.get_group("a") is not m1.get_group("dp")
        bc = m2["b", "c"]._flatten("bc").get_group()
        assert ranks_of(bc) == ranks_of(m1.get_group("tp")) and bc is not m1.get_group("tp")
        assert m2["a", "b", "c"]._flatten("all").get_group() is dist.group.WORLD
        # b is fake; the real group of b's partition is another group
        assert backend_name(m2.get_group("b")) == FAKE
        again = world._unflatten(0, (2, 2, 2), ("a", "b", "c"))
        real_b = again.get_group("b")
        assert backend_name(real_b) == MESHFAKE and real_b is not m2.get_group("b")
        assert ranks_of(real_b) == [5, 7]
        assert again.get_group("a") is m2.get_group("a") and again.get_group("c") is m2.get_group("c")
        t01 = m1["tp"]._unflatten(0, (2, 2), ("t0", "t1"))
        assert ranks_of(t01.get_group("t0")) == [5, 7] and t01.get_group("t0") is not real_b
        # torch, for contrast, makes new groups for every unflatten
        t_world = torch_init_device_mesh("cpu", (8,), mesh_dim_names=("world",))
        t1 = t_world._unflatten(0, (2, 4), ("dp", "tp"))
        t3 = t_world._unflatten(0, (1, 2, 4), ("x", "dp", "tp"))
        assert ranks_of(t3.get_group("tp")) == ranks_of(m3.get_group("tp"))
        assert t3.get_group("tp") is not t1.get_group("tp")
        rep = world.build_report()
        assert rep.method == "new_group"
        # created: dp, tp (m1); a, b (fake), c (m2); x (fake, m3); bc; b (real); t0, t1. Served by
        # the default group: the root's world dim and the "all" flatten. Shared: m3's dp and tp,
        # the second unflatten's a and c.
        assert (rep.real, rep.fake, rep.reused_default) == (8, 2, 2)
        assert rep.dims == 1 + 2 + 3 + 1 + 1 + 3 + 3 + 2
        assert rep.shared == 4
        assert rep.by_backend == {MESHFAKE: 8, FAKE: 2}
        assert [g[:2] for g in rep.groups] == [
            ("dp", MESHFAKE),
            ("tp", MESHFAKE),
            ("a", MESHFAKE),
            ("b", FAKE),
            ("c", MESHFAKE),
            ("x", FAKE),
            ("bc", MESHFAKE),
            ("b", MESHFAKE),
            ("t0", MESHFAKE),
            ("t1", MESHFAKE),
        ]


def test_a_dim_overridden_to_fake_stays_fake_through_derivations():
    for rank in (0, 6):
        with fake_world(8, rank, MESHFAKE):
            o = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"), backend_override={"dp": FAKE})
            t = torch_init_device_mesh(
                "cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"), backend_override={"dp": FAKE}
            )
            assert backend_name(o.get_group("dp")) == FAKE
            for f in (lambda m: m["dp"], lambda m: m["dp", "tp"], lambda m: m["pp", "dp"]):
                assert_same_mesh(f(o), f(t), o, t)
                assert backend_name(f(o).get_group("dp")) == FAKE
            flat = o["dp", "tp"]._flatten("dp_tp", backend_override=FAKE)
            assert backend_name(flat.get_group()) == FAKE
            assert_same_mesh(flat, t["dp", "tp"]._flatten("dp_tp", backend_override=FAKE), o, t)
            u = flat._unflatten(0, (2, 2), ("x", "y"), backend_override={0: FAKE})
            assert [backend_name(u.get_group(i)) for i in range(2)] == [FAKE, MESHFAKE]


def test_build_report_counts_groups_by_backend():
    with fake_world(16, 9, MESHFAKE):
        o = init_device_mesh(
            "cpu", (2, 1, 2, 4), mesh_dim_names=("pp", "one", "dp", "tp"), backend_override={"pp": FAKE}
        )
        rep = o.build_report()
        assert rep.backend == MESHFAKE
        assert (rep.real, rep.fake, rep.reused_default, rep.shared, rep.dims) == (2, 2, 0, 0, 4)
        assert list(rep.groups) == [("pp", FAKE, 2), ("one", FAKE, 1), ("dp", MESHFAKE, 2), ("tp", MESHFAKE, 4)]
        assert rep.by_backend == {FAKE: 2, MESHFAKE: 2}
        o._unflatten("tp", (2, 2), ("t0", "t1"))
        o["dp", "tp"]._flatten()
        rep2 = o.build_report()
        assert rep2.dims == 4 + 2 + 1
        assert rep2.created == rep.created + 3  # t0, t1, dp_tp are new partitions
        o._unflatten("tp", (4,), ("tp2",))  # tp's partition again, under another name: its own group
        assert o.build_report().created == rep2.created + 1
        o["pp", "one", "dp"]._unflatten("dp", (2,), ("dp",))  # dp's partition and name again: shared
        assert o.build_report().shared == rep2.shared + 1
        assert o["dp"].build_report() == o.build_report()  # one report per world
