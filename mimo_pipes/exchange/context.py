"""Where one rank stands in its module's exchange: its DP layout and the group it talks on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from mimo_pipes.errors import ConfigError, as_count

if TYPE_CHECKING:
    from mimo_pipes.config.tail_settings import TailSettings


@dataclass(frozen=True)
class RankLayout:
    """The part of the topology one rank's graph needs."""

    dp_rank: int
    dp_size: int
    grid_size: int  # G: the canonical grid, lcm of every module's DP size
    exchange_group: dist.ProcessGroup | None = None  # None only when dp_size == 1
    exchange_device: torch.device | None = None  # cuda when the exchange group is NCCL
    module: str | None = None  # the module's name: what its micro-batches carry (mimo_pipes/samples/module_fields.py); None: all
    # A Gloo group of every module's ranks of the job, reserved for agreeing on rows that fail after the exchange
    # (rows payload, --skip-bad-samples: mimo_pipes/exchange/failure_agreement.py). None: this rank agrees with
    # nobody, right when it is the only rank holding its samples' rows (one module, DP size 1).
    agreement_group: dist.ProcessGroup | None = None

    def __post_init__(self) -> None:
        # Plain ints (numpy and torch integers too: they reach states and messages); anything else refused here.
        for name, minimum in (("dp_rank", 0), ("dp_size", 1), ("grid_size", 1)):
            object.__setattr__(self, name, as_count(getattr(self, name), name, minimum=minimum))
        if self.dp_rank >= self.dp_size:
            raise ConfigError("dp_rank", f"must be below dp_size {self.dp_size}, got {self.dp_rank}")
        if self.grid_size % self.dp_size:
            raise ConfigError("grid_size", f"must be a multiple of dp_size {self.dp_size} (the lcm of every module's DP size), got {self.grid_size}")


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
    floor: int = 0  # the encoder's per-forward floor in planner cost units (TailSettings.planner)
    encoder_groups: int = 0  # > 0: two-level balance over this many encoder replicas

    @classmethod
    def for_rank(cls, layout: RankLayout, settings: TailSettings) -> ExchangeContext:
        """This rank's context: its layout, with B/d, W and the planner's settings from the tail's."""
        return cls(
            group=layout.exchange_group,
            dp_rank=layout.dp_rank,
            dp_size=layout.dp_size,
            grid_size=layout.grid_size,
            samples_per_rank=settings.samples_per_rank,
            window_size=settings.plan.window_size,
            across_microbatches=settings.plan.across_microbatches,
            device=layout.exchange_device,
            floor=settings.plan.planner.floor,
            encoder_groups=settings.plan.planner.encoder_groups,
        )

    @property
    def micro_batch_size(self) -> int:
        return self.samples_per_rank * self.dp_size
