"""``--skip-bad-samples``: a row that cannot be processed is replaced by the next good row of the global order.

"Next" is a pure function of the sample's global position (its step and its place in that global
micro-batch): the later positions of the same global micro-batch, then the following global micro-batches
in order (``single`` data wraps around). It does not depend on the layout: every module and every DP rank
computes the same replacement without talking, and a resumed run, on this layout or another (which reads
the same global positions again), replaces the same rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from mimo_pipes.errors import SampleError, as_count, row_reason
from mimo_pipes.nodes.canonical_shard_reader import MapStyleDataset
from mimo_pipes.parallel.sharding import global_microbatch_indices, microbatches_per_epoch
from mimo_pipes.samples.sample import SAMPLE_ID, SLOT, STEP, Sample

REPLACED_ROWS = "replaced_rows"
"""Sample key: the dataset rows this sample stands in for (empty when it is its own row)."""
REPLACED_REASONS = "replaced_reasons"
"""Sample key: why each of ``replaced_rows`` could not be processed (its SampleError, one line)."""
MAX_TRIES = 64


def successor_rows(indices_of: Callable[[int], Any], step: int, index: int, *, cyclic: bool, per_epoch: int) -> Iterator[int]:
    """The rows after global position (``step``, place of ``index``) in the global order: the rest of that global
    micro-batch, then the following ones (``indices_of(step)``: a global micro-batch's rows; ``single`` data
    wraps around after ``per_epoch`` micro-batches). What stands in for a bad row is the first good one."""
    current = [int(i) for i in indices_of(step)]
    yield from current[current.index(index) + 1 :]
    later = step + 1
    while True:
        probe = later if cyclic else later % per_epoch
        yield from (int(i) for i in indices_of(probe))
        later += 1


def too_many_bad(index: int, error: object, max_tries: int) -> SampleError:
    """The error when the ``max_tries`` rows after a bad one are all bad too (``error``: the first row's
    SampleError, or its text; said once, without a second "sample N:")."""
    text = error.reason if isinstance(error, SampleError) and error.reason is not None else error
    return SampleError(index, f"{text} (and the {max_tries} rows after it failed too)")


class SkipBadRows:
    """Wraps a per-sample ``process`` (a map function): on :class:`SampleError`, processes the rows that follow
    the sample in the global order until one succeeds. The result keeps the step and slot, takes the good row's
    ``sample_id``, lists the skipped rows under ``replaced_rows`` and why each failed under
    ``replaced_reasons`` (the same on every module: processing a row fails alike everywhere)."""

    def __init__(
        self,
        process: Callable[[dict], Sample],
        dataset: MapStyleDataset,
        *,
        micro_batch_size: int,
        seed: int,
        dataloader_type: str,
        max_tries: int = MAX_TRIES,
    ) -> None:
        self.process = process
        self.dataset = dataset
        self.micro_batch_size = as_count(micro_batch_size, "micro_batch_size", minimum=1)
        self.seed = as_count(seed, "seed")
        self.shuffle = dataloader_type == "cyclic"
        self.cyclic = self.shuffle
        self.per_epoch = microbatches_per_epoch(len(dataset), self.micro_batch_size)
        self.max_tries = as_count(max_tries, "max_tries", minimum=1)

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
        return global_microbatch_indices(step, len(self.dataset), self.micro_batch_size, self.seed, self.shuffle)

    def _successors(self, step: int, index: int) -> Iterator[int]:
        return successor_rows(self._indices, step, index, cyclic=self.cyclic, per_epoch=self.per_epoch)

    def _replace(self, row: dict, error: SampleError) -> Sample:
        step, slot, index = int(row[STEP]), int(row[SLOT]), int(row[SAMPLE_ID])
        skipped, reasons = [index], [row_reason(error)]
        for tries, candidate in enumerate(self._successors(step, index)):
            if tries >= self.max_tries:
                break
            attempt: dict[str, Any] = dict(self.dataset[candidate])
            attempt.update({SAMPLE_ID: candidate, STEP: step, SLOT: slot})
            try:
                sample = self.process(attempt)
            except SampleError as failed:
                skipped.append(candidate)
                reasons.append(row_reason(failed))
                continue
            sample[REPLACED_ROWS] = skipped
            sample[REPLACED_REASONS] = reasons
            return sample
        raise too_many_bad(index, error, self.max_tries) from error
