"""A dataset row counted before the exchange, from its text and image headers: :class:`RowCounter`.

With ``--exchange-payload rows`` the exchange moves dataset rows, not processed samples. Every module counts
each row it reads before the exchange (:meth:`RowCounter.count`): the chat through the tokenizer and each
image's and video's header size through the family's own resize rule
(:meth:`~mimo_pipes.data.processing.families.PatchFamily.image_layout`), laid out as processing lays them out
(:func:`~mimo_pipes.data.processing.row_layout.header_layout`), so no pixel is decoded and the counts are the
processed ones. What it hands on is the part of the row its module moves; the rank that trains on the row
processes it after the exchange (:class:`~mimo_pipes.data.processing.module_processor.ModuleProcessor`).

A row whose sizes cannot be read from headers (an item kind this module does not know, a size the resize
rule refuses) is processed for its cost instead, and counted in :attr:`RowCounter.processed_for_cost` with
its reason (:attr:`RowCounter.processed_for_cost_reasons`; the first of each reason is logged); a row the
processor would refuse raises the processor's own :class:`~mimo_pipes.errors.SampleError`.
``mimo-pipes analyze`` counts rows with the same :meth:`RowCounter.counts` and says how many were processed,
and why (:func:`cost_line`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from mimo_pipes.data import bad_rows
from mimo_pipes.data.bad_rows.complete_files import check_row_images
from mimo_pipes.data.processing.media_sizes import UnreadableHeader, encoded_media
from mimo_pipes.data.processing.processor import CONSUMED_KEYS, SampleProcessor
from mimo_pipes.data.processing.row_layout import compact_layout, header_layout, row_name
from mimo_pipes.errors import SampleError
from mimo_pipes.samples.cost import placeholder_mask, placeholder_runs
from mimo_pipes.samples.module_fields import ModuleFields
from mimo_pipes.samples.sample import IMAGE_TOKENS, PLACEHOLDER_RUNS, REAL_TOKENS, TOKEN_LAYOUT, Sample

logger = logging.getLogger(__name__)

RowCount = tuple[int, int, list[int]]
"""(image tokens, real tokens, placeholder run lengths) of one row."""
MAX_COST_REASONS = 8  # distinct reasons kept (a row-specific message must not grow without bound)


def cost_reason(error: BaseException) -> str:
    """Why a row's sizes had to come from processing it, one line (``image 0: unsupported image type list``)."""
    if isinstance(error, UnreadableHeader):
        return str(error)
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def cost_line(processed: int, total: int, reasons: Mapping[str, int]) -> str:
    """The line ``analyze`` and ``check`` print about how the rows' costs were counted."""
    if not processed:
        return f"costs: all {total} rows counted from their text and image headers, none processed"
    listed = "; ".join(f"{reason}: {count} row{'s' * (count != 1)}" for reason, count in reasons.items())
    more = "; other reasons" if sum(reasons.values()) < processed else ""
    return f"costs: {processed} of {total} rows were processed to count them ({listed}{more})"


class RowCounter:
    """Counts rows before the exchange and makes what ``fields``' module moves of them (see the module doc).

    ``image_paths``: rows keep their images' paths when they move (every rank reads the same files);
    otherwise :meth:`count` reads each image file given by path into the row as encoded bytes.
    ``whole_files`` (``--skip-bad-samples``): :meth:`count` also refuses a row whose image file is not
    whole (:mod:`~mimo_pipes.data.bad_rows.complete_files`: cut short, or not framed as its header says), on every
    module alike, so that the row is replaced before the exchange rather than failing after it. Picklable
    (for worker processes); safe to call from several threads."""

    def __init__(
        self, processor: SampleProcessor, fields: ModuleFields | None = None, *, image_paths: bool = False,
        whole_files: bool = False,
    ) -> None:
        self.processor = processor
        self.fields = fields or ModuleFields()
        self.image_paths = image_paths
        self.whole_files = whole_files
        self._lock = threading.Lock()
        self._processed_for_cost = 0
        self._cost_reasons: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def processed_for_cost(self) -> int:
        """Rows counted by processing them, since sizes could not be read from their headers."""
        return self._processed_for_cost

    @property
    def processed_for_cost_reasons(self) -> dict[str, int]:
        """Why rows were processed for their cost: each distinct reason (the first ``MAX_COST_REASONS``, in
        the order met) and how many rows it concerned."""
        with self._lock:
            return dict(self._cost_reasons)

    def layout(self, row: dict) -> tuple[list[int], list[bool], dict[str, np.ndarray]]:
        """The row's token ids, trained flags and layout fields from its headers
        (:func:`~mimo_pipes.data.processing.row_layout.header_layout` with this counter's processor)."""
        return header_layout(self.processor, row)

    @bad_rows.names_place
    def counts(self, row: dict, *, runs: bool = True) -> RowCount:
        """(image tokens, real tokens, placeholder runs) of ``row`` as processing it would give them;
        ``runs`` False leaves the runs empty (they cost a pass over the ids)."""
        return self._counted(row, runs)[0]

    @bad_rows.names_place
    def count(self, row: dict) -> Sample:
        """The row as this module moves it, with its counts as metadata (image tokens, real tokens,
        placeholder runs). An encoder module's row keeps its text and its images as encoded bytes
        (:func:`~mimo_pipes.data.processing.media_sizes.encoded_media`; files stay paths with ``image_paths``); the
        language module's row is only its token layout (its token ids with each placeholder run as one
        token, trained flags, layout fields: a few bytes per text token) and the keys the processor passes
        through, so it builds its fields after the exchange without its images or tokenizing again.
        Raises the row's SampleError."""
        if self.fields.pixels:
            row = encoded_media(row, self.processor.image_folder, row_name(row), keep_paths=self.image_paths)
        if self.whole_files:
            check_row_images(row, self.processor.image_folder, row_name(row))
        (image_tokens, real_tokens, lengths), layout = self._counted(row, runs=True)
        counts = {IMAGE_TOKENS: image_tokens, REAL_TOKENS: real_tokens, PLACEHOLDER_RUNS: lengths}
        if self.fields.pixels or layout is None:  # an encoder processes the row; so does a row without a cheap layout
            return {**row, **counts}
        return {**{key: value for key, value in row.items() if key not in CONSUMED_KEYS}, **counts, TOKEN_LAYOUT: layout}

    def _counted(self, row: dict, runs: bool) -> tuple[RowCount, dict[str, torch.Tensor] | None]:
        placeholders = self.processor.placeholder_ids
        try:
            listed, trained, fields = header_layout(self.processor, row)
        except SampleError:
            raise
        except Exception as error:  # noqa: BLE001 - no cheap size: the processor counts it, or names the row's fault
            sample = self.processor(dict(row))
            self._processed(row, cost_reason(error))
            ids, layout = sample["input_ids"].numpy(), None
            inside = placeholder_mask(ids, placeholders)
        else:
            # One array and one placeholder mask serve the layout and the counts (int32: vocabularies are far
            # below 2**31): rows are counted on the rank's own process, beside its training thread.
            ids = np.asarray(listed, dtype=np.int32)
            inside = placeholder_mask(ids, placeholders)
            layout = compact_layout(ids, trained, fields, placeholders, inside)
        lengths = placeholder_runs(ids, placeholders, inside) if runs else []
        return (int(np.count_nonzero(inside)), int(ids.shape[0]), lengths), layout

    def _processed(self, row: dict, why: str) -> None:
        """Count a row processed for its cost, and why; the first row of each reason is logged."""
        with self._lock:
            self._processed_for_cost += 1
            new = why not in self._cost_reasons and len(self._cost_reasons) < MAX_COST_REASONS
            if new or why in self._cost_reasons:
                self._cost_reasons[why] = self._cost_reasons.get(why, 0) + 1
        if new:
            logger.warning("sample %r: sizes not readable from headers (%s); processed for its cost (further rows "
                           "for this reason are counted: RowCounter.processed_for_cost_reasons)", row_name(row), why)
