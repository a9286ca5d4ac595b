"""What a sample must be, checked before it is exchanged, so that a bad sample fails on the rank that read it
with one line naming the sample and the field (:class:`~mimo_pipes.errors.SampleError`), not deep inside
collation or the model on another rank.

:func:`check_sample` runs where a sample enters the tail (the cost annotator); :func:`check_collatable` on
one rank's share of a window before the balance exchange moves it (what collation after the exchange needs).
:func:`check_tokens` and :func:`check_rows` are the per-field checks both make, and collation makes again on
what it is given (:mod:`mimo_pipes.samples.collate`), with the same messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from numbers import Integral
from typing import Any

import torch

from mimo_pipes.errors import SampleError
from mimo_pipes.samples.grids import GRIDS, grid_problem, patch_rows_problem, patches_dtype_problem
from mimo_pipes.samples.sample import CONCAT_FIELDS, INTEGER_FIELDS, SAMPLE_ID, SEQUENCE_FIELDS, STEP, FieldSpec, Sample


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
                check_tokens(sample[name], sample, name, pad_length)
                shape, first = first_of.setdefault(name, (sample[name].shape[:-1], sample))
                if sample[name].shape[:-1] != shape:
                    raise SampleError(sample.get(SAMPLE_ID), f"has shape {tuple(sample[name].shape)}, but sample "
                                      f"{first.get(SAMPLE_ID)!r} has rows of {tuple(shape)}", field=name)
        for name in concatenated:
            value = sample.get(name)
            if value is None:
                continue
            check_rows(value, sample, name)
            (tail, dtype), first = first_of.setdefault(name, ((tuple(value.shape[1:]), value.dtype), sample))
            if (tuple(value.shape[1:]), value.dtype) != (tail, dtype):
                raise SampleError(
                    sample.get(SAMPLE_ID),
                    f"is {value.dtype} of shape {tuple(value.shape)}, which cannot be concatenated with the {dtype} "
                    f"rows of shape {tail} of sample {first.get(SAMPLE_ID)!r}",
                    field=name,
                )


def check_tokens(value: Any, sample: Sample, name: str, length: int | None) -> None:
    """A per-token field ``name`` of ``sample``: a tensor ``[L]`` or ``[rows, L]``, of a wide integer type where
    it indexes a vocabulary, at most ``length`` tokens (None: any)."""
    if not isinstance(value, torch.Tensor) or value.dim() not in (1, 2):
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise SampleError(sample.get(SAMPLE_ID), f"must be [L] or [rows, L], got {shape}", field=name)
    if name in INTEGER_FIELDS and not wide_integer(value.dtype):
        raise SampleError(sample.get(SAMPLE_ID), f"must be an int32 or int64 tensor, got {value.dtype}", field=name)
    if length is not None and value.shape[-1] > length:
        raise SampleError(sample.get(SAMPLE_ID), f"has {value.shape[-1]} tokens, more than the pad length {length}", field=name)


def check_rows(value: Any, sample: Sample, name: str) -> None:
    """A concatenated field ``name`` of ``sample``: a tensor with a row dimension."""
    if not isinstance(value, torch.Tensor) or value.dim() < 1:
        what = "a 0-d tensor" if isinstance(value, torch.Tensor) else type(value).__name__
        raise SampleError(sample.get(SAMPLE_ID), f"must be a tensor with a row dimension, got {what}", field=name)


def is_integer(value: object) -> bool:
    """An integer id or step: Python's or NumPy's, not a bool (True would be sample 1)."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def wide_integer(dtype: torch.dtype) -> bool:
    """Whether token ids, labels or positions of ``dtype`` hold what they must: a vocabulary's ids (past
    int16's range), the -100 that pads labels (below uint8's). Narrower types wrap silently."""
    return dtype in (torch.int32, torch.int64)
