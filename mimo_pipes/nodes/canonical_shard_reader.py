"""CanonicalShardReader: this DP rank's canonical slots of every global micro-batch, one sample at a time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from mimo_pipes.checkpoint.resume import ResumePoint
from mimo_pipes.checkpoint.validity import on_saved_layout, source_fingerprint
from mimo_pipes.errors import as_count
from mimo_pipes.nodes.base import GraphNode
from mimo_pipes.parallel.shard_rows import rows_together
from mimo_pipes.parallel.sharding import global_microbatch_indices, microbatches_per_epoch
from mimo_pipes.parallel.topology import owned_positions
from mimo_pipes.samples.sample import SAMPLE_ID, SLOT, STEP, Sample


class MapStyleDataset(Protocol):
    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Mapping[str, Any]: ...


class CanonicalShardReader(GraphNode[Sample]):
    """Reads only this rank's B/d samples of each global micro-batch (scalable DP).

    ``single`` reads the dataset once in order; ``cyclic`` reshuffles each epoch from the seed and never
    ends (which rows: :func:`~mimo_pipes.parallel.sharding.global_microbatch_indices`). Each sample gets its
    dataset index, global step and canonical slot. It starts at the first step the loader tells it
    (:meth:`start_at`) and ends before the step it says reading ends at, if any. The state is two counters (the
    next step and the next of its positions in it), so resuming from a consumed micro-batch count is the same as
    restoring it.
    It is valid for one dataset (length and fingerprint: ``dataset_fingerprint`` if given, else
    :func:`~mimo_pipes.checkpoint.validity.source_fingerprint` of the rows it reads first), B, DP layout, seed and
    dataloader type.
    """

    NEXT_STEP_KEY = "next_step"
    NEXT_POSITION_KEY = "next_position"

    def __init__(
        self,
        dataset: MapStyleDataset,
        *,
        micro_batch_size: int,
        dp_rank: int,
        dp_size: int,
        grid_size: int,
        seed: int = 0,
        dataloader_type: str = "cyclic",
        dataset_fingerprint: str | None = None,
    ) -> None:
        super().__init__()
        if dataloader_type not in ("single", "cyclic"):
            raise ValueError(f"dataloader_type must be single or cyclic, got {dataloader_type!r}")
        # Plain ints (numpy and torch integers too): they go into the state's description, which holds plain values.
        micro_batch_size, grid_size = as_count(micro_batch_size, "micro_batch_size", minimum=1), as_count(grid_size, "grid_size", minimum=1)
        dp_rank, dp_size, seed = as_count(dp_rank, "dp_rank"), as_count(dp_size, "dp_size", minimum=1), as_count(seed, "seed")
        self.dataset = dataset
        self.micro_batch_size = micro_batch_size
        self.dp_rank = dp_rank
        self.grid_size = grid_size
        self.seed = seed
        self.cyclic = dataloader_type == "cyclic"
        self.first_step = 0  # where a fresh start reads from: the loader says (start_at)
        self.end_step: int | None = None  # where reading ends (None: at the data's end, or never): the loader says
        self.positions = owned_positions(dp_rank, dp_size, micro_batch_size)
        self.samples_per_slot = micro_batch_size // grid_size
        self.per_epoch = microbatches_per_epoch(len(dataset), micro_batch_size)
        if self.per_epoch == 0:
            raise ValueError(f"dataset has {len(dataset)} samples, fewer than one micro-batch of {micro_batch_size}")
        self._fingerprint_of_rows = dataset_fingerprint is None
        if dataset_fingerprint is None:  # rows this rank reads first (its own slots of step 0), never others
            dataset_fingerprint = source_fingerprint(dataset, self._first_rows(self.positions))
        self.describe({
            "micro-batch size": micro_batch_size,
            "dp rank": dp_rank,
            "dp size": dp_size,
            "canonical grid size": grid_size,
            "seed": seed,
            "dataloader type": dataloader_type,
            "dataset length": len(dataset),
            "dataset fingerprint": dataset_fingerprint,
        })

    def _first_rows(self, positions: range) -> list[int]:
        return [int(index) for index in self._microbatch(0)[positions.start : positions.stop]]

    def _microbatch(self, step: int) -> np.ndarray:
        """The B dataset indices of global micro-batch ``step``, in canonical order."""
        return global_microbatch_indices(step, len(self.dataset), self.micro_batch_size, self.seed, self.cyclic)

    def valid_for_layout(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        """This reader's description on the layout of a saved description (another DP rank and size): a
        fingerprint of the rows that rank read first is computed over the same rows here (a few rows read
        once, at the restore), so the same data on another layout is recognised, and other data refused."""
        adjusted = on_saved_layout(self.valid_for, saved)
        dp_rank, dp_size = saved.get("dp rank"), saved.get("dp size")
        if self._fingerprint_of_rows and isinstance(dp_rank, int) and isinstance(dp_size, int) and 0 <= dp_rank < dp_size:
            own = str(self.valid_for["dataset fingerprint"])
            if own.startswith("rows:") and self.micro_batch_size % dp_size == 0:
                rows = self._first_rows(owned_positions(dp_rank, dp_size, self.micro_batch_size))
                adjusted["dataset fingerprint"] = source_fingerprint(self.dataset, rows)
        return adjusted

    def start_at(self, point: ResumePoint, saved_state: Any = None) -> None:
        """From the next reset on, read from global micro-batch ``point.first_step`` (a fresh start) and end
        before ``point.end_step``."""
        self.first_step = point.first_step
        self.end_step = point.end_step

    def restore(self, initial_state: dict | None) -> None:
        if initial_state is None:
            self._next_step, self._next_position = self.first_step, 0
        else:
            self._next_step = int(initial_state[self.NEXT_STEP_KEY])
            self._next_position = int(initial_state[self.NEXT_POSITION_KEY])
        self._rows_step: int | None = None  # the step whose rows _rows holds (read together: see _step_rows)
        self._rows: dict[int, dict] | None = None

    def next(self) -> Sample:
        step = self._next_step
        if (not self.cyclic and step >= self.per_epoch) or (self.end_step is not None and step >= self.end_step):
            raise StopIteration
        position = self.positions.start + self._next_position
        index = int(self._microbatch(step)[position])
        if self._rows_step != step:
            self._rows_step, self._rows = step, self._step_rows(step)
        row = self._rows.pop(position) if self._rows is not None else dict(self.dataset[index])
        row[SAMPLE_ID] = index
        row[STEP] = step
        row[SLOT] = position // self.samples_per_slot
        self._next_position += 1
        if self._next_position == len(self.positions):
            self._next_step, self._next_position = step + 1, 0
        return row

    def _step_rows(self, step: int) -> dict[int, dict] | None:
        """The rows of this rank's positions of ``step`` not yet read, by position, read together where the
        dataset can (:func:`~mimo_pipes.parallel.shard_rows.rows_together`: under the GIL that the
        processing threads share, a row at a time cost a Hugging Face dataset a query and a format each);
        None: a row at a time."""
        positions = range(self.positions.start + self._next_position, self.positions.stop)
        indices = [int(i) for i in self._microbatch(step)[positions.start : positions.stop]]
        rows = rows_together(self.dataset, indices)
        return None if rows is None else dict(zip(positions, rows, strict=True))

    def own_state(self) -> dict[str, Any]:
        return {self.NEXT_STEP_KEY: self._next_step, self.NEXT_POSITION_KEY: self._next_position}
