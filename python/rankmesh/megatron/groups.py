"""Megatron's groups as torch process groups and ``DeviceMesh`` objects: the torch face of
:mod:`rankmesh.megatron.layout` and :mod:`rankmesh.megatron.generator`, which never import a
process group or a mesh.

Every Megatron group rankmesh creates goes through :func:`group`, on one
:class:`~rankmesh.MeshBuilder`: :func:`rankmesh.megatron.initialize_model_parallel`,
:func:`process_groups` and :func:`process_group` all do. A group of one rank follows the
builder's one rule, ``size_one_fake``: a ``fake``-backend group by default (it never
communicates), a real one-rank group when the builder is made with ``size_one_fake=False``, as
``initialize_model_parallel`` makes it (megatron-core's own groups are real).

Example, as on every rank of a 64-rank job; here one process plays rank 13 on torch's ``fake``
backend, which needs no peers::

    >>> import torch.distributed as dist
    >>> from torch.testing._internal.distributed.fake_pg import FakeStore
    >>> from rankmesh.megatron import groups, model_parallel_layout
    >>> dist.init_process_group("fake", store=FakeStore(), rank=13, world_size=64)
    >>> m = model_parallel_layout(64, tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    >>> builder = groups.mesh_builder(m)
    >>> pgs = groups.process_groups(m, builder)
    >>> dist.get_process_group_ranks(pgs["tp"]), len(dist.get_process_group_ranks(pgs["dp"]))
    ([12, 13], 16)
    >>> dm = groups.device_mesh(m.decoder, ["pp", "dp-cp", "tp"], builder)
    >>> dm.mesh_dim_names, tuple(dm.shape)
    (('pp', 'dp_cp', 'tp'), (2, 16, 2))
    >>> dist.destroy_process_group()
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rankmesh._check import type_name
from rankmesh.errors import ArgumentTypeError, ParallelConfigError
from rankmesh.megatron.generator import RankGenerator
from rankmesh.megatron.layout import ModelParallelLayout
from rankmesh.mesh import FastDeviceMesh
from rankmesh.process_groups import MeshBuilder

__all__ = ["mesh_builder", "group", "process_group", "process_groups", "device_mesh"]


def _whole_world(g: RankGenerator) -> RankGenerator:
    """``g``, which must cover the whole world: a torch group's ranks are the job's ranks."""
    if g.rank_offset:
        raise ParallelConfigError(
            f"process groups need a generator that covers the whole world (rank_offset 0, got "
            f"{g.rank_offset}); build one RankGenerator over the world instead",
            field="rank_offset",
            value=g.rank_offset,
        )
    return g


def mesh_builder(
    of: RankGenerator | ModelParallelLayout,
    *,
    device_type: str = "cpu",
    rank: int | None = None,
    size_one_fake: bool = True,
) -> MeshBuilder:
    """A :class:`~rankmesh.MeshBuilder` over the world of a generator or of a
    :class:`~rankmesh.ModelParallelLayout` (its dense generator's world, which the expert one shares)."""
    g = of.decoder if isinstance(of, ModelParallelLayout) else of
    if not isinstance(g, RankGenerator):
        raise ArgumentTypeError(
            f"of must be a RankGenerator or a ModelParallelLayout, got {type_name(of)}", field="of", value=of
        )
    return MeshBuilder(_whole_world(g).world, device_type=device_type, rank=rank, size_one_fake=size_one_fake)


def group(builder: MeshBuilder, m: ModelParallelLayout, rank: int, name: str, **kwargs: Any) -> Any:
    """``rank``'s process group ``name`` of ``m`` (None for an embedding group it is not in):
    one per distinct partition, shared, through ``builder``. ``kwargs`` are
    :meth:`MeshBuilder.process_group`'s (backend, pg_options, timeout, group_desc, tag). A group
    that is a partition of the world comes from its layout; the rest (the embedding groups, a
    DistOpt instance that is not strided) are member-only groups of their members."""
    lay = m.group_layout(name)
    if lay is not None:
        return builder.process_group(lay, 0, **kwargs)
    members = m.group(rank, name)
    return builder.subset_group(name, None if members is None else members.tolist(), name=name, **kwargs)


def process_groups(m: ModelParallelLayout, builder: MeshBuilder, names: Iterable[str] | None = None) -> dict[str, Any]:
    """The caller's process group for each name of ``m`` (default: every group that covers the
    world, i.e. all but the embedding ones), created in Megatron's order so that every rank agrees;
    groups with the same members share one process group."""
    if names is None:
        wanted = tuple(n for n in m.group_names if m.covers_world(n))
    else:
        wanted = tuple(names)
    for name in wanted:  # every name checked before any group is created
        if not m.covers_world(name):
            raise ParallelConfigError(
                f"{name!r} groups do not cover the world, so they are not made here; make them with "
                f"rankmesh.megatron.groups.group(builder, m, rank, {name!r}) on every rank, in the same order",
                field="names",
                value=name,
            )
    for name in wanted:
        if m.layout(name) is None:
            raise ParallelConfigError(
                f"group {name!r} is not a strided partition of the world; it cannot be built "
                "from a layout (pick num_distributed_optimizer_instances dividing dp)",
                field="name",
                value=name,
            )
    rank = builder.rank
    return {name: group(builder, m, rank, name) for name in m.group_names if name in wanted}


def process_group(g: RankGenerator, token: str | Iterable[str], builder: MeshBuilder, *, fake: bool = False) -> Any:
    """The caller's process group of a generator's ``token``, e.g. ``"dp-cp"`` (one per distinct
    partition, shared)."""
    return builder.process_group(_whole_world(g).layout(token), 0, fake=fake)


def device_mesh(
    g: RankGenerator,
    dims: Sequence[str | Iterable[str]],
    builder: MeshBuilder,
    *,
    names: Sequence[str] | None = None,
    fake_dims: Sequence[str] = (),
) -> FastDeviceMesh:
    """The caller's ``DeviceMesh`` over a generator's tokens ``dims``, slowest first, e.g.
    ``["pp", "dp-cp", "tp"]`` (see :meth:`RankGenerator.dims_layout`)."""
    layout = _whole_world(g).dims_layout(dims, names)
    return FastDeviceMesh.from_layout(builder, layout, fake_dims=fake_dims)
