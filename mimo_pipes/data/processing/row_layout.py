"""A row's token layout from its text and its media's header sizes: what counting a row (before the exchange)
and processing it for the language module (after it) both read, written once.

:func:`header_layout` lays the row out as processing would (the chat through the tokenizer, each image's and
video's header size through the family's resize rule, :meth:`~mimo_pipes.data.processing.processor.SampleProcessor.token_layout`)
without decoding a pixel; :func:`compact_layout` is what the language module's row carries across the exchange,
and :func:`expanded` the token ids and trained flags it stands for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from mimo_pipes.data.processing.conversation import conversation
from mimo_pipes.data.processing.media_sizes import media_sizes
from mimo_pipes.data.processing.processor import SampleProcessor
from mimo_pipes.samples.cost import placeholder_mask
from mimo_pipes.samples.sample import SAMPLE_ID

IDS, TRAINED, RUNS = "input_ids", "trained", "placeholder_runs"
"""A compact layout's keys besides the layout fields: token ids, trained flags, each placeholder run's [position, length]."""


def row_name(row: dict) -> Any:
    """What names ``row`` in an error: its sample id, else its own ``id``."""
    return row.get(SAMPLE_ID, row.get("id"))


def header_layout(processor: SampleProcessor, row: dict) -> tuple[list[int], list[bool], dict[str, np.ndarray]]:
    """The row's token ids, which of them are trained, and its layout fields (``image_grid_thw``, ...), from
    its text and its media's header sizes. Raises the row's SampleError, or another exception when a size
    cannot be read from a header."""
    family = processor.family
    sample_id = row_name(row)
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


def compact_layout(ids: Sequence[int] | np.ndarray, trained: Sequence[bool], fields: dict[str, np.ndarray], placeholder_ids: Any,
                   inside: np.ndarray | None = None) -> dict[str, torch.Tensor]:
    """What the language side needs of a row, compact: its int32 token ids (vocabularies are far below
    2**31) with each placeholder run as one token, the trained flags alike (constant along a run, which lies
    inside one chat segment; checked), each run's ``[position, length]``, and the layout fields. ``inside``:
    the ids' :func:`~mimo_pipes.samples.cost.placeholder_mask`, when the caller has it already."""
    full, flags = np.asarray(ids, dtype=np.int32), np.asarray(trained, dtype=np.bool_)
    if inside is None:
        inside = placeholder_mask(full, placeholder_ids)
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


def expanded(layout: dict[str, torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """The token ids and trained flags a compact layout stands for."""
    ids, trained, runs = layout[IDS].numpy(), layout[TRAINED].numpy(), layout[RUNS].numpy()
    repeats = np.ones(ids.shape[0], dtype=np.int64)
    repeats[runs[:, 0]] = runs[:, 1]
    return np.repeat(ids, repeats), np.repeat(trained, repeats)
