"""Counted budgets of the exact searches (a search stops where its budget ends, the same on every process), and
the tables and completions they share."""

from __future__ import annotations

from collections.abc import Callable


class BudgetSpent(Exception):
    """Raised inside a search when it has placed as many samples as its budget allows."""


def runs_to_the_end(search: Callable[[int], object]) -> bool:
    """Run ``search(0)``: True when it ended on its own (every branch explored or cut by a bound), False when
    it stopped on its budget (raised :class:`BudgetSpent`)."""
    try:
        search(0)
    except BudgetSpent:
        return False
    return True


def prefix_totals(costs: list[int], past_the_end: int) -> tuple[list[int], list[int]]:
    """For costs sorted heaviest first: ``tails[n]``, the total of the ``n`` lightest, and ``heads[i]``, the
    total of the ``i`` heaviest, with ``past_the_end`` more entries holding the whole total."""
    tails = [0]
    for cost in reversed(costs):
        tails.append(tails[-1] + cost)
    heads = [0]
    for cost in costs:
        heads.append(heads[-1] + cost)
    heads += heads[-1:] * past_the_end
    return tails, heads


def filled_in_order(bin_of: list[int], placed: int, fill: list[int], per_bin: int) -> list[int]:
    """The bin of each sample once the samples from ``placed`` on (zero costs, or none) fill the places left,
    bin by bin in bin order: ``bin_of`` for the first ``placed``, ``fill[b]`` of bin b's ``per_bin`` taken."""
    return bin_of[:placed] + [b for b in range(len(fill)) for _ in range(per_bin - fill[b])]
