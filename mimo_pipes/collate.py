"""Collation of one rank's micro-batch: pad sequence fields to one length, concatenate ragged vision fields."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mimo_pipes.errors import SampleError
from mimo_pipes.sample import COST, IMAGE_TOKENS, METADATA_KEYS, REAL_TOKENS, SAMPLE_ID, SLOT, STEP, Sample
from mimo_pipes.window import Window

# Per-token fields: padded on the right to one length and stacked to [b, L].
SEQUENCE_FIELDS = ("input_ids", "attention_mask", "labels", "loss_mask", "position_ids")
# Ragged vision fields: concatenated along dim 0, as Qwen2-VL-style encoders take them.
CONCAT_FIELDS = ("pixel_values", "image_grid_thw")
DEFAULT_PAD_VALUES: Mapping[str, int | float] = {"labels": -100}
# Per-sample metadata becomes one list per micro-batch under these names (canonical order).
METADATA_LIST_NAMES = {SAMPLE_ID: "sample_ids", SLOT: "slots", IMAGE_TOKENS: "image_tokens", REAL_TOKENS: "real_tokens", COST: "costs"}


def collate_microbatch(
    samples: Sequence[Sample],
    *,
    step: int | None = None,
    pad_length: int | None,
    pad_values: Mapping[str, int | float] = DEFAULT_PAD_VALUES,
) -> dict[str, Any]:
    """Collate samples (canonical order kept). ``pad_length=None`` pads to the longest sample.

    ``step`` is the micro-batch's global step; it defaults to the samples' own (they differ only when
    samples moved across the micro-batches of a window)."""
    if not samples:
        raise ValueError("cannot collate an empty micro-batch")
    batch: dict[str, Any] = {"step": samples[0][STEP] if step is None else step}
    for key, list_name in METADATA_LIST_NAMES.items():
        batch[list_name] = [sample.get(key) for sample in samples]
    longest = max((len(sample[name]) for sample in samples for name in SEQUENCE_FIELDS if name in sample), default=0)
    length = longest if pad_length is None else pad_length
    for name in samples[0]:
        if name in METADATA_KEYS:
            continue
        values = [sample[name] for sample in samples]
        if name in SEQUENCE_FIELDS:
            batch[name] = _pad_stack(values, samples, name, length, pad_values.get(name, 0))
        elif name in CONCAT_FIELDS:
            batch[name] = torch.cat(values, dim=0)
        elif all(isinstance(value, torch.Tensor) for value in values) and len({v.shape for v in values}) == 1:
            batch[name] = torch.stack(values)
        else:  # copies too: a collated batch never shares memory with the samples it came from
            batch[name] = [value.clone() if isinstance(value, torch.Tensor) else value for value in values]
    return batch


@dataclass(frozen=True)
class Collator:
    """How a rank's micro-batches are collated: pad length (None: the longest sample) and pad values."""

    pad_length: int | None
    pad_values: Mapping[str, int | float] = field(default_factory=lambda: dict(DEFAULT_PAD_VALUES))

    def microbatch(self, samples: Sequence[Sample], step: int) -> dict[str, Any]:
        return collate_microbatch(samples, step=step, pad_length=self.pad_length, pad_values=self.pad_values)

    def check(self, samples: Sequence[Sample]) -> None:
        """Raise SampleError for what would fail collating ``samples`` (see :func:`check_collatable`)."""
        check_collatable(samples, self.pad_length)

    def window(self, window: Window) -> Window:
        """Every micro-batch of a window collated; the result shares no memory with the samples."""
        if window.collated:
            return window
        batches = [self.microbatch(samples, window.first_step + m) for m, samples in enumerate(window.microbatches)]
        return Window(window.first_step, batches, collated=True)


def check_collatable(samples: Sequence[Sample], pad_length: int | None) -> None:
    """What collation needs of samples, checked on one rank's share before they are exchanged so that a
    bad sample fails on the rank that read it: sequence fields 1-D and within ``pad_length``, and each
    concatenated field of one trailing shape. Raises SampleError naming the sample and the field."""
    first_of: dict[str, tuple[tuple[int, ...], Sample]] = {}
    for sample in samples:
        for name in SEQUENCE_FIELDS:
            if isinstance(sample.get(name), torch.Tensor):
                _check_sequence(sample[name], sample, name, pad_length)
        for name in CONCAT_FIELDS:
            value = sample.get(name)
            if not isinstance(value, torch.Tensor):
                continue
            if value.dim() == 0:
                raise SampleError(sample.get(SAMPLE_ID), "is a scalar; it is concatenated along dim 0", field=name)
            shape, first = first_of.setdefault(name, (tuple(value.shape[1:]), sample))
            if tuple(value.shape[1:]) != shape:
                raise SampleError(
                    sample.get(SAMPLE_ID),
                    f"has shape {tuple(value.shape)}, which cannot be concatenated with the shape "
                    f"(N, {', '.join(map(str, shape))}) of sample {first.get(SAMPLE_ID)!r}",
                    field=name,
                )


def _check_sequence(value: torch.Tensor, sample: Sample, name: str, length: int | None) -> None:
    if value.dim() != 1:
        raise SampleError(sample.get(SAMPLE_ID), f"must be 1-D, got shape {tuple(value.shape)}", field=name)
    if length is not None and len(value) > length:
        raise SampleError(sample.get(SAMPLE_ID), f"has {len(value)} tokens, more than the pad length {length}", field=name)


def _pad_stack(values: list[torch.Tensor], samples: Sequence[Sample], name: str, length: int, pad_value: int | float) -> torch.Tensor:
    out = torch.full((len(values), length), pad_value, dtype=values[0].dtype)
    for row, (value, sample) in enumerate(zip(values, samples)):
        _check_sequence(value, sample, name, length)
        out[row, : len(value)] = value
    return out
