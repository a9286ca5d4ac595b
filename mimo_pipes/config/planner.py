"""The planners' settings, derived from the layout every rank knows and the reordering configuration."""

from __future__ import annotations

from typing import Protocol

from mimo_pipes.balance.settings import PlannerSettings
from mimo_pipes.config.flags import flag
from mimo_pipes.errors import ConfigError
from mimo_pipes.parallel.topology import Topology
from mimo_pipes.time_model.model import TimeModel


class CostWeights(Protocol):
    """What the planners' settings read of a :class:`~mimo_pipes.config.ReorderConfig`."""

    reorder_two_level: bool

    def integer_cost_weights(self) -> tuple[int, int]: ...


def two_level_groups(topology: Topology) -> int:
    """d_enc for two-level balance: every encoder has the same dp, and language dp is k > 1 times it."""
    sizes = sorted({encoder.dp for encoder in topology.encoders})
    language = topology.language.dp
    if len(sizes) != 1 or language // sizes[0] < 2:
        raise ConfigError(
            flag("reorder_two_level"),
            f"needs every encoder at one dp that language dp={language} is a multiple k > 1 of; encoder dp: {sizes}",
        )
    return sizes[0]


def planner_settings(topology: Topology, reorder: CostWeights, model: TimeModel | None) -> PlannerSettings:
    """From the component specs every rank knows: the floor in cost units and the two-level grouping.

    One level: the floor, scaled by the encoder weight, is spread over the G/d_enc slots of one encoder
    forward (the smallest encoder dp when encoders differ). Two levels: the encoder level balances
    encoder cost alone, so the floor is the model's, per group (one group = one encoder forward)."""
    floor_ns = model.floor_ns if model is not None else 0
    if reorder.reorder_two_level:
        return PlannerSettings(floor=floor_ns, encoder_groups=two_level_groups(topology))
    encoder_weight, _ = reorder.integer_cost_weights()
    encoders = [encoder.dp for encoder in topology.encoders]
    slots_per_forward = topology.grid_size // min(encoders) if encoders else 1
    return PlannerSettings(floor=encoder_weight * floor_ns // slots_per_forward)
