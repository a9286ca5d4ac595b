"""``--skip-bad-samples``: a row that cannot be processed is replaced by the next good row of its slot.

"Next" is a pure function of the sample's step and canonical slot: the slot's later positions in the same
global micro-batch, then the slot's positions in the following micro-batches (``single`` data wraps
around). Every module and every DP rank computes the same replacement without talking, and a resumed run
(which reads the same step and slot again) replaces the same rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from mimo_pipes.errors import SampleError
from mimo_pipes.nodes.canonical_shard_reader import MapStyleDataset
from mimo_pipes.sample import SAMPLE_ID, SLOT, STEP, Sample
from mimo_pipes.sharding import global_microbatch_indices, microbatches_per_epoch

REPLACED_ROWS = "replaced_rows"
"""Sample key: the dataset rows this sample stands in for (empty when it is its own row)."""
REPLACED_REASONS = "replaced_reasons"
"""Sample key: why each of ``replaced_rows`` could not be processed (its SampleError, one line)."""
MAX_TRIES = 64
MAX_REASON = 300  # characters of a reason kept: a report line, not a traceback


def reason(error: SampleError) -> str:
    """What was wrong with a row, without the "sample ..., field ...: dataset row N:" that says where."""
    text = " ".join(str(error.reason if error.reason is not None else error).split())
    prefix = f"dataset row {error.sample_id}: "
    text = text.removeprefix(prefix)
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


class SkipBadRows:
    """Wraps a per-sample ``process`` (a map function): on :class:`SampleError`, processes the next rows of
    the sample's slot until one succeeds. The result keeps the step and slot, takes the good row's
    ``sample_id``, lists the skipped rows under ``replaced_rows`` and why each failed under
    ``replaced_reasons`` (the same on every module: processing a row fails alike everywhere)."""

    def __init__(
        self,
        process: Callable[[dict], Sample],
        dataset: MapStyleDataset,
        *,
        microbatch_size: int,
        grid_size: int,
        seed: int,
        dataloader_type: str,
        max_tries: int = MAX_TRIES,
    ) -> None:
        self.process = process
        self.dataset = dataset
        self.microbatch_size = microbatch_size
        self.samples_per_slot = microbatch_size // grid_size
        self.seed = seed
        self.shuffle = dataloader_type == "cyclic"
        self.cyclic = self.shuffle
        self.per_epoch = microbatches_per_epoch(len(dataset), microbatch_size)
        self.max_tries = max_tries

    def __call__(self, row: dict) -> Sample:
        try:
            sample = self.process(row)
        except SampleError as error:
            sample = self._replace(row, error)
        else:
            sample[REPLACED_ROWS] = []
            sample[REPLACED_REASONS] = []
        return sample

    def _indices(self, step: int):
        return global_microbatch_indices(step, len(self.dataset), self.microbatch_size, self.seed, self.shuffle)

    def _successors(self, step: int, slot: int, index: int) -> Iterator[int]:
        first = slot * self.samples_per_slot
        positions = range(first, first + self.samples_per_slot)
        current = self._indices(step)
        after = [int(current[p]) for p in positions]
        yield from after[after.index(index) + 1 :]
        later = step + 1
        while True:
            probe = later if self.cyclic else later % self.per_epoch
            ids = self._indices(probe)
            yield from (int(ids[p]) for p in positions)
            later += 1

    def _replace(self, row: dict, error: SampleError) -> Sample:
        step, slot, index = int(row[STEP]), int(row[SLOT]), int(row[SAMPLE_ID])
        skipped, reasons = [index], [reason(error)]
        for tries, candidate in enumerate(self._successors(step, slot, index)):
            if tries >= self.max_tries:
                break
            attempt: dict[str, Any] = dict(self.dataset[candidate])
            attempt.update({SAMPLE_ID: candidate, STEP: step, SLOT: slot})
            try:
                sample = self.process(attempt)
            except SampleError as failed:
                skipped.append(candidate)
                reasons.append(reason(failed))
                continue
            sample[REPLACED_ROWS] = skipped
            sample[REPLACED_REASONS] = reasons
            return sample
        raise SampleError(index, f"{error} (and the next {self.max_tries} rows of its slot failed too)") from error
