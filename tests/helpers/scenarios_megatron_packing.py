"""Scenarios of the two Megatron recipes with the library's sequence packing on (``--pack-sequences-in-batch``):
those of :mod:`scenarios_megatron_equivalence`, each also returning how many sequences every micro-batch that
reached ``mimo_batch`` packed into its row (0: not packed), per rank, so a test sees that packing was on where it
should be (the language ranks) and off where it should not (the vision ranks: one row per sample)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist
from megatron_on_cpu import _swapped
from scenarios_megatron_equivalence import colocated_run, grids_run

from mimo_pipes.samples.thd import CU_SEQLENS
from mimo_pipes_recipes import megatron_mimo_grids as grids
from mimo_pipes_recipes import megatron_mimo_train as colocated


@contextlib.contextmanager
def counting_packed(recipe: Any, counts: list[int]) -> Iterator[None]:
    """Each micro-batch ``recipe`` hands ``mimo_batch``: the sequences packed into its row appended to ``counts``
    (0 for a padded micro-batch)."""
    made = recipe.mimo_batch

    def counted(batch, settings):
        counts.append(len(batch[CU_SEQLENS]) - 1 if CU_SEQLENS in batch else 0)
        return made(batch, settings)

    with _swapped(recipe, "mimo_batch", counted):
        yield


def colocated_packed_run(*, iterations: int, microbatches: int, **settings: Any) -> dict:
    """:func:`colocated_run`, with ``"packed"``: the sequences of each micro-batch trained on."""
    counts: list[int] = []
    with counting_packed(colocated, counts):
        outcome = colocated_run(iterations=iterations, **settings)
    return {**outcome, "packed": counts[:iterations * microbatches]}


def grids_packed_run(*, iterations: int, microbatches: int, **settings: Any) -> dict | None:
    """:func:`grids_run`; rank 0's outcome with ``"packed"``: per rank, the sequences of each micro-batch trained on."""
    counts: list[int] = []
    with counting_packed(grids, counts):
        outcome = grids_run(iterations=iterations, **settings)
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, counts[:iterations * microbatches])  # not what the loader read ahead
    return None if outcome is None else {**outcome, "packed": every}
