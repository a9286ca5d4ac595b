"""Collation of one rank's micro-batch: pad sequence fields to one length, concatenate ragged vision fields.

Only collation lives here, and one node calls it (:class:`~mimo_pipes.nodes.window_collator.WindowCollator`);
what is checked of samples before they are exchanged, so that a bad sample fails on the rank that read it,
is :mod:`mimo_pipes.samples.checks`, whose per-field checks collation repeats on what it is given.

Fields are the union over the micro-batch: a sample without a vision field (a text-only sample under a
real processor) contributes zero rows of it, and a vision field that no sample of the micro-batch holds
is still emitted, empty, when the processor declares it (``Collator.vision_fields``), so every rank's
micro-batches carry the same keys whatever their content.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mimo_pipes.errors import SampleError
from mimo_pipes.samples.checks import check_rows, check_tokens
from mimo_pipes.samples.sample import (
    CONCAT_FIELDS,
    COST,
    IMAGE_TOKENS,
    METADATA_KEYS,
    REAL_TOKENS,
    SAMPLE_ID,
    SEQUENCE_FIELDS,
    SLOT,
    STEP,
    FieldSpec,
    Sample,
    Window,
)

VISION_ROWS = "vision_rows"
"""Batch key: per concatenated field, each sample's number of rows (how ``Uncollate`` splits them back)."""
DEFAULT_PAD_VALUES: Mapping[str, int | float] = {"labels": -100}
# Per-sample metadata becomes one list per micro-batch under these names (canonical order). ``read_steps``
# differs from the batch's ``step`` only for samples that moved across the micro-batches of a window.
_LENT: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()  # see lend_rows
METADATA_LIST_NAMES = {
    SAMPLE_ID: "sample_ids", STEP: "read_steps", SLOT: "slots", IMAGE_TOKENS: "image_tokens", REAL_TOKENS: "real_tokens", COST: "costs",
}



def collate_microbatch(
    samples: Sequence[Sample],
    *,
    step: int | None = None,
    pad_length: int | None,
    pad_values: Mapping[str, int | float] = DEFAULT_PAD_VALUES,
    vision_fields: Mapping[str, FieldSpec] | None = None,
) -> dict[str, Any]:
    """Collate samples (canonical order kept). ``pad_length=None`` pads to the longest sample.

    ``step`` is the micro-batch's global step; it defaults to the samples' own (they differ only when
    samples moved across the micro-batches of a window). ``vision_fields`` declares the concatenated
    fields every micro-batch carries, empty when none of its samples has them."""
    if not samples:
        raise ValueError("cannot collate an empty micro-batch")
    batch: dict[str, Any] = {"step": samples[0][STEP] if step is None else step}
    for key, list_name in METADATA_LIST_NAMES.items():
        batch[list_name] = [sample.get(key) for sample in samples]
    longest = max((sample[name].shape[-1] for sample in samples for name in SEQUENCE_FIELDS if _has_tokens(sample, name)), default=0)
    length = longest if pad_length is None else pad_length
    declared = dict(vision_fields or {})
    names = list(dict.fromkeys(name for sample in samples for name in sample if name not in METADATA_KEYS))
    names += [name for name in declared if name not in names]
    rows: dict[str, list[int]] = {}
    for name in names:
        if name in CONCAT_FIELDS or name in declared:
            batch[name], rows[name] = _concat(samples, name, declared.get(name))
            continue
        missing = next((sample for sample in samples if name not in sample), None)
        if missing is not None:
            raise SampleError(missing.get(SAMPLE_ID), "is missing while other samples of its micro-batch have it", field=name)
        values = [sample[name] for sample in samples]
        if name in SEQUENCE_FIELDS:
            batch[name] = _pad_stack(values, samples, name, length, pad_values.get(name, 0))
        elif all(isinstance(value, torch.Tensor) for value in values) and len({v.shape for v in values}) == 1:
            batch[name] = torch.stack(values)
        else:  # copies too: a collated batch never shares memory with the samples it came from
            batch[name] = [value.clone() if isinstance(value, torch.Tensor) else value for value in values]
    if rows:
        batch[VISION_ROWS] = rows
    return batch


@dataclass(frozen=True)
class Collator:
    """How a rank's micro-batches are collated: pad length (None: the longest sample), pad values, and the
    vision fields every micro-batch carries (see :func:`collate_microbatch`)."""

    pad_length: int | None
    pad_values: Mapping[str, int | float] = field(default_factory=lambda: dict(DEFAULT_PAD_VALUES))
    vision_fields: Mapping[str, FieldSpec] = field(default_factory=dict)

    def microbatch(self, samples: Sequence[Sample], step: int) -> dict[str, Any]:
        return collate_microbatch(
            samples, step=step, pad_length=self.pad_length, pad_values=self.pad_values, vision_fields=self.vision_fields
        )

    def window(self, window: Window) -> Window:
        """Every micro-batch of a window collated; the result shares no memory with the samples (but a lent buffer: :func:`lend_rows`)."""
        if window.collated:
            return window
        batches = [self.microbatch(samples, window.first_step + m) for m, samples in enumerate(window.microbatches)]
        return Window(window.first_step, batches, collated=True, composition=window.composition)


def _has_tokens(sample: Sample, name: str) -> bool:
    value = sample.get(name)
    return isinstance(value, torch.Tensor) and value.dim() >= 1


def _concat(samples: Sequence[Sample], name: str, declared: FieldSpec | None) -> tuple[torch.Tensor, list[int]]:
    """``name`` of every sample concatenated along dim 0; a sample without it adds no rows."""
    present = [(sample, sample[name]) for sample in samples if sample.get(name) is not None]
    for sample, value in present:
        check_rows(value, sample, name)
    if present:
        first = present[0][1]
        tail, dtype = tuple(first.shape[1:]), first.dtype
    elif declared is not None:
        tail, dtype = tuple(declared[0]), declared[1]
    else:
        raise ValueError(f"field {name!r} is in no sample and not declared")
    for sample, value in present:
        if tuple(value.shape[1:]) != tail or value.dtype != dtype:
            raise SampleError(
                sample.get(SAMPLE_ID),
                f"is {value.dtype} of shape {tuple(value.shape)}, but its micro-batch has {dtype} rows of shape {tail}",
                field=name,
            )
    counts = [int(sample[name].shape[0]) if sample.get(name) is not None else 0 for sample in samples]
    if not present:
        return torch.empty((0, *tail), dtype=dtype), counts
    values = [value for _, value in present]
    span = _lent_span(values)
    return (span if span is not None else torch.cat(values, dim=0)), counts


def lend_rows(buffer: torch.Tensor) -> None:
    """Let collation take consecutive row slices of the flat ``buffer``, given in order, as that part of
    ``buffer`` itself (no copy): for a buffer made for one micro-batch's field, written once by the processes that
    made its samples and by nothing after (:class:`~mimo_pipes.samples.handover.Destination`). The
    micro-batch then shares the buffer's memory with those samples; they go once it is collated."""
    _LENT[id(buffer)] = buffer


def _lent_span(values: list[torch.Tensor]) -> torch.Tensor | None:
    """The lent buffer's part that ``values`` are, when they are its consecutive slices in order; else None."""
    base = values[0]._base
    if base is None or _LENT.get(id(base)) is not base:
        return None
    start = position = values[0].storage_offset()
    for value in values:
        if value._base is not base or not value.is_contiguous() or value.storage_offset() != position:
            return None
        position += value.numel()
    return base[start - base.storage_offset():position - base.storage_offset()].view(-1, *values[0].shape[1:])


def _pad_stack(values: list[Any], samples: Sequence[Sample], name: str, length: int, pad_value: int | float) -> torch.Tensor:
    first = values[0]
    for value, sample in zip(values, samples):
        check_tokens(value, sample, name, length)
        if value.shape[:-1] != first.shape[:-1]:
            raise SampleError(
                sample.get(SAMPLE_ID),
                f"has shape {tuple(value.shape)}, but the micro-batch's first sample has {tuple(first.shape)}",
                field=name,
            )
    out = torch.full((len(values), *first.shape[:-1], length), pad_value, dtype=first.dtype)
    for row, value in enumerate(values):
        out[row, ..., : value.shape[-1]] = value
    return out
