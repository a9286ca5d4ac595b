"""Deterministic equal-count load balancing of micro-batches over canonical slots.

One micro-batch of B samples with non-negative integer costs is split over G slots of exactly B/G
samples, minimising the heaviest slot load and then the spread. The result depends on the cost list
alone (integer arithmetic, ties by index), so every process computes the same assignment.
See docs/balancing.md for the algorithms and measured quality.
"""

from mimo_pipes.balance.assign import assign_window, composition_of
from mimo_pipes.balance.heuristics.contiguous import contiguous_assignment
from mimo_pipes.balance.heuristics.karmarkar_karp import karmarkar_karp_assignment
from mimo_pipes.balance.heuristics.lpt import lpt_assignment
from mimo_pipes.balance.microbatch import balance_microbatch
from mimo_pipes.balance.quality import (
    critical_path,
    lower_bound,
    max_load,
    objective,
    ratio_to_bound,
    slot_loads,
    spread,
    window_lower_bound,
)
from mimo_pipes.balance.search.exact import exact_assignment
from mimo_pipes.balance.settings import PlannerSettings
from mimo_pipes.balance.window.given_composition import balance_composition, balance_composition_two_level
from mimo_pipes.balance.window.planner import balance_window
from mimo_pipes.balance.window.two_level import balance_two_level

__all__ = [
    "PlannerSettings",
    "assign_window",
    "composition_of",
    "balance_composition",
    "balance_composition_two_level",
    "balance_microbatch",
    "balance_two_level",
    "balance_window",
    "contiguous_assignment",
    "critical_path",
    "exact_assignment",
    "karmarkar_karp_assignment",
    "lower_bound",
    "lpt_assignment",
    "max_load",
    "objective",
    "ratio_to_bound",
    "slot_loads",
    "spread",
    "window_lower_bound",
]
