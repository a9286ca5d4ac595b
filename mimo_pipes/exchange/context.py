"""Where one rank stands in its module's exchange: its DP layout and the group it talks on."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class RankLayout:
    """The part of the topology one rank's graph needs."""

    dp_rank: int
    dp_size: int
    grid_size: int  # G: the canonical grid, lcm of every module's DP size
    exchange_group: dist.ProcessGroup | None = None  # None only when dp_size == 1
    exchange_device: torch.device | None = None  # cuda when the exchange group is NCCL


@dataclass(frozen=True)
class ExchangeContext:
    """What one rank needs to exchange: its module's DP layout and the group to talk on."""

    group: dist.ProcessGroup | None  # None only when dp_size == 1
    dp_rank: int
    dp_size: int
    grid_size: int
    samples_per_rank: int  # B / d
    window_size: int
    across_microbatches: bool = False
    device: torch.device | None = None  # where the group's collectives run: None for Gloo (CPU), cuda for NCCL
    floor: int = 0  # the encoder's per-forward floor in planner cost units (config.planner_settings)
    encoder_groups: int = 0  # > 0: two-level balance over this many encoder replicas

    @classmethod
    def for_layout(
        cls, layout: RankLayout, *, samples_per_rank: int, window_size: int, across_microbatches: bool = False,
        floor: int = 0, encoder_groups: int = 0,
    ) -> ExchangeContext:
        return cls(
            group=layout.exchange_group,
            dp_rank=layout.dp_rank,
            dp_size=layout.dp_size,
            grid_size=layout.grid_size,
            samples_per_rank=samples_per_rank,
            window_size=window_size,
            across_microbatches=across_microbatches,
            device=layout.exchange_device,
            floor=floor,
            encoder_groups=encoder_groups,
        )

    @property
    def microbatch_size(self) -> int:
        return self.samples_per_rank * self.dp_size
