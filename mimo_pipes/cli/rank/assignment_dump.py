"""``--dump-assignments``: what the run summary keeps of each consumed micro-batch, and the per-rank JSON-lines
file it is written to."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import IO, Any

from mimo_pipes.cli.job.output_paths import write_failed
from mimo_pipes.config.job_options import JobOptions
from mimo_pipes.observe.summary import SUMMARY_ONLY_KEYS
from mimo_pipes.parallel.topology import RankPosition
from mimo_pipes.samples.masking import MASKED


def consumed_record(batch: dict[str, Any], position: RankPosition) -> dict[str, Any]:
    """What the run summary keeps of one consumed micro-batch of the rank at ``position``: the
    ``--dump-assignments`` line plus :data:`~mimo_pipes.observe.summary.SUMMARY_ONLY_KEYS`. Under
    ``--skip-bad-samples`` with rows, ``masked_ids`` lists the samples masked in it (samples/masking.py)."""
    record = {
        "module": position.module.name,
        "dp_rank": position.dp_rank,
        "dp_size": position.dp_size,
        "step": batch["step"],
        "sample_ids": batch["sample_ids"],
        "image_tokens": batch["image_tokens"],
        "real_tokens": batch["real_tokens"],
        "slots": batch["slots"],
        "read_steps": batch["read_steps"],
        "tp_rank": position.tp_rank,
        "pp_rank": position.pp_rank,
    }
    if batch.get(MASKED) is not None:
        record["masked_ids"] = [sample for sample, why in zip(batch["sample_ids"], batch[MASKED]) if why is not None]
    return record

class AssignmentDump:
    """``--dump-assignments DIR``: ``DIR/rank{r}.jsonl``, one line per consumed micro-batch (appended to on resume)."""

    def __init__(self, options: JobOptions, rank: int) -> None:
        self.file: IO[str] | None = None
        self.path = Path(options.dump_assignments or ".") / f"rank{rank}.jsonl"
        if options.dump_assignments is not None:
            try:
                os.makedirs(options.dump_assignments, exist_ok=True)
                self.file = open(self.path, "a" if options.resume else "w", buffering=1)
            except OSError as error:
                raise write_failed("--dump-assignments", self.path, error) from None

    def write(self, record: dict[str, Any]) -> None:
        if self.file is not None:
            import json

            try:
                self.file.write(json.dumps({k: v for k, v in record.items() if k not in SUMMARY_ONLY_KEYS}) + "\n")
            except OSError as error:
                self._drop()
                raise write_failed("--dump-assignments", self.path, error) from None

    def close(self) -> None:
        if self.file is not None:
            try:
                self.file.close()
            except OSError as error:
                raise write_failed("--dump-assignments", self.path, error) from None

    def _drop(self) -> None:
        """Close after a failed write without flushing again (the same error, raised from ``close``)."""
        file, self.file = self.file, None
        if file is not None:
            with contextlib.suppress(OSError):
                file.close()
