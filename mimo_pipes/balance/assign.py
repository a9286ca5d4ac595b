"""The one entry to the planners: a window's assignment from its costs and the planner settings."""

from __future__ import annotations

from collections.abc import Sequence

from mimo_pipes.balance.settings import PlannerSettings
from mimo_pipes.balance.window.given_composition import balance_composition, balance_composition_two_level
from mimo_pipes.balance.window.planner import balance_window
from mimo_pipes.balance.window.two_level import balance_two_level

Assignment = list[list[list[int]]]  # [micro-batch][slot] -> flat window indices


def composition_of(assignment: Assignment) -> list[list[int]]:
    """Which flat window indices each output micro-batch holds, ascending."""
    return [sorted(i for slot in slots for i in slot) for slots in assignment]


def assign_window(
    costs: Sequence[Sequence[int]],
    *,
    grid_size: int,
    across_microbatches: bool,
    planner: PlannerSettings,
    encoder_costs: Sequence[Sequence[int]] | None = None,
    language_costs: Sequence[Sequence[int]] | None = None,
    composition: list[list[int]] | None = None,
) -> Assignment:
    """Balance a window of micro-batches (``costs[m][j]``) over ``grid_size`` slots: one level on ``costs``, or,
    with ``planner.encoder_groups``, two levels (encoder replicas on ``encoder_costs``, their language replicas
    on ``language_costs``). With a ``composition`` (a window's micro-batches as saved), the micro-batches hold
    exactly its samples: where the planner would form others (another grid or floor than the save's), each
    saved micro-batch is balanced as it stands; with the save's own settings the planner's plan is kept, so a
    restore there is exact. Every module has the same inputs, so all of them take the same branch."""
    if planner.encoder_groups:
        if encoder_costs is None or language_costs is None:
            raise ValueError("two-level balance needs encoder_costs and language_costs")
        assignment = balance_two_level(encoder_costs, language_costs, planner.encoder_groups, grid_size, across_microbatches, planner.floor)
        if composition is not None and composition_of(assignment) != composition:
            assignment = balance_composition_two_level(encoder_costs, language_costs, composition, planner.encoder_groups, grid_size, planner.floor)
        return assignment
    assignment = balance_window(costs, grid_size, across_microbatches=across_microbatches, floor=planner.floor)
    if composition is not None and composition_of(assignment) != composition:
        assignment = balance_composition(costs, composition, grid_size, floor=planner.floor)
    return assignment
