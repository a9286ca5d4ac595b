"""A dataset row counted from its text and image headers, and processed into one module's fields only.

With ``--exchange-payload rows`` the exchange moves dataset rows, not processed samples. Every module
counts each row it reads before the exchange (:meth:`ModuleProcessor.count`): the chat through the
tokenizer and each image's and video's header size through the family's own resize rule
(:meth:`~mimo_pipes.data.processing.families.PatchFamily.image_layout`), laid out by
:meth:`~mimo_pipes.data.processing.processor.SampleProcessor.token_layout`, so no pixel is decoded and the counts
are the processed ones. The rank that trains on the row then processes it after the exchange
(:meth:`ModuleProcessor.__call__`) into its module's fields (:mod:`mimo_pipes.samples.module_fields`): the
language module from the text and the image sizes alone, an encoder module by processing the row. Either
way the result is, field for field and bit for bit, what :class:`~mimo_pipes.data.processing.processor.SampleProcessor`
makes of the row with the module's other fields dropped (a test holds every family to it).

A row whose sizes cannot be read from headers (an item kind this module does not know, a size the resize
rule refuses) is processed for its cost instead, and counted in :attr:`ModuleProcessor.processed_for_cost`
with its reason (:attr:`ModuleProcessor.processed_for_cost_reasons`; the first of each reason is logged);
a row the processor would refuse raises the processor's own :class:`~mimo_pipes.errors.SampleError`.
``mimo-pipes analyze`` counts rows with the same :meth:`ModuleProcessor.counts` and says how many were
processed, and why (:func:`cost_line`).
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
from mimo_pipes.data.processing.conversation import conversation
from mimo_pipes.data.processing.media_sizes import MediaSizes, UnreadableHeader, encoded_media, media_sizes
from mimo_pipes.data.processing.processor import CONSUMED_KEYS, SampleProcessor, token_fields
from mimo_pipes.errors import SampleError
from mimo_pipes.samples.cost import image_token_count, placeholder_runs
from mimo_pipes.samples.module_fields import ModuleFields
from mimo_pipes.samples.sample import IMAGE_TOKENS, PLACEHOLDER_RUNS, REAL_TOKENS, SAMPLE_ID, TOKEN_LAYOUT, Sample

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


class ModuleProcessor:
    """Counts rows before the exchange and makes ``fields``' part of them after it (see the module doc).

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
        """The row's token ids, which of them are trained, and its layout fields (``image_grid_thw``, ...),
        from its text and its media's header sizes. Raises the row's SampleError, or another exception
        when a size cannot be read from a header."""
        processor, family = self.processor, self.processor.family
        sample_id = row.get(SAMPLE_ID, row.get("id"))
        turns = conversation(row, sample_id)
        sizes = media_sizes(row, processor.image_folder, sample_id)
        fields: dict[str, np.ndarray] = {}
        media: dict[str, list[list[int]]] = {family.image_pad: []}
        if sizes.images:
            layout, media[family.image_pad] = family.image_layout(sizes.images, sample_id)
            fields.update(layout)
        if sizes.videos:
            layout, media[family.video_pad] = family.video_layout(sizes.videos, sample_id)
            fields.update(layout)
        ids, trained = processor.token_layout(turns, media, sample_id, len(sizes.images), len(sizes.videos))
        return ids, trained, fields

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
            row = encoded_media(row, self.processor.image_folder, row.get(SAMPLE_ID, row.get("id")), keep_paths=self.image_paths)
        if self.whole_files:
            check_row_images(row, self.processor.image_folder, row.get(SAMPLE_ID, row.get("id")))
        (image_tokens, real_tokens, lengths), layout = self._counted(row, runs=True)
        counts = {IMAGE_TOKENS: image_tokens, REAL_TOKENS: real_tokens, PLACEHOLDER_RUNS: lengths}
        if self.fields.pixels or layout is None:  # an encoder processes the row; so does a row without a cheap layout
            return {**row, **counts}
        return {**{key: value for key, value in row.items() if key not in CONSUMED_KEYS}, **counts, TOKEN_LAYOUT: layout}

    @bad_rows.names_place
    def __call__(self, row: dict) -> Sample:
        """This module's fields of ``row`` (a row :meth:`count` made, or a plain one), and every key the
        processor passes through."""
        layout = row.get(TOKEN_LAYOUT)
        if TOKEN_LAYOUT in row or PLACEHOLDER_RUNS in row:
            row = {key: value for key, value in row.items() if key not in (TOKEN_LAYOUT, PLACEHOLDER_RUNS)}
        if self.fields.pixels:
            return self.fields.select(self.processor(row))
        if layout is None:
            try:
                layout = _token_layout(*self.layout(row), self.processor.placeholder_ids)
            except SampleError:
                raise
            except Exception:  # noqa: BLE001 - no cheap size: processed, as it was for its cost
                return self.fields.select(self.processor(row))
        out = {key: value for key, value in row.items() if key not in CONSUMED_KEYS}
        out.update(token_fields(*_expanded(layout)))
        out.update((name, value) for name, value in layout.items() if name not in (IDS, TRAINED, RUNS))
        return out

    @bad_rows.names_place
    def stand_in(self, row: dict) -> Sample:
        """What this module trains on in place of ``row`` when processing it failed after the exchange (see
        :mod:`mimo_pipes.samples.masking`): an encoder processes the row with every image and video blank
        (black, of its header's size, so its fields have the shapes its cost was counted for); the language
        module's fields need no pixel, so they are the row's own. Raises when the sizes cannot be read."""
        if not self.fields.pixels:
            return self(row)
        sizes = media_sizes(row, self.processor.image_folder, row.get(SAMPLE_ID, row.get("id")))
        return self(_with_blank_media(row, sizes))

    def _counted(self, row: dict, runs: bool) -> tuple[RowCount, dict[str, torch.Tensor] | None]:
        try:
            ids, trained, fields = self.layout(row)
        except SampleError:
            raise
        except Exception as error:  # noqa: BLE001 - no cheap size: the processor counts it, or names the row's fault
            sample = self.processor(dict(row))
            why = cost_reason(error)
            with self._lock:
                self._processed_for_cost += 1
                new = why not in self._cost_reasons and len(self._cost_reasons) < MAX_COST_REASONS
                if new or why in self._cost_reasons:
                    self._cost_reasons[why] = self._cost_reasons.get(why, 0) + 1
            if new:
                logger.warning("sample %r: sizes not readable from headers (%s); processed for its cost (further rows "
                               "for this reason are counted: ModuleProcessor.processed_for_cost_reasons)",
                               row.get(SAMPLE_ID, row.get("id")), why)
            ids, layout = sample["input_ids"].numpy(), None
        else:
            layout = _token_layout(ids, trained, fields, self.processor.placeholder_ids)
            ids = np.asarray(ids, dtype=np.int64)
        placeholders = self.processor.placeholder_ids
        lengths = placeholder_runs(ids, placeholders) if runs else []
        return (image_token_count(ids, placeholders), int(ids.shape[0]), lengths), layout


IDS, TRAINED, RUNS = "input_ids", "trained", "placeholder_runs"


def _with_blank_media(row: dict, sizes: MediaSizes) -> dict:
    """``row`` with its images and videos (under whichever key it keeps them) black, at their sizes."""
    from PIL import Image

    out = dict(row)
    images = [Image.new("RGB", (width, height)) for height, width in sizes.images]
    videos = [np.zeros((frames, height, width, 3), dtype=np.uint8) for frames, height, width in sizes.videos]
    for keys, blank in ((("images", "image"), images), (("videos", "video"), videos)):
        key = keys[0] if row.get(keys[0]) is not None else keys[1]
        if row.get(key) is not None:
            out[key] = blank if isinstance(row[key], (list, tuple)) else blank[0]
    return out


def _token_layout(ids: list[int], trained: list[bool], fields: dict[str, np.ndarray], placeholder_ids: Any) -> dict[str, torch.Tensor]:
    """What the language side needs of a row, compact: its int32 token ids (vocabularies are far below
    2**31) with each placeholder run as one token, the trained flags alike (constant along a run, which lies
    inside one chat segment; checked), each run's ``[position, length]``, and the layout fields."""
    full, flags = np.asarray(ids, dtype=np.int32), np.asarray(trained, dtype=np.bool_)
    inside = np.isin(full, np.asarray(placeholder_ids, dtype=np.int32))
    if full.shape[0]:
        starts = inside & np.concatenate(([True], (full[1:] != full[:-1]) | ~inside[:-1]))
    else:
        starts = inside
    if np.any(flags[inside] != flags[np.flatnonzero(starts)][np.cumsum(starts)[inside] - 1]):
        starts = inside = np.zeros_like(inside)  # a run whose flags change (no chat template we know): kept whole
    kept = ~inside | starts
    lengths = np.diff(np.append(np.flatnonzero(kept), full.shape[0]))[starts[kept]]
    positions = np.flatnonzero(starts[kept])
    layout = {
        IDS: torch.from_numpy(np.ascontiguousarray(full[kept])),
        TRAINED: torch.from_numpy(flags[kept]),
        RUNS: torch.from_numpy(np.stack([positions, lengths], axis=1).astype(np.int32).reshape(-1, 2)),
    }
    layout.update((name, torch.from_numpy(np.ascontiguousarray(value))) for name, value in fields.items())
    return layout


def _expanded(layout: dict[str, torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """The token ids and trained flags a compact layout stands for."""
    ids, trained, runs = layout[IDS].numpy(), layout[TRAINED].numpy(), layout[RUNS].numpy()
    repeats = np.ones(ids.shape[0], dtype=np.int64)
    repeats[runs[:, 0]] = runs[:, 1]
    return np.repeat(ids, repeats), np.repeat(trained, repeats)
