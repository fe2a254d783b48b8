"""Every malformed input caught: a battery of bad arguments to the Python layer, each asserting
the exact rankmesh class, ``e.field`` and ``e.value`` (the offending object itself), and, over a
cross product of garbage values and argument slots, that nothing untyped escapes (no
AttributeError, OverflowError, bare TypeError or ValueError that is not a RankmeshError).

Classes (numbered as in the issue "every malformed input caught"):

2. ``check_consistency``: fingerprints that are not integers or do not fit in 64 bits, timeouts
   that are not durations, groups that are not process groups; checked before communicating.
3. silent conversions: floats, bools and strings where an int (rank, degree, size, dim,
   ``gpus_per_node``, members) or a flag is needed; ``LOCAL_WORLD_SIZE`` that is not digits.
5. a constructor or function given something that is not a ``MeshLayout`` where one is needed.
M. the ``DeviceMesh`` layer: ``init_device_mesh``, ``_unflatten``, ``_flatten``, slicing,
   ``backend_override``.
"""

from __future__ import annotations

import datetime
import math

import numpy as np
import pytest
import torch
import torch.distributed as dist
from rankmesh import MeshLayout
from rankmesh._groups import group_key
from rankmesh.consistency import check_consistency
from rankmesh.errors import (
    ArgumentTypeError,
    DimOutOfRangeError,
    DistributedStateError,
    InvalidRankMapError,
    InvalidSizeError,
    InvalidTimeoutError,
    LayoutOverflowError,
    MeshArgumentError,
    RankmeshError,
    RankOutOfRangeError,
    TopologyError,
    UnknownNameError,
)
from rankmesh.megatron import RankGenerator, groups
from rankmesh.mesh import FastDeviceMesh, _World, init_device_mesh
from rankmesh.process_groups import MeshBuilder
from rankmesh.single import SingleMesh, get_dp_info, get_dp_mesh, single_mesh
from rankmesh.topology import gpus_per_node_from_env, topology_report

from tests.conftest import FAKE, fake_world

pytestmark = pytest.mark.filterwarnings("ignore:Slicing a flattened dim from root mesh")

ANY = object()  # a field or value this test does not pin (e.g. the Rust core's wording of a dim)
NAN = float("nan")
OBJ = object()
HUGE = 10**400  # an int beyond float's range
W, RANK = 8, 3


def _same(got, want) -> bool:
    """The offending object itself: identical, or equal and of the same type."""
    if want is ANY or got is want:
        return True
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    if type(got) is not type(want):
        return False
    try:
        return bool(got == want)
    except Exception:  # e.g. an array's ambiguous truth value
        return False


def expect(fn, cls, field, value):
    with pytest.raises(Exception) as ei:
        fn()
    e = ei.value
    assert type(e) is cls, f"{type(e).__name__}: {e}"
    assert isinstance(e, RankmeshError)
    assert field is ANY or e.field == field, (e.field, str(e))
    assert _same(e.value, value), (e.value, value)
    msg = str(e)
    assert msg and msg != str(value)  # a message that says what to do, not just the value
    return e


LAYOUT = MeshLayout.world(W).unflatten("world", (2, 4), ("dp", "tp"))


# -- 2. check_consistency -------------------------------------------------------------------------

BAD_FINGERPRINT_TYPES = [1.5, 1.9, 2.0, np.float64(3.0), True, False, "7", b"7", None, [1], OBJ, torch.tensor(1.5)]
BAD_FINGERPRINT_RANGE = [2**64, 2**64 + 1, -1, -(2**63), 2**100]
BAD_TIMEOUT_TYPES = ["300", b"1", True, False, np.True_, None, [1], OBJ, 1j]
BAD_TIMEOUT_VALUES = [
    0,
    0.0,
    -1,
    -0.5,
    NAN,
    math.inf,
    -math.inf,
    1e-4,  # below c10d's 1 ms resolution (0 ms reads as "no timeout")
    HUGE,
    1e300,  # beyond timedelta.max
    np.float64(-2.0),
    datetime.timedelta(0),
    datetime.timedelta(seconds=-1),
    datetime.timedelta(microseconds=500),
]
BAD_GROUPS = ["world", 0, -100, OBJ, [None], 1.0]


@pytest.mark.parametrize("fp", BAD_FINGERPRINT_TYPES, ids=repr)
def test_fingerprint_that_is_not_an_integer(small_world, fp):
    expect(lambda: check_consistency(fp), ArgumentTypeError, "fingerprint", fp)


@pytest.mark.parametrize("fp", BAD_FINGERPRINT_RANGE, ids=repr)
def test_fingerprint_outside_64_bits(small_world, fp):
    expect(lambda: check_consistency(fp), LayoutOverflowError, "fingerprint", fp)


@pytest.mark.parametrize("timeout", BAD_TIMEOUT_TYPES, ids=repr)
def test_timeout_of_the_wrong_type(small_world, timeout):
    expect(lambda: check_consistency(1, timeout=timeout), ArgumentTypeError, "timeout", timeout)


@pytest.mark.parametrize("timeout", BAD_TIMEOUT_VALUES, ids=repr)
def test_timeout_that_is_no_usable_duration(small_world, timeout):
    expect(lambda: check_consistency(1, timeout=timeout), InvalidTimeoutError, "timeout", timeout)


@pytest.mark.parametrize("group", BAD_GROUPS, ids=repr)
def test_group_that_is_not_a_process_group(small_world, group):
    e = expect(lambda: check_consistency(1, group=group), ArgumentTypeError, "group", group)
    if group == -100:
        assert "not in the group" in str(e)  # GroupMember.NON_GROUP_MEMBER


@pytest.mark.parametrize("timeout", [5, 0.5, np.float32(2.0), datetime.timedelta(seconds=3), 10**6])
def test_good_timeouts_and_groups_pass(small_world, timeout):
    check_consistency(2**64 - 1, timeout=timeout)
    check_consistency(np.uint64(7), group=dist.group.WORLD, timeout=timeout)


def test_arguments_are_checked_before_any_communication(monkeypatch):
    # No default group at all: the argument is still the error, on this rank.
    expect(lambda: check_consistency(1.5), ArgumentTypeError, "fingerprint", 1.5)
    with fake_world(W, RANK):

        def all_reduce(*a, **k):  # pragma: no cover - must not be reached
            raise AssertionError("communicated before checking the arguments")

        monkeypatch.setattr(dist, "all_reduce", all_reduce)
        expect(lambda: check_consistency(1, timeout=0), InvalidTimeoutError, "timeout", 0)
        expect(lambda: check_consistency(1, group="x"), ArgumentTypeError, "group", "x")


# -- 3. silent conversions: ints, flags, LOCAL_WORLD_SIZE --------------------------------------------

NOT_INTS = [2.0, 1.5, np.float64(2.0), True, False, np.True_, "2", b"2", None, OBJ, [2]]
NOT_INTS_NOR_NONE = [v for v in NOT_INTS if v is not None]
NOT_FLAGS = ["yes", "", 1, 0, 1.0, None, OBJ]
DEGREES = ["world_size", "pp", "dp_replicate", "dp_shard", "ep", "tp", "cp"]


@pytest.mark.parametrize("degree", DEGREES)
@pytest.mark.parametrize("bad", NOT_INTS_NOR_NONE + [None], ids=repr)
def test_single_mesh_degree_that_is_not_an_int(degree, bad):
    kw = {"world_size": 8} | {degree: bad}
    expect(lambda: single_mesh(**kw), ArgumentTypeError, degree, bad)


@pytest.mark.parametrize(
    "degree, bad",
    [(d, b) for d in DEGREES for b in (0, -2, -1, np.int64(-5)) if not (d == "dp_shard" and b == -1)],  # -1: auto
    ids=repr,
)
def test_single_mesh_degree_below_one(degree, bad):
    kw = {"world_size": 8} | {degree: bad}
    expect(lambda: single_mesh(**kw), InvalidSizeError, degree, int(bad))


@pytest.mark.parametrize("bad", NOT_INTS_NOR_NONE, ids=repr)
def test_gpus_per_node_that_is_not_an_int(bad):
    expect(lambda: topology_report(LAYOUT, rank=0, gpus_per_node=bad), ArgumentTypeError, "gpus_per_node", bad)
    hosts = ["a"] * 4 + ["b"] * 4
    expect(
        lambda: topology_report(LAYOUT, rank=0, gpus_per_node=bad, hostnames=hosts),
        ArgumentTypeError,
        "gpus_per_node",
        bad,
    )


@pytest.mark.parametrize("bad", [0, -8, np.int32(-1)], ids=repr)
def test_gpus_per_node_below_one(bad):
    expect(lambda: topology_report(LAYOUT, rank=0, gpus_per_node=bad), InvalidSizeError, "gpus_per_node", int(bad))


@pytest.mark.parametrize("bad", NOT_INTS, ids=repr)
def test_topology_rank_that_is_not_an_int(bad):
    expect(lambda: topology_report(LAYOUT, rank=bad, gpus_per_node=4), ArgumentTypeError, "rank", bad)


@pytest.mark.parametrize("bad", [-1, 8, 2**40], ids=repr)
def test_topology_rank_outside_the_world(bad):
    expect(lambda: topology_report(LAYOUT, rank=bad, gpus_per_node=4), RankOutOfRangeError, "rank", bad)


@pytest.mark.parametrize("flag", ["whole_world", "strict"])
@pytest.mark.parametrize("bad", NOT_FLAGS, ids=repr)
def test_topology_flags_are_bools(flag, bad):
    expect(lambda: topology_report(LAYOUT, rank=0, gpus_per_node=4, **{flag: bad}), ArgumentTypeError, flag, bad)


def _strict_report(strict_dims):
    return topology_report(LAYOUT, rank=0, gpus_per_node=4, strict=True, strict_dims=strict_dims)


@pytest.mark.parametrize(
    "strict_dims, cls, field, value",
    [
        ("cp", ArgumentTypeError, "strict_dims", "cp"),  # one str is not a sequence of families
        (5, ArgumentTypeError, "strict_dims", 5),
        ((1,), ArgumentTypeError, "strict_dims[0]", 1),
        (("cp", None), ArgumentTypeError, "strict_dims[1]", None),
        (("xx",), UnknownNameError, "strict_dims", "xx"),
    ],
    ids=repr,
)
def test_topology_strict_dims(strict_dims, cls, field, value):
    expect(lambda: _strict_report(strict_dims), cls, field, value)


BAD_LOCAL_WORLD_SIZES = ["", " ", "abc", "1.5", "0", "00", "-3", " 8 ", "8 ", "\t8", "+8", "0x10", "8_0", "\u0668"]
BAD_LOCAL_WORLD_SIZES += ["1e3", "8\n", "८"]  # an exponent, a newline, a Devanagari digit


@pytest.mark.parametrize("raw", BAD_LOCAL_WORLD_SIZES, ids=repr)
def test_local_world_size_that_is_not_a_count(monkeypatch, raw):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", raw)
    expect(gpus_per_node_from_env, TopologyError, "LOCAL_WORLD_SIZE", raw)
    # topology_report reads it through the same function
    expect(lambda: topology_report(LAYOUT, rank=0), TopologyError, "LOCAL_WORLD_SIZE", raw)


def test_local_world_size_digits_and_unset(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert gpus_per_node_from_env() == 8
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert gpus_per_node_from_env() is None
    expect(lambda: topology_report(LAYOUT, rank=0), TopologyError, "gpus_per_node", None)


@pytest.mark.parametrize("bad", NOT_INTS_NOR_NONE, ids=repr)
def test_builder_rank_that_is_not_an_int(small_world, bad):
    expect(lambda: MeshBuilder(MeshLayout.world(W), rank=bad), ArgumentTypeError, "rank", bad)


def test_builder_rank_of_another_process(small_world):
    expect(lambda: MeshBuilder(MeshLayout.world(W), rank=4), DistributedStateError, "rank", 4)


@pytest.mark.parametrize("bad", NOT_FLAGS, ids=repr)
def test_builder_size_one_fake_is_a_bool(small_world, bad):
    expect(lambda: MeshBuilder(MeshLayout.world(W), size_one_fake=bad), ArgumentTypeError, "size_one_fake", bad)
    expect(lambda: init_device_mesh("cpu", (8,), size_one_fake=bad), ArgumentTypeError, "size_one_fake", bad)


@pytest.mark.parametrize("bad", [1, None, b"cpu", OBJ], ids=repr)
def test_builder_device_type_is_a_str(small_world, bad):
    expect(lambda: MeshBuilder(MeshLayout.world(W), device_type=bad), ArgumentTypeError, "device_type", bad)


@pytest.mark.parametrize(
    "members, cls, field, value",
    [
        ([3, 4.0], ArgumentTypeError, "members[1]", 4.0),
        ([3, True], ArgumentTypeError, "members[1]", True),
        (["3"], ArgumentTypeError, "members[0]", "3"),
        ([3, None], ArgumentTypeError, "members[1]", None),
        ("34", ArgumentTypeError, "members", "34"),
        (3, ArgumentTypeError, "members", 3),
        ([3, 8], RankOutOfRangeError, "members[1]", 8),
        ([-1, 3], RankOutOfRangeError, "members[0]", -1),
        ([0, 1], DistributedStateError, "members", [0, 1]),  # leaves this rank out
    ],
    ids=repr,
)
def test_subset_group_members(small_world, members, cls, field, value):
    expect(lambda: small_world["builder"].subset_group("p", members, name="x"), cls, field, value)


def test_subset_group_members_listing_a_rank_twice(small_world):
    members = [3, 3, 4]
    b = small_world["builder"]
    e = expect(lambda: b.subset_group("p", members, name="x"), DistributedStateError, "members", members)
    assert e.value is members and "twice" in str(e)


@pytest.mark.parametrize(
    "kwargs, cls, field, value",
    [
        (dict(partition=["not", "hashable"]), ArgumentTypeError, "partition", ["not", "hashable"]),
        (dict(name=5), ArgumentTypeError, "name", 5),
        (dict(backend=5), ArgumentTypeError, "backend", 5),
        (dict(group_desc=5), ArgumentTypeError, "group_desc", 5),
        (dict(tag=b"t"), ArgumentTypeError, "tag", b"t"),
        (dict(timeout="10"), ArgumentTypeError, "timeout", "10"),
        (dict(timeout=True), ArgumentTypeError, "timeout", True),
        (dict(timeout=0), InvalidTimeoutError, "timeout", 0),
        (dict(timeout=NAN), InvalidTimeoutError, "timeout", NAN),
        (dict(timeout=datetime.timedelta(seconds=-5)), InvalidTimeoutError, "timeout", datetime.timedelta(seconds=-5)),
    ],
    ids=repr,
)
def test_subset_group_arguments(small_world, kwargs, cls, field, value):
    kw = {"partition": "p", "name": "x"} | kwargs
    partition = kw.pop("partition")
    expect(lambda: small_world["builder"].subset_group(partition, [3, 4], **kw), cls, field, value)


@pytest.mark.parametrize(
    "dim, kwargs, cls, field, value",
    [
        (1.0, {}, ArgumentTypeError, "dim", 1.0),
        (True, {}, ArgumentTypeError, "dim", True),
        (None, {}, ArgumentTypeError, "dim", None),
        (b"tp", {}, ArgumentTypeError, "dim", b"tp"),
        ("tp", dict(fake="yes"), ArgumentTypeError, "fake", "yes"),
        ("tp", dict(fake=1), ArgumentTypeError, "fake", 1),
        ("tp", dict(timeout=-1), InvalidTimeoutError, "timeout", -1),
        ("tp", dict(timeout=math.inf), InvalidTimeoutError, "timeout", math.inf),
        ("tp", dict(timeout="1"), ArgumentTypeError, "timeout", "1"),
        ("tp", dict(backend=1), ArgumentTypeError, "backend", 1),
        ("tp", dict(backend="nosuch"), MeshArgumentError, "backend", "nosuch"),
    ],
    ids=repr,
)
def test_process_group_arguments(small_world, dim, kwargs, cls, field, value):
    expect(lambda: small_world["builder"].process_group(small_world["layout"], dim, **kwargs), cls, field, value)


def test_process_group_timeout_in_seconds_equals_the_timedelta(small_world):
    b, lay = small_world["builder"], small_world["layout"]
    pg = b.process_group(lay, "tp", timeout=30)
    assert b.process_group(lay, "tp", timeout=datetime.timedelta(seconds=30)) is pg


@pytest.mark.parametrize(
    "fake_dims, cls, field, value",
    [
        ("tp", ArgumentTypeError, "fake_dims", "tp"),  # one str is not a sequence of dims
        (1, ArgumentTypeError, "fake_dims", 1),
        ([1.0], ArgumentTypeError, "fake_dims[0]", 1.0),
        ([0, True], ArgumentTypeError, "fake_dims[1]", True),
        ([None], ArgumentTypeError, "fake_dims[0]", None),
        (["pp"], UnknownNameError, "fake_dims", "pp"),
        ([5], DimOutOfRangeError, ANY, ANY),
    ],
    ids=repr,
)
def test_device_mesh_fake_dims(small_world, fake_dims, cls, field, value):
    builder, layout = small_world["builder"], small_world["layout"]
    expect(lambda: FastDeviceMesh.from_layout(builder, layout, fake_dims=fake_dims), cls, field, value)
    if cls is ArgumentTypeError:  # megatron's face passes them on unchanged (no tuple("tp"))
        g = RankGenerator(tp=4, ep=1, dp=2, pp=1, cp=1, order="tp-dp")
        expect(lambda: groups.device_mesh(g, ["dp", "tp"], builder, fake_dims=fake_dims), cls, field, value)


# -- 5. a MeshLayout where one is needed -------------------------------------------------------------

NOT_LAYOUTS = ["world", 8, None, np.arange(8), [0, 1, 2, 3], OBJ]


@pytest.mark.parametrize("bad", NOT_LAYOUTS, ids=lambda v: type(v).__name__)
def test_layout_arguments(small_world, bad):
    b = small_world["builder"]
    expect(lambda: MeshBuilder(bad), ArgumentTypeError, "world", bad)
    expect(lambda: b.process_group(bad, 0), ArgumentTypeError, "layout", bad)
    expect(lambda: FastDeviceMesh.from_layout(b, bad), ArgumentTypeError, "layout", bad)
    expect(lambda: _World(bad, 0, None), ArgumentTypeError, "layout", bad)
    expect(lambda: group_key(bad, 0, world_size=8), ArgumentTypeError, "layout", bad)
    expect(lambda: topology_report({"a": bad}, rank=0, gpus_per_node=4), ArgumentTypeError, "meshes['a']", bad)
    kw = dict(world_size=8, pp=1, dp_replicate=1, dp_shard=8, ep=1, tp=1, names=("dp_shard",), shape=(8,))
    expect(lambda: SingleMesh(layout=bad, **kw), ArgumentTypeError, "layout", bad)
    if bad is not None:
        expect(lambda: topology_report(bad, rank=0, gpus_per_node=4), ArgumentTypeError, "meshes", bad)
        expect(lambda: get_dp_mesh(bad), ArgumentTypeError, "mesh", bad)
        expect(lambda: get_dp_info(bad, rank=0), ArgumentTypeError, "mesh", bad)


def test_layout_arguments_without_a_world():
    # the type is checked before the state of torch.distributed
    expect(lambda: MeshBuilder("world"), ArgumentTypeError, "world", "world")


@pytest.mark.parametrize(
    "meshes, cls, field, value",
    [
        ({1: LAYOUT}, ArgumentTypeError, "meshes", 1),  # labels are str
        ({}, TopologyError, "meshes", {}),
        ({"a": LAYOUT, "b": MeshLayout.world(16)}, TopologyError, "meshes", ANY),
    ],
    ids=["int label", "empty", "two worlds"],
)
def test_topology_meshes(meshes, cls, field, value):
    expect(lambda: topology_report(meshes, rank=0, gpus_per_node=4), cls, field, value)


@pytest.mark.parametrize(
    "hostnames, cls, field, value",
    [
        ("abcdefgh", ArgumentTypeError, "hostnames", "abcdefgh"),
        (8, ArgumentTypeError, "hostnames", 8),
        (["a"] * 7 + [1], ArgumentTypeError, "hostnames[7]", 1),
        ([], TopologyError, "hostnames", []),
        (["a"] * 5 + ["b"] * 3, TopologyError, "hostnames", ["a"] * 5 + ["b"] * 3),
        (["a"] * 4, TopologyError, "hostnames", ["a"] * 4),  # not one per rank
    ],
    ids=["str", "int", "non-str host", "empty", "uneven", "too few"],
)
def test_topology_hostnames(hostnames, cls, field, value):
    expect(lambda: topology_report(LAYOUT, rank=0, hostnames=hostnames), cls, field, value)


def test_single_helpers(small_world):
    sm = single_mesh(8, dp_replicate=2, tp=4)
    expect(lambda: get_dp_info(sm.layout), ArgumentTypeError, "rank", None)
    expect(lambda: get_dp_info(sm.layout, rank=1.0), ArgumentTypeError, "rank", 1.0)
    expect(lambda: get_dp_info(sm, rank=8), RankOutOfRangeError, "rank", 8)
    expect(lambda: FastDeviceMesh.from_layout("builder", sm.layout), ArgumentTypeError, "builder", "builder")
    dm = FastDeviceMesh.from_layout(small_world["builder"], sm.layout)
    expect(lambda: get_dp_info(dm, rank=5), DistributedStateError, "rank", 5)
    expect(lambda: get_dp_info(dm, rank=3.0), ArgumentTypeError, "rank", 3.0)
    assert get_dp_info(dm, rank=3) == get_dp_info(sm, rank=3)
    expect(lambda: get_dp_mesh(torch.zeros(1)), ArgumentTypeError, "mesh", ANY)


# -- M. the DeviceMesh layer ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, kwargs, cls, field, value",
    [
        ((1, (8,)), {}, ArgumentTypeError, "device_type", 1),
        ((None, (8,)), {}, ArgumentTypeError, "device_type", None),
        (("cuda:0", (8,)), {}, MeshArgumentError, "device_type", "cuda:0"),
        (("cpu", 8), {}, ArgumentTypeError, "mesh_shape", 8),
        (("cpu", "8"), {}, ArgumentTypeError, "mesh_shape", "8"),
        (("cpu", None), {}, ArgumentTypeError, "mesh_shape", None),
        (("cpu", (2, 4.0)), {}, ArgumentTypeError, "mesh_shape[1]", 4.0),
        (("cpu", (True, 8)), {}, ArgumentTypeError, "mesh_shape[0]", True),
        (("cpu", ("2", 4)), {}, ArgumentTypeError, "mesh_shape[0]", "2"),
        (("cpu", (2, None)), {}, ArgumentTypeError, "mesh_shape[1]", None),
        (("cpu", (np.float64(2), 4)), {}, ArgumentTypeError, "mesh_shape[0]", np.float64(2)),
        (("cpu", (0, 8)), {}, InvalidSizeError, "mesh_shape[0]", 0),
        (("cpu", (8, -1)), {}, InvalidSizeError, "mesh_shape[1]", -1),
        (("cpu", (2, 4)), dict(mesh_dim_names="ab"), ArgumentTypeError, "mesh_dim_names", "ab"),
        (("cpu", (2, 4)), dict(mesh_dim_names=5), ArgumentTypeError, "mesh_dim_names", 5),
        (("cpu", (2, 4)), dict(mesh_dim_names=(1, "b")), ArgumentTypeError, "mesh_dim_names[0]", 1),
        (("cpu", (2, 4)), dict(mesh_dim_names=("a", None)), ArgumentTypeError, "mesh_dim_names[1]", None),
        (("cpu", (2, 4)), dict(backend_override=[(FAKE, None)]), ArgumentTypeError, "backend_override", [(FAKE, None)]),
        (("cpu", (2, 4)), dict(backend_override=FAKE), ArgumentTypeError, "backend_override", FAKE),
        (("cpu", (2, 4)), dict(backend_override={0: 3}), ArgumentTypeError, "backend_override[0]", 3),
        (("cpu", (2, 4)), dict(backend_override={0: (FAKE, 3)}), ArgumentTypeError, "backend_override[0]", (FAKE, 3)),
        (("cpu", (2, 4)), dict(backend_override={0: [FAKE]}), ArgumentTypeError, "backend_override[0]", [FAKE]),
        (("cpu", (2, 4)), dict(backend_override={1.0: FAKE}), ArgumentTypeError, "backend_override", 1.0),
        (("cpu", (2, 4)), dict(backend_override={True: FAKE}), ArgumentTypeError, "backend_override", True),
        (("cpu", (2, 4)), dict(backend_override={None: FAKE}), ArgumentTypeError, "backend_override", None),
        (("cpu", (2, 4)), dict(backend_override={2: FAKE}), MeshArgumentError, "backend_override", {2: FAKE}),
        (("cpu", (2, 4)), dict(backend_override={0: "nosuch"}), MeshArgumentError, "backend_override[0]", "nosuch"),
        (("cpu", (2, 4)), dict(backend_override={0: ("", None)}), MeshArgumentError, "backend_override[0]", ""),
        (
            ("cpu", (2, 4)),
            dict(mesh_dim_names=("a", "b"), backend_override={"c": FAKE}),
            MeshArgumentError,
            "backend_override",
            {"c": FAKE},
        ),
        # rank maps are checked by the Rust core, by the same rule (value: the offending entry)
        (("cpu", (2, 4)), dict(rank_map="abcdefgh"), ArgumentTypeError, "rank_map", "abcdefgh"),
        (("cpu", (2, 4)), dict(rank_map=5), ArgumentTypeError, "rank_map", 5),
        (("cpu", (2, 4)), dict(rank_map=[0.0, 1, 2, 3, 4, 5, 6, 7]), ArgumentTypeError, "rank_map", 0.0),
        (("cpu", (2, 4)), dict(rank_map=[True] * 8), ArgumentTypeError, "rank_map", True),
        (("cpu", (2, 4)), dict(rank_map=torch.arange(8.0)), ArgumentTypeError, "rank_map", ANY),
        (("cpu", (2, 4)), dict(rank_map=[0, 0, 1, 2, 3, 4, 5, 6]), InvalidRankMapError, "rank_map", ANY),
        (("cpu", (2, 4)), dict(rank_map=[1, 2, 3, 4, 5, 6, 7, 8]), InvalidRankMapError, "rank_map", ANY),
        (("cpu", (2, 4)), dict(rank_map=[0, 1, 2]), InvalidRankMapError, "rank_map", ANY),
    ],
    ids=repr,
)
def test_init_device_mesh_arguments(small_world, args, kwargs, cls, field, value):
    expect(lambda: init_device_mesh(*args, **kwargs), cls, field, value)


@pytest.mark.parametrize(
    "args, kwargs, cls, field, value",
    [
        ((1.0, (2, 2), ("x", "y")), {}, ArgumentTypeError, "dim", 1.0),
        ((True, (2, 2), ("x", "y")), {}, ArgumentTypeError, "dim", True),
        ((None, (2, 2), ("x", "y")), {}, ArgumentTypeError, "dim", None),
        ((2, (2, 2), ("x", "y")), {}, DimOutOfRangeError, "dim", 2),
        ((-1, (2, 2), ("x", "y")), {}, DimOutOfRangeError, "dim", -1),
        (("zz", (2, 2), ("x", "y")), {}, UnknownNameError, "dim", "zz"),
        ((1, 4, ("x",)), {}, ArgumentTypeError, "mesh_sizes", 4),
        ((1, (2, 2.0), ("x", "y")), {}, ArgumentTypeError, "mesh_sizes[1]", 2.0),
        ((1, (True, 4), ("x", "y")), {}, ArgumentTypeError, "mesh_sizes[0]", True),
        ((1, (0, 4), ("x", "y")), {}, InvalidSizeError, "mesh_sizes[0]", 0),
        ((1, (2, 2), "xy"), {}, ArgumentTypeError, "mesh_dim_names", "xy"),
        ((1, (2, 2), ("x", 1)), {}, ArgumentTypeError, "mesh_dim_names[1]", 1),
        ((1, (2, 2), None), {}, ArgumentTypeError, "mesh_dim_names", None),
        ((1, (2, 2), ("x", "y")), dict(backend_override=5), ArgumentTypeError, "backend_override", 5),
        ((1, (2, 2), ("x", "y")), dict(backend_override={0: 1.5}), ArgumentTypeError, "backend_override[0]", 1.5),
        ((1, (2, 2), ("x", "y")), dict(backend_override={0.0: FAKE}), ArgumentTypeError, "backend_override", 0.0),
        ((1, (2, 2), ("x", "y")), dict(backend_override={"tp": FAKE}), MeshArgumentError, "backend_override", ANY),
    ],
    ids=repr,
)
def test_unflatten_arguments(small_world, args, kwargs, cls, field, value):
    expect(lambda: small_world["mesh"]._unflatten(*args, **kwargs), cls, field, value)


def test_unflatten_and_flatten_without_names():
    with fake_world(W, RANK):
        m = init_device_mesh("cpu", (2, 4))
        expect(lambda: m._unflatten(0, (2, 1), ("a", "b")), MeshArgumentError, "mesh_dim_names", None)
        # _flatten is torch's own (torch.compile inlines it): its RuntimeError for this case
        with pytest.raises(RuntimeError, match="mesh_dim_names"):
            m._flatten("x")


@pytest.mark.parametrize(
    "kwargs, cls, field, value",
    [
        (dict(mesh_dim_name=3), ArgumentTypeError, "mesh_dim_name", 3),
        (dict(mesh_dim_name=b"x"), ArgumentTypeError, "mesh_dim_name", b"x"),
        (dict(mesh_dim_name="x", backend_override=3), ArgumentTypeError, "backend_override", 3),
        (dict(mesh_dim_name="x", backend_override=("gloo", 3)), ArgumentTypeError, "backend_override", ("gloo", 3)),
        (dict(mesh_dim_name="x", backend_override=[FAKE]), ArgumentTypeError, "backend_override", [FAKE]),
        (dict(mesh_dim_name="tp"), ANY, "mesh_dim_name", "tp"),  # a root dim's name: DuplicateNameError
    ],
    ids=repr,
)
def test_flatten_arguments(small_world, kwargs, cls, field, value):
    from rankmesh.errors import DuplicateNameError

    cls = DuplicateNameError if cls is ANY else cls
    expect(lambda: small_world["mesh"]["dp"]._flatten(**kwargs), cls, field, value)


@pytest.mark.parametrize(
    "key, field, value",
    [
        (3, "mesh_dim_names", 3),
        (None, "mesh_dim_names", None),
        (b"dp", "mesh_dim_names", b"dp"),
        (("dp", 3), "mesh_dim_names[1]", 3),
        ((None,), "mesh_dim_names[0]", None),
        (["dp", 1.0], "mesh_dim_names[1]", 1.0),
    ],
    ids=repr,
)
def test_slice_keys(small_world, key, field, value):
    expect(lambda: small_world["mesh"][key], ArgumentTypeError, field, value)


def test_good_inputs_still_work(small_world):
    m = small_world["mesh"]
    assert m["dp", "tp"] is m and m[["dp"]].mesh.tolist() == m["dp"].mesh.tolist()
    assert m._unflatten(np.int64(1), (np.int32(2), 2), ("x", "y")).mesh_dim_names == ("dp", "x", "y")
    assert init_device_mesh("cpu", torch.Size([2, 4]), backend_override={np.int64(0): FAKE}).shape == (2, 4)
    assert m["dp"]._flatten("dpf", backend_override=FAKE).mesh_dim_names == ("dpf",)
    assert MeshBuilder(MeshLayout.world(W), rank=np.int64(RANK), size_one_fake=np.True_).rank == RANK


# -- nothing untyped escapes -----------------------------------------------------------------------

GARBAGE = [None, True, 2.5, NAN, math.inf, -1, 0, HUGE, "x", "", b"x", OBJ, [], {}, (1.5,), ("x", None), np.arange(3)]

# Inputs that reach torch's own code before rankmesh's and get torch's error (documented limits).
TORCH_FIRST = {
    # torch's _flatten (not overridden: torch.compile inlines it) evaluates ``not mesh_dim_name``
    "_flatten.mesh_dim_name": lambda v: isinstance(v, np.ndarray),
}

SLOTS = {
    "check_consistency.fingerprint": lambda w, v: check_consistency(v),
    "check_consistency.timeout": lambda w, v: check_consistency(1, timeout=v),
    "check_consistency.group": lambda w, v: check_consistency(1, group=v),
    "MeshBuilder.world": lambda w, v: MeshBuilder(v),
    "MeshBuilder.rank": lambda w, v: MeshBuilder(MeshLayout.world(W), rank=v),
    "MeshBuilder.device_type": lambda w, v: MeshBuilder(MeshLayout.world(W), device_type=v),
    "MeshBuilder.size_one_fake": lambda w, v: MeshBuilder(MeshLayout.world(W), size_one_fake=v),
    "process_group.layout": lambda w, v: w["builder"].process_group(v, 0),
    "process_group.dim": lambda w, v: w["builder"].process_group(w["layout"], v),
    "process_group.timeout": lambda w, v: w["builder"].process_group(w["layout"], 1, timeout=v),
    "process_group.backend": lambda w, v: w["builder"].process_group(w["layout"], 1, backend=v),
    "subset_group.partition": lambda w, v: w["builder"].subset_group(v, [3], name="x"),
    "subset_group.members": lambda w, v: w["builder"].subset_group("p", v, name="x"),
    "subset_group.name": lambda w, v: w["builder"].subset_group("p", [3], name=v),
    "subset_group.timeout": lambda w, v: w["builder"].subset_group("p", [3], name="x", timeout=v),
    "device_mesh.layout": lambda w, v: FastDeviceMesh.from_layout(w["builder"], v),
    "device_mesh.fake_dims": lambda w, v: FastDeviceMesh.from_layout(w["builder"], w["layout"], fake_dims=v),
    "init_device_mesh.device_type": lambda w, v: init_device_mesh(v, (8,)),
    "init_device_mesh.mesh_shape": lambda w, v: init_device_mesh("cpu", v),
    "init_device_mesh.mesh_shape[0]": lambda w, v: init_device_mesh("cpu", (v, 4)),
    "init_device_mesh.mesh_dim_names": lambda w, v: init_device_mesh("cpu", (2, 4), mesh_dim_names=v),
    "init_device_mesh.backend_override": lambda w, v: init_device_mesh("cpu", (2, 4), backend_override=v),
    "init_device_mesh.backend_override[0]": lambda w, v: init_device_mesh("cpu", (2, 4), backend_override={0: v}),
    "init_device_mesh.rank_map": lambda w, v: init_device_mesh("cpu", (2, 4), rank_map=v),
    "init_device_mesh.size_one_fake": lambda w, v: init_device_mesh("cpu", (2, 4), size_one_fake=v),
    "_unflatten.dim": lambda w, v: w["mesh"]._unflatten(v, (2, 2), ("x", "y")),
    "_unflatten.mesh_sizes": lambda w, v: w["mesh"]._unflatten(1, v, ("x", "y")),
    "_unflatten.mesh_dim_names": lambda w, v: w["mesh"]._unflatten(1, (2, 2), v),
    "_unflatten.backend_override": lambda w, v: w["mesh"]._unflatten(1, (2, 2), ("x", "y"), backend_override=v),
    "_flatten.mesh_dim_name": lambda w, v: w["mesh"]["dp"]._flatten(v),  # falsy: torch's auto name, no error
    "_flatten.backend_override": lambda w, v: w["mesh"]["dp"]._flatten("f", backend_override=v),
    "__getitem__": lambda w, v: w["mesh"][v],
    "topology_report.meshes": lambda w, v: topology_report(v, rank=0, gpus_per_node=4),
    "topology_report.rank": lambda w, v: topology_report(LAYOUT, rank=v, gpus_per_node=4),
    "topology_report.gpus_per_node": lambda w, v: topology_report(LAYOUT, rank=0, gpus_per_node=v),
    "topology_report.hostnames": lambda w, v: topology_report(LAYOUT, rank=0, hostnames=v),
    "topology_report.strict_dims": lambda w, v: _strict_report(v),
    "single_mesh.world_size": lambda w, v: single_mesh(v),
    "single_mesh.tp": lambda w, v: single_mesh(8, tp=v),
    "single_mesh.dp_shard": lambda w, v: single_mesh(8, dp_shard=v),
    "single_mesh.rank_map": lambda w, v: single_mesh(8, rank_map=v),
    "get_dp_info.mesh": lambda w, v: get_dp_info(v, rank=0),
    "get_dp_info.rank": lambda w, v: get_dp_info(LAYOUT, rank=v),
    "group_key.layout": lambda w, v: group_key(v, 0, world_size=8),
}


@pytest.mark.parametrize("slot", list(SLOTS))
def test_nothing_untyped_escapes(small_world, slot, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    fn = SLOTS[slot]
    skip = TORCH_FIRST.get(slot, lambda v: False)
    for v in GARBAGE:
        if skip(v):
            continue
        try:
            fn(small_world, v)
        except RankmeshError as e:
            assert e.field, (slot, v, e)  # every error names its field
        except Exception as e:  # noqa: BLE001 - the point of the test
            pytest.fail(f"{slot} = {v!r}: untyped {type(e).__name__}: {e}")
