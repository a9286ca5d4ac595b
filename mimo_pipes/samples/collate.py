"""Collation of one rank's micro-batch: pad sequence fields to one length, concatenate ragged vision fields.

Fields are the union over the micro-batch: a sample without a vision field (a text-only sample under a
real processor) contributes zero rows of it, and a vision field that no sample of the micro-batch holds
is still emitted, empty, when the processor declares it (``Collator.vision_fields``), so every rank's
micro-batches carry the same keys whatever their content.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any

import torch

from mimo_pipes.errors import SampleError
from mimo_pipes.samples.grids import GRIDS, grid_problem, patch_rows_problem, patches_dtype_problem
from mimo_pipes.samples.sample import COST, IMAGE_TOKENS, METADATA_KEYS, REAL_TOKENS, SAMPLE_ID, SLOT, STEP, Sample, Window

# Per-token fields: padded on the right along their last dimension and stacked: [L] -> [b, L], and the
# three-row M-RoPE position ids [3, L] -> [b, 3, L].
SEQUENCE_FIELDS = ("input_ids", "attention_mask", "labels", "loss_mask", "position_ids")
# Ragged vision fields: concatenated along dim 0, as Qwen2-VL-style and tiling encoders take them.
CONCAT_FIELDS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "image_num_tiles")
VISION_ROWS = "vision_rows"
"""Batch key: per concatenated field, each sample's number of rows (how ``Uncollate`` splits them back)."""
# Token ids, targets and positions index embeddings and vocabularies: int32 or int64 only (a float cast
# would be truncated silently by the model, or fail far from the sample that carried it).
INTEGER_FIELDS = ("input_ids", "labels", "position_ids")
DEFAULT_PAD_VALUES: Mapping[str, int | float] = {"labels": -100}
# Per-sample metadata becomes one list per micro-batch under these names (canonical order). ``read_steps``
# differs from the batch's ``step`` only for samples that moved across the micro-batches of a window.
METADATA_LIST_NAMES = {
    SAMPLE_ID: "sample_ids", STEP: "read_steps", SLOT: "slots", IMAGE_TOKENS: "image_tokens", REAL_TOKENS: "real_tokens", COST: "costs",
}

FieldSpec = tuple[tuple[int, ...], torch.dtype]
"""A concatenated field's shape past dim 0 and its dtype: ``((1176,), torch.float32)`` for Qwen2-VL pixels."""


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

    def check(self, samples: Sequence[Sample]) -> None:
        """Raise SampleError for what would fail collating ``samples`` (see :func:`check_collatable`)."""
        check_collatable(samples, self.pad_length, self.vision_fields)

    def window(self, window: Window) -> Window:
        """Every micro-batch of a window collated; the result shares no memory with the samples."""
        if window.collated:
            return window
        batches = [self.microbatch(samples, window.first_step + m) for m, samples in enumerate(window.microbatches)]
        return Window(window.first_step, batches, collated=True, composition=window.composition)


def check_collatable(samples: Sequence[Sample], pad_length: int | None, vision_fields: Mapping[str, FieldSpec] | None = None) -> None:
    """What collation needs of samples, checked on one rank's share before they are exchanged so that a
    bad sample fails on the rank that read it: sequence fields ``[L]`` or ``[rows, L]`` within
    ``pad_length``, and each concatenated field a tensor of one dtype and one shape past dim 0. Raises
    SampleError naming the sample and the field."""
    concatenated = [*CONCAT_FIELDS, *(name for name in vision_fields or {} if name not in CONCAT_FIELDS)]
    first_of: dict[str, tuple[Any, Sample]] = {}
    for sample in samples:
        for name in SEQUENCE_FIELDS:
            if name in sample:
                _check_tokens(sample[name], sample, name, pad_length)
                shape, first = first_of.setdefault(name, (sample[name].shape[:-1], sample))
                if sample[name].shape[:-1] != shape:
                    raise SampleError(sample.get(SAMPLE_ID), f"has shape {tuple(sample[name].shape)}, but sample "
                                      f"{first.get(SAMPLE_ID)!r} has rows of {tuple(shape)}", field=name)
        for name in concatenated:
            value = sample.get(name)
            if value is None:
                continue
            _check_rows(value, sample, name)
            (tail, dtype), first = first_of.setdefault(name, ((tuple(value.shape[1:]), value.dtype), sample))
            if (tuple(value.shape[1:]), value.dtype) != (tail, dtype):
                raise SampleError(
                    sample.get(SAMPLE_ID),
                    f"is {value.dtype} of shape {tuple(value.shape)}, which cannot be concatenated with the {dtype} "
                    f"rows of shape {tail} of sample {first.get(SAMPLE_ID)!r}",
                    field=name,
                )


def _check_tokens(value: Any, sample: Sample, name: str, length: int | None) -> None:
    if not isinstance(value, torch.Tensor) or value.dim() not in (1, 2):
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise SampleError(sample.get(SAMPLE_ID), f"must be [L] or [rows, L], got {shape}", field=name)
    if name in INTEGER_FIELDS and not wide_integer(value.dtype):
        raise SampleError(sample.get(SAMPLE_ID), f"must be an int32 or int64 tensor, got {value.dtype}", field=name)
    if length is not None and value.shape[-1] > length:
        raise SampleError(sample.get(SAMPLE_ID), f"has {value.shape[-1]} tokens, more than the pad length {length}", field=name)


def check_sample(sample: Sample) -> None:
    """What a sample handed to the tail must be, checked where it enters (CostAnnotator) so that a plug-in's
    mistake names the sample and the field there instead of passing silently or failing deep inside:
    ``sample_id`` and ``step`` integers; token ids, labels and positions int32 or int64; every per-token field
    as long as ``input_ids``; patch rows floating point; each vision grid positive and describing exactly the
    sample's patches (:mod:`mimo_pipes.samples.grids`)."""
    for key in (SAMPLE_ID, STEP):
        value = sample.get(key)
        if not is_integer(value):
            what = "is missing" if key not in sample else f"must be an integer, got {value!r} ({type(value).__name__})"
            where = f" (a sample of step {sample.get(STEP)!r})" if key == SAMPLE_ID else ""
            raise SampleError(sample.get(SAMPLE_ID), f"{what}{where}: every sample needs an integer {SAMPLE_ID} and {STEP}", field=key)
    tokens = sample.get("input_ids")
    for name in SEQUENCE_FIELDS:
        value = sample.get(name)
        if not isinstance(value, torch.Tensor) or value.dim() < 1:
            continue
        if name in INTEGER_FIELDS and not wide_integer(value.dtype):
            raise SampleError(sample[SAMPLE_ID], f"must be an int32 or int64 tensor, got {value.dtype}", field=name)
        if isinstance(tokens, torch.Tensor) and tokens.dim() >= 1 and value.shape[-1] != tokens.shape[-1]:
            raise SampleError(sample[SAMPLE_ID], f"has {value.shape[-1]} tokens but input_ids has {tokens.shape[-1]}; "
                              "every per-token field needs one entry per token", field=name)
    check_grids(sample)


def check_grids(sample: Sample) -> None:
    """The sample's patch rows are floating point, and its (t, h, w) grid rows are positive and describe
    exactly its rows of patches (what the encoder will take them for): an inconsistent grid or integer pixels
    would pass the exchange and fail in the encoder."""
    for grid_name, patches_name in GRIDS.items():
        grid, patches = sample.get(grid_name), sample.get(patches_name)
        if not isinstance(patches, torch.Tensor) or patches.dim() < 1:
            continue
        problem = patches_dtype_problem(patches)
        if problem is not None:
            raise SampleError(sample.get(SAMPLE_ID), problem, field=patches_name)
        if not isinstance(grid, torch.Tensor):
            continue
        problem = grid_problem(grid, grid_name) or patch_rows_problem(grid, patches, patches_name, "the sample")
        if problem is not None:
            raise SampleError(sample.get(SAMPLE_ID), problem, field=grid_name)


def is_integer(value: object) -> bool:
    """An integer id or step: Python's or NumPy's, not a bool (True would be sample 1)."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def wide_integer(dtype: torch.dtype) -> bool:
    """Whether token ids, labels or positions of ``dtype`` hold what they must: a vocabulary's ids (past
    int16's range), the -100 that pads labels (below uint8's). Narrower types wrap silently."""
    return dtype in (torch.int32, torch.int64)


def _check_rows(value: Any, sample: Sample, name: str) -> None:
    if not isinstance(value, torch.Tensor) or value.dim() < 1:
        raise SampleError(sample.get(SAMPLE_ID), f"must be a tensor with a row dimension, got {_describe(value)}", field=name)


def _has_tokens(sample: Sample, name: str) -> bool:
    value = sample.get(name)
    return isinstance(value, torch.Tensor) and value.dim() >= 1


def _concat(samples: Sequence[Sample], name: str, declared: FieldSpec | None) -> tuple[torch.Tensor, list[int]]:
    """``name`` of every sample concatenated along dim 0; a sample without it adds no rows."""
    present = [(sample, sample[name]) for sample in samples if sample.get(name) is not None]
    for sample, value in present:
        _check_rows(value, sample, name)
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
    return torch.cat([value for _, value in present], dim=0), counts


def _describe(value: Any) -> str:
    return "a 0-d tensor" if isinstance(value, torch.Tensor) else type(value).__name__


def _pad_stack(values: list[Any], samples: Sequence[Sample], name: str, length: int, pad_value: int | float) -> torch.Tensor:
    first = values[0]
    for value, sample in zip(values, samples):
        _check_tokens(value, sample, name, length)
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
