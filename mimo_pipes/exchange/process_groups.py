"""Process groups for every module, from the topology: the DP groups megatron-core's HyperCommGrid builds
(one grid per module, as Megatron MIMO lays them out; a test holds the two equal), without importing it."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

from mimo_pipes.exchange.context import RankLayout
from mimo_pipes.exchange.roll_store import sign_roll
from mimo_pipes.parallel.topology import RankPosition, Topology


@dataclass
class RankGroups:
    """This rank's place and groups: ``dp_group`` for the module's DP replicas, ``exchange_group`` (same
    ranks) reserved for the balance exchange so it never interleaves with the trainer's collectives."""

    position: RankPosition
    dp_group: dist.ProcessGroup
    exchange_group: dist.ProcessGroup
    dp_ranks: list[int]
    grid_size: int  # the canonical grid G of the topology the groups were built from

    def layout(self, exchange_device: torch.device | None = None, agreement_group: dist.ProcessGroup | None = None) -> RankLayout:
        """This rank's :class:`RankLayout`, its module named: a layout without the module keeps every field, so a
        language rank built by hand without it would get and move pixels. ``exchange_device``: the rank's GPU
        for an NCCL exchange group."""
        position = self.position
        return RankLayout(position.dp_rank, position.dp_size, self.grid_size, self.exchange_group, exchange_device,
                          position.module.name, agreement_group=agreement_group)


def build_rank_groups(
    topology: Topology, *, exchange_backend: str = "gloo", timeout_s: float = 120.0
) -> RankGroups | None:
    """Collective over the whole world: every rank creates every module's groups in the same order.

    The exchange group is Gloo unless asked otherwise: CPU bytes, safe beside a trainer's NCCL kernels
    (an ``"nccl"`` exchange group needs ``RankLayout.exchange_device`` set to the rank's GPU).

    Ranks beyond the topology's world (spare ranks) take part in creating the groups and get None.
    """
    rank = dist.get_rank()
    sign_roll()  # a peer that dies in one of the pipeline's collectives can then be named
    timeout = datetime.timedelta(seconds=timeout_s)
    dp_group = exchange_group = None
    for module in topology.modules:
        groups = topology.dp_groups(module)
        module_dp, _ = dist.new_subgroups_by_enumeration(groups, timeout=timeout)
        module_exchange, _ = dist.new_subgroups_by_enumeration(groups, backend=exchange_backend, timeout=timeout)
        if rank in module.ranks:
            dp_group, exchange_group = module_dp, module_exchange
    if rank >= topology.world_size:
        return None
    position = topology.position(rank)
    dp_ranks = topology.dp_group_ranks(rank)
    if dp_group is None or exchange_group is None or dist.get_process_group_ranks(dp_group) != dp_ranks:
        raise RuntimeError(f"rank {rank}: the DP group disagrees with the topology ({dp_ranks})")
    return RankGroups(position, dp_group, exchange_group, dp_ranks, topology.grid_size)
