"""Process groups for every module, built as Megatron MIMO builds them: one HyperCommGrid per module."""

from __future__ import annotations

import datetime
import warnings
from dataclasses import dataclass

import torch.distributed as dist

from mimo_pipes.topology import GRID_DIMS, RankPosition, Topology

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # megatron-core warns about optional logging/TE packages on import
    from megatron.core.hyper_comm_grid import HyperCommGrid


@dataclass
class RankGroups:
    """This rank's place and groups: ``dp_group`` for the module's DP replicas, ``exchange_group`` (same
    ranks) reserved for the balance exchange so it never interleaves with the trainer's collectives."""

    position: RankPosition
    grids: dict[str, HyperCommGrid]
    dp_group: dist.ProcessGroup
    exchange_group: dist.ProcessGroup
    dp_ranks: list[int]


def build_rank_groups(
    topology: Topology, *, exchange_backend: str = "gloo", timeout_s: float = 120.0
) -> RankGroups | None:
    """Collective over the whole world: every rank creates every module's groups in the same order.

    The exchange group is Gloo unless asked otherwise: CPU bytes, safe beside a trainer's NCCL kernels
    (an ``"nccl"`` exchange group needs ``RankLayout.exchange_device`` set to the rank's GPU).

    Ranks beyond the topology's world (spare ranks) take part in creating the groups and get None.
    """
    rank = dist.get_rank()
    timeout = datetime.timedelta(seconds=timeout_s)
    grids: dict[str, HyperCommGrid] = {}
    dp_group = exchange_group = None
    for module in topology.modules:
        grid = HyperCommGrid(module.grid_shape, list(GRID_DIMS), rank_offset=module.rank_offset)
        module_dp = grid.create_pg(["dp"], timeout=timeout)
        module_exchange, _ = dist.new_subgroups_by_enumeration(
            grid.get_rank_enum(["dp"]), backend=exchange_backend, timeout=timeout
        )
        grids[module.name] = grid
        if rank in module.ranks:
            dp_group, exchange_group = module_dp, module_exchange
    if rank >= topology.world_size:
        return None
    position = topology.position(rank)
    dp_ranks = topology.dp_group_ranks(rank)
    if dp_group is None or exchange_group is None or dist.get_process_group_ranks(dp_group) != dp_ranks:
        raise RuntimeError(f"rank {rank}: megatron-core's DP group disagrees with the topology ({dp_ranks})")
    return RankGroups(position, grids, dp_group, exchange_group, dp_ranks)

