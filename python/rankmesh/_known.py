"""The code rankmesh has read, one table per dependency: per release, ``{dotted path: body hash}``
of every function whose behaviour rankmesh reproduces or relies on, plus the few facts the release
decides. A leaf: data only, no imports of rankmesh or torch.

Every patch and fast path names the paths it needs (:class:`rankmesh._patch.Gate`); a release is
read when it is listed here and in :data:`rankmesh._dependencies.DEPENDENCIES` (the pin). A new
release is the pin plus one entry pasted from ``python -m rankmesh.patches hashes`` (its facts are
copied from the newest release there, to be checked by hand); ``tests/test_patches.py`` fails when
a pinned release has no entry, an entry is not pinned, or a gate's path is missing from a release
it applies to. Hashes are :func:`rankmesh._patch.source_hash`; torch 2.14's were read from the
2.14.0 and 2.14.1 wheels' sources (the same files), without installing them.

    >>> TABLES["torch"]["2.15"].facts["scheme"]
    'group_count'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["TABLES", "Release"]


@dataclass(frozen=True)
class Release:
    """One release's bodies (``{dotted path: 16 hex digits}``) and facts (``scheme``: how torch
    salts hashed group names, ``"group_count"`` or ``"pg_names"``; ``split_group``: whether
    rankmesh reproduces this release's ``split_group``)."""

    bodies: dict[str, str]
    facts: dict[str, Any] = field(default_factory=dict)


_DM = "torch.distributed.device_mesh"
_C10D = "torch.distributed.distributed_c10d"
_PS = "megatron.core.parallel_state"
_FSDP = "megatron.core.distributed.fsdp.mcore_fsdp_adapter"
_DS = "deepspeed.runtime.pipe.topology"
_LE = {"spmd_types._mesh_axis.MeshAxis.__le__": "a7be55d60579d6bb"}

TABLES: dict[str, dict[str, Release]] = {
    "torch": {
        "2.13": Release(
            {
                f"{_DM}.DeviceMesh._concatenate": "3f67b9082f9ab55b",
                f"{_DM}.DeviceMesh._init_one_process_group": "f99050d28ccfdb7d",
                f"{_DM}.DeviceMesh._init_process_groups": "031d14dd4af72a7e",
                f"{_DM}.init_device_mesh": "70f0098127cf58fa",
                f"{_C10D}._hash_ranks_to_str": "0b18a6130bc29871",
                f"{_C10D}._new_group_with_tag": "611b36bbe829f9ab",
                f"{_C10D}._process_group_name": "7e6fc29384da5cd8",
                f"{_C10D}.new_group": "47374139b94f2439",
            },
            {"scheme": "pg_names", "split_group": False},
        ),
        "2.14": Release(
            {
                f"{_DM}.DeviceMesh._concatenate": "7029bb4cf8aacbd7",
                f"{_DM}.DeviceMesh._init_one_process_group": "cb243290d068e561",
                f"{_DM}.DeviceMesh._init_process_groups": "031d14dd4af72a7e",
                f"{_DM}.init_device_mesh": "70f0098127cf58fa",
                f"{_C10D}._hash_ranks_to_str": "6b4e40a881640221",
                f"{_C10D}._new_group_with_tag": "cb54f76632d7c2f8",
                f"{_C10D}._process_group_name": "710d483e6c074a3f",
                f"{_C10D}.new_group": "40b4162dab7111dd",
            },
            {"scheme": "group_count", "split_group": False},
        ),
        "2.15": Release(
            {
                f"{_DM}.DeviceMesh._concatenate": "820cab857e0d8c3e",
                f"{_DM}.DeviceMesh._init_one_process_group": "2d616ffe2b5f9e09",
                f"{_DM}.DeviceMesh._init_process_groups": "dbc722f632161f06",
                f"{_DM}.init_device_mesh": "70f0098127cf58fa",
                f"{_C10D}._hash_ranks_to_str": "6b4e40a881640221",
                f"{_C10D}._new_group_with_tag": "cb54f76632d7c2f8",
                f"{_C10D}._process_group_name": "710d483e6c074a3f",
                f"{_C10D}.new_group": "3ce46582957e046d",
                f"{_C10D}.split_group": "d2f90c7399463483",
            },
            {"scheme": "group_count", "split_group": True},
        ),
    },
    # read by version alone: the patch replaces torch's own function, checked by identity
    "torchtitan": {"0.3.0": Release({})},
    # one MeshAxis.__le__ in every release since 0.2.3
    "spmd_types": {r: Release(_LE) for r in ("0.2.3", "0.2.4", "0.3.0", "0.3.1")},
    # 0.19.8's pipe/topology.py is the same file as v0.19.5's (git blob 4b10776)
    "deepspeed": {
        "0.19": Release(
            {
                "deepspeed.comm.comm.new_group": "4f4fb36f5c19c85e",
                "deepspeed.comm.torch.TorchBackend.new_group": "8f95d2f8e85b523b",
                f"{_DS}.PipeDataParallelTopology.__init__": "32bd57fdb04117fe",
                f"{_DS}.PipelineParallelGrid.__init__": "35a6a4edbc8fe1a4",
                f"{_DS}.PipelineParallelGrid._build_p2p_groups": "51fe861791db3b2c",
                f"{_DS}.PipelineParallelGrid._is_grid_valid": "1aff4b4be4befbe3",
                f"{_DS}.PipelineParallelGrid.get_data_parallel_id": "671f17e8d4071b40",
                f"{_DS}.PipelineParallelGrid.get_stage_id": "c94156a7e1e7bdba",
                f"{_DS}.ProcessTopology.__init__": "9b2931f87392a546",
                f"{_DS}.ProcessTopology.get_axis_comm_lists": "6df706b0e5bdae79",
                f"{_DS}.ProcessTopology.get_axis_list": "11181cc0166301c1",
                f"{_DS}.ProcessTopology.get_axis_names": "6ed0471696a74838",
                f"{_DS}.ProcessTopology.get_coord": "d40910ae74cf8e60",
                f"{_DS}.ProcessTopology.get_dim": "ce365b41efcb3620",
                f"{_DS}.ProcessTopology.get_rank": "d3edd6e846b34b63",
                f"{_DS}._prime_factors": "9fb77e1c79b02fb8",
                "deepspeed.utils.groups._create_expert_and_data_parallel": "aa5eee3d36b4848b",
                "deepspeed.utils.groups._create_expert_data_and_model_parallel": "6a7ecc8007241108",
                "deepspeed.utils.groups._create_zero_param_parallel_group": "9de72f71be0a0492",
                "deepspeed.utils.groups._ensure_divisibility": "0de053d4b5bf1b33",
                "deepspeed.utils.groups._get_expert_parallel_ranks": "d78c0f3764cd870a",
                "deepspeed.utils.groups._init_tp_groups_with_new_group": "8a1c1cf4c549ceb9",
            }
        ),
    },
    "megatron-core": {
        "0.16": Release(
            {
                f"{_FSDP}.FullyShardedDataParallel._init_dist_index": "68509aaf698abd55",
                f"{_FSDP}._check_mesh_ranks_and_group_ranks_are_consistent": "371463bf3c755cf1",
                f"{_FSDP}._get_dp_tp_mesh": "dffb0e0843dd3fc7",
                f"{_FSDP}._get_hsdp_tp_mesh": "a47e5029728e12cf",
                f"{_PS}.RankGenerator.__init__": "f516458c5b50c46e",
                f"{_PS}.RankGenerator.get_ranks": "5114e72f50e090db",
                f"{_PS}.create_group": "fb40d7d4c3cdedce",
                f"{_PS}.create_hierarchical_groups": "79429f802c9a6a4a",
                f"{_PS}.create_hybrid_dp_cp_groups": "e051fab1b13ac884",
                f"{_PS}.default_embedding_ranks": "09fcb80d5f63539c",
                f"{_PS}.default_position_embedding_ranks": "b036a9de8792caec",
                f"{_PS}.destroy_model_parallel": "6fea4ba8b6430c52",
                f"{_PS}.generate_masked_orthogonal_rank_groups": "5abd2023c2d1925c",
                f"{_PS}.get_nccl_options": "d4654b3e8c3835b3",
                f"{_PS}.initialize_model_parallel": "56c283adf84e5d23",
            }
        ),
    },
}
