"""What the planners need besides the costs: one frozen object, identical on every rank of every module."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlannerSettings:
    """The per-forward floor in the planner's cost units (per slot, or per group with two levels), and the
    two-level grouping (``encoder_groups`` = d_enc with two-level balance, else 0)."""

    floor: int = 0
    encoder_groups: int = 0
