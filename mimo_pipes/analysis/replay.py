"""Replay of the canonical grid: the micro-batches a run consumes, before and after balancing.

Pure arithmetic over per-row costs. It uses what the graph uses: ``sharding`` for which rows make up a
global micro-batch, ``resume.resume_point`` and the Windower's rule for where windows start and end,
and the exchange's planner (``balance.assign_window``: one level with the floor, or two levels) on the window's
costs in canonical order (as the exchange lays them out).
Every module balances the same canonical slots, so one replay serves all of them: a module of DP
size d gives DP rank r the slots ``[r*G/d, (r+1)*G/d)``, i.e. canonical positions ``[r*B/d, (r+1)*B/d)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from mimo_pipes.balance import PlannerSettings, assign_window, window_lower_bound
from mimo_pipes.checkpoint.resume import resume_point
from mimo_pipes.data.bad_rows.skipping import MAX_TRIES, successor_rows, too_many_bad
from mimo_pipes.parallel.sharding import epoch_order, global_microbatch_indices, microbatches_per_epoch


@dataclass(frozen=True)
class GridReplay:
    """Rows of the consumed global micro-batches, ``steps[i]`` in row i, canonical positions as columns.

    ``before``: dataset rows as the readers hold them; ``after``: as the ranks consume them (equal to
    ``before`` without reordering); ``after_slots`` and ``after_read_steps``: the canonical slot each
    consumed row was read into and the step it was read at; ``after_positions``: its canonical position in
    the micro-batch it was read for."""

    steps: np.ndarray
    before: np.ndarray
    after: np.ndarray
    after_slots: np.ndarray
    after_read_steps: np.ndarray
    after_positions: np.ndarray | None = None


@dataclass(frozen=True)
class Planner:
    """What the exchange plans a window on, per dataset row: ``costs`` with the per-forward ``floor``
    (config.planner_settings), or with ``encoder_groups`` > 0 two-level balance on ``encoder_costs``
    (image tokens, or modelled encoder ns) then ``language_costs`` (real tokens)."""

    costs: np.ndarray
    floor: int = 0
    encoder_groups: int = 0
    encoder_costs: np.ndarray | None = None
    language_costs: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.encoder_groups and (self.encoder_costs is None or self.language_costs is None):
            raise ValueError("two-level balance needs encoder_costs and language_costs")

    def assign(self, rows: np.ndarray, grid_size: int, across_microbatches: bool) -> list[list[list[int]]]:
        """The window's assignment for its (W, B) dataset rows: the exchange's own planner entry."""
        two_level = self.encoder_groups > 0
        return assign_window(
            self.costs[rows].tolist(), grid_size=grid_size, across_microbatches=across_microbatches,
            planner=PlannerSettings(self.floor, self.encoder_groups),
            encoder_costs=self.encoder_costs[rows].tolist() if two_level else None,
            language_costs=self.language_costs[rows].tolist() if two_level else None,
        )


@dataclass(frozen=True)
class Schedule:
    """What a run reads: dataset size, global micro-batch size B, canonical grid G, seed, shuffling, and with
    ``--skip-bad-samples`` the rows that cannot be processed (``bad_rows``: row -> why), each of which is
    read as the next good row of the global order, as ``SkipBadRows`` replaces it in the graph."""

    dataset_size: int
    micro_batch_size: int
    grid_size: int
    seed: int
    cyclic: bool
    bad_rows: Mapping[int, str] = field(default_factory=dict, compare=False)
    _orders: dict[int, np.ndarray] = field(default_factory=dict, compare=False, repr=False)  # epoch -> order, last one kept

    @property
    def per_epoch(self) -> int:
        return microbatches_per_epoch(self.dataset_size, self.micro_batch_size)

    def end(self, stop: int) -> int:
        """One past the last step consumed when asked for ``stop``: a single pass ends with the data."""
        return stop if self.cyclic else min(stop, self.per_epoch)

    def windows(self, start: int, stop: int, window_size: int) -> Iterator[tuple[int, int]]:
        """[first, last) of every window holding a consumed step; the Windower aligns windows to
        multiples of W and cuts one short only where the data ends."""
        end = self.end(stop)
        first = resume_point(start, window_size).first_step
        for k in range(first, end, window_size):
            yield k, (k + window_size if self.cyclic else min(k + window_size, self.per_epoch))

    def rows(self, steps: range) -> np.ndarray:
        """(len(steps), B) dataset rows of global micro-batches ``steps`` in canonical order
        (``sharding.global_microbatch_indices``, with one epoch order computed per epoch)."""
        batch, per_epoch = self.micro_batch_size, self.per_epoch
        out = np.empty((len(steps), batch), dtype=np.int64)
        for i, step in enumerate(steps):
            epoch, within = divmod(step, per_epoch)
            out[i] = self._order(epoch)[within * batch : (within + 1) * batch]
            if self.bad_rows:
                out[i] = self._replaced(step, out[i])[0]
        return out

    def replaced_rows(self, step: int) -> dict[int, list[int]]:
        """Per canonical position of global micro-batch ``step`` whose row is bad: the bad rows skipped there,
        in order (the row read, then any bad successors), as the run reports them."""
        if not self.bad_rows:
            return {}
        epoch, within = divmod(step, self.per_epoch)
        read = epoch_order(self.dataset_size, epoch, self.seed, self.cyclic)[within * self.micro_batch_size : (within + 1) * self.micro_batch_size]
        return self._replaced(step, read)[1]

    def _replaced(self, step: int, rows: np.ndarray) -> tuple[np.ndarray, dict[int, list[int]]]:
        """``rows`` of ``step`` with every bad row replaced by the next good one, and the rows skipped per position."""
        positions = [p for p, row in enumerate(rows.tolist()) if row in self.bad_rows]
        if not positions:
            return rows, {}
        out, skipped = rows.copy(), {}

        def indices_of(at: int) -> np.ndarray:
            return global_microbatch_indices(at, self.dataset_size, self.micro_batch_size, self.seed, self.cyclic)

        for position in positions:
            first = int(rows[position])
            chain = [first]
            for tries, candidate in enumerate(successor_rows(indices_of, step, first, cyclic=self.cyclic, per_epoch=self.per_epoch)):
                if tries >= MAX_TRIES:
                    raise too_many_bad(first, f"dataset row {first}: {self.bad_rows[first]}", MAX_TRIES)
                if candidate not in self.bad_rows:
                    out[position] = candidate
                    break
                chain.append(candidate)
            skipped[position] = chain
        return out, skipped

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            self._orders.clear()
            self._orders[epoch] = epoch_order(self.dataset_size, epoch, self.seed, self.cyclic)
        return self._orders[epoch]


def replay(
    schedule: Schedule,
    planner: Planner,
    *,
    start: int,
    stop: int,
    reorder: bool,
    window_size: int,
    across_microbatches: bool,
    progress: Callable[[int], None] | None = None,
) -> GridReplay:
    """The consumed micro-batches ``start .. stop-1`` as a run with these settings consumes them."""
    window_size = window_size if reorder else 1
    batch, grid = schedule.micro_batch_size, schedule.grid_size
    canonical_slot = np.arange(batch) // (batch // grid)
    steps, befores, afters, slots, read_steps, positions = [], [], [], [], [], []
    for first, last in schedule.windows(start, stop, window_size):
        rows = schedule.rows(range(first, last))
        if reorder:
            assignment = planner.assign(rows, grid, across_microbatches)
            flat = np.array([[index for slot in microbatch for index in slot] for microbatch in assignment], dtype=np.int64)
        else:
            flat = np.arange(rows.size, dtype=np.int64).reshape(rows.shape)
        keep = [m for m in range(last - first) if start <= first + m < stop]
        steps.extend(first + m for m in keep)
        befores.append(rows[keep])
        afters.append(rows.reshape(-1)[flat[keep]])
        slots.append(canonical_slot[flat[keep] % batch])
        read_steps.append(first + flat[keep] // batch)
        positions.append(flat[keep] % batch)
        if progress is not None:
            progress(len(keep))
    if not steps:
        empty = np.empty((0, batch), dtype=np.int64)
        return GridReplay(np.empty(0, dtype=np.int64), empty, empty, empty, empty, empty)
    return GridReplay(np.array(steps, dtype=np.int64), np.concatenate(befores), np.concatenate(afters), np.concatenate(slots),
                      np.concatenate(read_steps), np.concatenate(positions))


def rank_loads(rows: np.ndarray, tokens: np.ndarray, dp_size: int) -> np.ndarray:
    """(steps, dp_size) per-rank sums of ``tokens`` for micro-batches given as canonical rows."""
    steps, batch = rows.shape
    return tokens[rows].reshape(steps, dp_size, batch // dp_size).sum(axis=2)


def spread_and_path(loads: np.ndarray) -> tuple[float, int]:
    """(mean over steps of heaviest - lightest rank, sum over steps of the heaviest rank)."""
    if loads.shape[0] == 0:
        return 0.0, 0
    return float((loads.max(axis=1) - loads.min(axis=1)).mean()), int(loads.max(axis=1).sum())


def critical_path_bounds(
    schedule: Schedule, values: np.ndarray, dp_size: int, *, start: int, stop: int, window_size: int, across_microbatches: bool,
    floor: int = 0,
) -> list[tuple[int, int]] | None:
    """Lower bounds on the critical path (``values`` of the heaviest rank, summed over the consumed steps)
    of any equal-count balancing with these windows, as (last step covered, bound) in step order: one per
    consumed step, or per window when samples may move across micro-batches. A rank's load per micro-batch
    counts at least ``floor``. None where a consumed window is cut by ``start`` or ``stop`` (its samples
    could have moved to steps outside the range)."""
    bounds = []
    for first, last in schedule.windows(start, stop, window_size):
        if across_microbatches and (first < start or last > schedule.end(stop)):
            return None
        rows = schedule.rows(range(first, last))
        if across_microbatches:
            # Each micro-batch's heaviest rank carries at least the floor: the window's path is at least W floors.
            bounds.append((last - 1, max(window_lower_bound(values[rows].tolist(), dp_size, across_microbatches=True), (last - first) * floor)))
            continue
        for m in range(last - first):
            if start <= first + m < stop:
                bounds.append((first + m, max(window_lower_bound([values[rows[m]].tolist()], dp_size, across_microbatches=False), floor)))
    return bounds


def critical_path_bound(
    schedule: Schedule, values: np.ndarray, dp_size: int, *, start: int, stop: int, window_size: int, across_microbatches: bool,
    floor: int = 0,
) -> int | None:
    """The sum of :func:`critical_path_bounds`: a lower bound on the whole critical path (None where a
    window is cut)."""
    bounds = critical_path_bounds(schedule, values, dp_size, start=start, stop=stop, window_size=window_size,
                                  across_microbatches=across_microbatches, floor=floor)
    return None if bounds is None else sum(bound for _, bound in bounds)
