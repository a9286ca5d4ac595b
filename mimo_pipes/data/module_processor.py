"""A dataset row counted from its text and image headers, and processed into one module's fields only.

With ``--exchange-payload rows`` the exchange moves dataset rows, not processed samples. Every module
counts each row it reads before the exchange (:meth:`ModuleProcessor.count`): the chat through the
tokenizer and each image's and video's header size through the family's own resize rule
(:meth:`~mimo_pipes.data.families.PatchFamily.image_layout`), laid out by
:meth:`~mimo_pipes.data.processor.SampleProcessor.token_layout`, so no pixel is decoded and the counts
are the processed ones. The rank that trains on the row then processes it after the exchange
(:meth:`ModuleProcessor.__call__`) into its module's fields (:mod:`mimo_pipes.module_fields`): the
language module from the text and the image sizes alone, an encoder module by processing the row. Either
way the result is, field for field and bit for bit, what :class:`~mimo_pipes.data.processor.SampleProcessor`
makes of the row with the module's other fields dropped (a test holds every family to it).

A row whose sizes cannot be read from headers (an item kind this module does not know, a size the resize
rule refuses) is processed for its cost instead, and counted in :attr:`ModuleProcessor.processed_for_cost`;
a row the processor would refuse raises the processor's own :class:`~mimo_pipes.errors.SampleError`.
``mimo-pipes analyze`` counts rows with the same :meth:`ModuleProcessor.counts`.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np
import torch

from mimo_pipes.cost import image_token_count, placeholder_runs
from mimo_pipes.data.conversation import conversation
from mimo_pipes.data.media_sizes import encoded_media, media_sizes
from mimo_pipes.data.processor import CONSUMED_KEYS, SampleProcessor, token_fields
from mimo_pipes.errors import SampleError
from mimo_pipes.module_fields import ModuleFields
from mimo_pipes.sample import IMAGE_TOKENS, PLACEHOLDER_RUNS, REAL_TOKENS, SAMPLE_ID, TOKEN_LAYOUT, Sample

logger = logging.getLogger(__name__)

RowCount = tuple[int, int, list[int]]
"""(image tokens, real tokens, placeholder run lengths) of one row."""


class ModuleProcessor:
    """Counts rows before the exchange and makes ``fields``' part of them after it (see the module doc).

    ``image_paths``: rows keep their images' paths when they move (every rank reads the same files);
    otherwise :meth:`count` reads each image file given by path into the row as encoded bytes. Picklable
    (for worker processes); safe to call from several threads."""

    def __init__(self, processor: SampleProcessor, fields: ModuleFields | None = None, *, image_paths: bool = False) -> None:
        self.processor = processor
        self.fields = fields or ModuleFields()
        self.image_paths = image_paths
        self._lock = threading.Lock()
        self._processed_for_cost = 0

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

    def counts(self, row: dict, *, runs: bool = True) -> RowCount:
        """(image tokens, real tokens, placeholder runs) of ``row`` as processing it would give them;
        ``runs`` False leaves the runs empty (they cost a pass over the ids)."""
        return self._counted(row, runs)[0]

    def count(self, row: dict) -> Sample:
        """The row as it moves: its images as encoded bytes (:func:`~mimo_pipes.data.media_sizes.encoded_media`;
        files stay paths with ``image_paths``); its counts as metadata (image tokens, real tokens,
        placeholder runs); and its token layout (token ids, trained flags, layout fields: a few bytes per
        token), so that the language side builds its fields after the exchange without tokenizing again.
        Raises the row's SampleError."""
        row = encoded_media(row, self.processor.image_folder, row.get(SAMPLE_ID, row.get("id")), keep_paths=self.image_paths)
        (image_tokens, real_tokens, lengths), layout = self._counted(row, runs=True)
        counted = {**row, IMAGE_TOKENS: image_tokens, REAL_TOKENS: real_tokens, PLACEHOLDER_RUNS: lengths}
        if layout is not None:
            counted[TOKEN_LAYOUT] = layout
        return counted

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
                layout = _token_layout(*self.layout(row))
            except SampleError:
                raise
            except Exception:  # noqa: BLE001 - no cheap size: processed, as it was for its cost
                return self.fields.select(self.processor(row))
        out = {key: value for key, value in row.items() if key not in CONSUMED_KEYS}
        out.update(token_fields(layout[IDS], layout[TRAINED]))
        out.update((name, value) for name, value in layout.items() if name not in (IDS, TRAINED))
        return out

    def _counted(self, row: dict, runs: bool) -> tuple[RowCount, dict[str, torch.Tensor] | None]:
        try:
            ids, trained, fields = self.layout(row)
        except SampleError:
            raise
        except Exception as error:  # noqa: BLE001 - no cheap size: the processor counts it, or names the row's fault
            sample = self.processor(dict(row))
            with self._lock:
                self._processed_for_cost += 1
            logger.warning("sample %r: sizes not readable from headers (%s); processed for its cost",
                           row.get(SAMPLE_ID, row.get("id")), error)
            ids, layout = sample["input_ids"].numpy(), None
        else:
            layout = _token_layout(ids, trained, fields)
            ids = layout[IDS].numpy()
        placeholders = self.processor.placeholder_ids
        lengths = placeholder_runs(ids, placeholders) if runs else []
        return (image_token_count(ids, placeholders), int(ids.shape[0]), lengths), layout


IDS, TRAINED = "input_ids", "trained"


def _token_layout(ids: list[int], trained: list[bool], fields: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """What the language side needs of a row, compact: int32 ids (token ids fit: vocabularies are far below
    2**31), trained flags, and the layout fields as the processor would make them."""
    layout = {IDS: torch.from_numpy(np.asarray(ids, dtype=np.int32)), TRAINED: torch.from_numpy(np.asarray(trained, dtype=np.bool_))}
    layout.update((name, torch.from_numpy(np.ascontiguousarray(value))) for name, value in fields.items())
    return layout
