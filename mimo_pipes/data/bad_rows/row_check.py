"""Whether a dataset row would train: the verdict ``mimo-pipes check`` gives each row, without training.

A row is checked as a run's graph counts it before the exchange
(:func:`~mimo_pipes.data.processing.row_layout.header_layout`): its conversation, every image's and
video's header (paths resolved inside the image folder), the placeholders the processor makes against the
chat's image markers, and the fit to ``--seq-length``. A row whose sizes no header gives is processed, as
the run processes it for its cost. With ``decode`` every image and video frame is also decoded in full: a
file cut short after its header is found only so. A row whose text gives way to ``--seq-length`` is not
bad: its verdict says how long it was; a row left with no token to train on is.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass

from mimo_pipes.data import bad_rows
from mimo_pipes.data.processing.conversation import row_images, row_videos
from mimo_pipes.data.processing.media import open_image, open_video
from mimo_pipes.data.processing.processor import SampleProcessor
from mimo_pipes.data.processing.row_counter import RowCounter, cost_reason
from mimo_pipes.errors import SampleError, row_reason
from mimo_pipes.samples.sample import SAMPLE_ID


@dataclass(frozen=True)
class Verdict:
    """One row's outcome. ``kind`` (a :mod:`~mimo_pipes.data.bad_rows` phrase) and ``reason`` (one line,
    without the row's name) say what is wrong, None for a good row; ``truncated_from``: its tokens before
    the text gave way to ``--seq-length``; ``processed``: why its sizes had to come from processing it."""

    kind: str | None = None
    reason: str | None = None
    truncated_from: int | None = None
    processed: str | None = None

    @property
    def bad(self) -> bool:
        return self.kind is not None


class RowChecker:
    """``checker(row) -> Verdict`` for rows of one processor (``row["sample_id"]`` names the row in its
    reasons). Picklable, for worker processes."""

    def __init__(self, processor: SampleProcessor, *, decode: bool = False) -> None:
        self.rows = RowCounter(processor)
        unbounded = copy.copy(processor)
        unbounded.seq_length = sys.maxsize  # the same row, nothing cut: how long it was
        self.unbounded = RowCounter(unbounded)
        self.decode = decode

    def __call__(self, row: dict) -> Verdict:
        try:
            return self._checked(row)
        except SampleError as error:
            return Verdict(kind=error.kind or bad_rows.OTHER, reason=row_reason(error))

    def _checked(self, row: dict) -> Verdict:
        processed = None
        try:
            length = len(self.rows.layout(row)[0])
        except SampleError:
            raise
        except Exception as error:  # noqa: BLE001 - no size from a header: processed, as the run counts it
            processed = cost_reason(error)
            length = _processed_length(self.rows.processor, row)
        truncated_from = None
        if length == self.rows.processor.seq_length:  # cut to it, or exactly as long
            full = _processed_length(self.unbounded.processor, row) if processed else len(self.unbounded.layout(row)[0])
            truncated_from = full if full > length else None
        if self.decode and processed is None:  # processing decoded them already
            _decode(row, self.rows.processor.image_folder)
        return Verdict(truncated_from=truncated_from, processed=processed)


def _processed_length(processor: SampleProcessor, row: dict) -> int:
    return int(processor(dict(row))["input_ids"].shape[0])


def _decode(row: dict, image_folder: str | None) -> None:
    """Every image and video frame of ``row`` decoded in full, as processing decodes them."""
    sample_id = row.get(SAMPLE_ID, row.get("id"))
    for k, item in enumerate(row_images(row)):
        open_image(item, image_folder, sample_id, f"image {k}")
    for k, item in enumerate(row_videos(row)):
        open_video(item, image_folder, sample_id, k)
