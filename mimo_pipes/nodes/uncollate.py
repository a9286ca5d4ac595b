"""Uncollate: splits collated micro-batches back into samples (the inverse of ``collate_microbatch``)."""

from __future__ import annotations

import collections
import copy
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torchdata.nodes import BaseNode, IterableWrapper

from mimo_pipes.checkpoint.resume import ResumePoint
from mimo_pipes.errors import SampleError
from mimo_pipes.nodes.base import GraphNode
from mimo_pipes.samples.checks import is_integer, wide_integer
from mimo_pipes.samples.collate import METADATA_LIST_NAMES, VISION_ROWS
from mimo_pipes.samples.cost import image_token_count
from mimo_pipes.samples.grids import GRIDS
from mimo_pipes.samples.mrope_layout import MROPE_ROWS, POSITION_IDS, to_rows_first
from mimo_pipes.samples.sample import CONCAT_FIELDS, INTEGER_FIELDS, SAMPLE_ID, SEQUENCE_FIELDS, STEP, Sample

NUM_IMAGES = "num_images"  # optional per-row image counts in a collated batch
_METADATA_BY_LIST_NAME = {list_name: key for key, list_name in METADATA_LIST_NAMES.items()}


class Uncollate(GraphNode[Sample]):
    """Yields the rows of each collated micro-batch as samples, padding stripped, vision rows split off.

    * Rows: ``input_ids.shape[0]`` (``rows_per_batch``, when given, is checked).
    * Padding is on the right: a row's length is one past its last non-zero ``attention_mask`` entry,
      and the per-token fields (``input_ids``, ``attention_mask``, ``labels``, ``loss_mask``,
      ``position_ids``; each ``[rows, L]``, or ``[rows, 3, L]`` for M-RoPE position ids) are cut to it.
      Every per-token field must have the length L of ``input_ids`` (else SampleError naming it).
      With ``mrope_first``, three-row ``position_ids`` come as ``[3, rows, L]`` (Megatron's M-RoPE layout,
      what transformers' ``get_rope_index`` returns) and are read as ``[rows, 3, L]``.
    * Vision fields (``pixel_values``, ``image_grid_thw``, video and tile fields): a row owns the next
      ``vision_rows[field][row]`` rows when the batch has ``vision_rows`` (every batch collated by this
      library does). Otherwise, for images only: a row owns the next ``n`` rows of ``image_grid_thw``, where ``n`` is the row's entry of
      ``num_images`` when the batch has that field, else the fewest grid rows whose image tokens
      (``prod(t, h, w) / merge_size**2`` each) add up to the row's placeholder count in ``input_ids``.
      Each image owns the next ``prod(t, h, w)`` rows of ``pixel_values``.
    * ``step`` counts micro-batches from the first step the loader tells it (:meth:`start_at`; the batch's own
      ``step`` and ``read_steps`` are ignored: the samples are read anew at the step of the batch that holds them).
    * ``sample_id`` comes from ``sample_ids`` when present, else it is the row's position counted over
      global micro-batches: ``step * rows * dp_size + dp_rank * rows + row``.
    * Other metadata lists (``slots``, ``costs``, ...) come back when not None; any other field must be a
      tensor or list with one entry per row.

    The state is the source's state before the current batch, its step and the rows already yielded;
    it is valid for one image token id, merge size, rows per batch and DP layout.
    """

    STEP_KEY = "step"
    ROWS_YIELDED_KEY = "rows_yielded"

    def __init__(
        self,
        source: BaseNode[Mapping[str, Any]] | Iterator[Mapping[str, Any]],
        *,
        image_token_id: int,
        merge_size: int = 2,
        rows_per_batch: int | None = None,
        dp_rank: int = 0,
        dp_size: int = 1,
        mrope_first: bool = False,
    ) -> None:
        if merge_size < 1:
            raise ValueError(f"merge_size must be >= 1, got {merge_size}")
        super().__init__(source if isinstance(source, BaseNode) else IterableWrapper(source))
        self.image_token_id = image_token_id
        self.merge_size = merge_size
        self.rows_per_batch = rows_per_batch
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.first_step = 0  # where a fresh start counts steps from: the loader says (start_at)
        self.mrope_first = mrope_first
        settings = {"image token id": image_token_id, "merge size": merge_size, "rows per batch": rows_per_batch, "dp rank": dp_rank, "dp size": dp_size}
        if mrope_first:  # only then, so that states saved before the setting existed stay valid
            settings["position ids"] = "[3, rows, L]"
        self.describe(settings)

    def start_at(self, point: ResumePoint, saved_state: Any = None) -> None:
        """From the next ``reset(None)`` on, count steps from ``point.first_step`` (the source must start
        there too: it is restarted on its own)."""
        self.first_step = point.first_step

    def restore(self, initial_state: dict | None) -> None:
        self._rows: collections.deque[Sample] = collections.deque()
        self._taken = 0
        self._batch_start_state: dict[str, Any] | None = None
        if initial_state is None:
            self._step = self.first_step
            return
        self._step = int(initial_state[self.STEP_KEY])
        skip = int(initial_state[self.ROWS_YIELDED_KEY])
        if skip:  # restored inside a batch: read it again and drop the rows already handed out
            self._read_batch()
            for _ in range(skip):
                self._rows.popleft()
            self._taken = skip

    def _read_batch(self) -> None:
        self._batch_start_state = copy.deepcopy(self.source.state_dict())
        batch = next(self.source)
        self._rows = collections.deque(self.split(batch, self._step))
        self._taken = 0
        self._step += 1

    def next(self) -> Sample:
        while not self._rows:
            self._read_batch()
        self._taken += 1
        return self._rows.popleft()

    def source_state(self) -> Any:
        # Inside a batch: the source's state before it, which a restore reads again.
        return self._batch_start_state if self._rows else self.source.state_dict()

    def own_state(self) -> dict[str, Any]:
        if self._rows:
            return {self.STEP_KEY: self._step - 1, self.ROWS_YIELDED_KEY: self._taken}
        return {self.STEP_KEY: self._step, self.ROWS_YIELDED_KEY: 0}

    def split(self, batch: Mapping[str, Any], step: int) -> list[Sample]:
        """The samples of one collated micro-batch of global step ``step``, in row order."""
        for name in ("input_ids", "attention_mask"):
            if not isinstance(batch.get(name), torch.Tensor) or batch[name].dim() != 2:
                raise ValueError(f"micro-batch {step}: field {name!r} must be a [rows, length] tensor")
        rows = batch["input_ids"].shape[0]
        if self.rows_per_batch is not None and rows != self.rows_per_batch:
            raise ValueError(f"micro-batch {step} has {rows} rows, expected {self.rows_per_batch} (B / dp size)")
        _check_metadata_lists(batch, rows, step)
        ids = batch.get(METADATA_LIST_NAMES[SAMPLE_ID])
        if ids is None or any(value is None for value in ids):
            first = step * rows * self.dp_size + self.dp_rank * rows
            ids = list(range(first, first + rows))
        else:
            _check_sample_ids(ids, step)
        samples: list[Sample] = [{SAMPLE_ID: int(ids[row]), STEP: step} for row in range(rows)]
        _check_token_fields(batch, samples, step, self.mrope_first)
        lengths = _row_lengths(batch["attention_mask"], samples)
        images = self._image_spans(batch, samples, lengths, step)
        for name, value in batch.items():
            if name in (STEP, METADATA_LIST_NAMES[SAMPLE_ID], METADATA_LIST_NAMES[STEP], VISION_ROWS):
                continue
            if name in _METADATA_BY_LIST_NAME:
                for sample, item in zip(samples, value):
                    if item is not None:
                        sample[_METADATA_BY_LIST_NAME[name]] = item
            elif name in SEQUENCE_FIELDS:
                if name == POSITION_IDS and self.mrope_first and isinstance(value, torch.Tensor) and value.dim() == 3:
                    if value.shape[0] != MROPE_ROWS:
                        raise ValueError(f"micro-batch {step}: field {name!r} must be [3, rows, length] (mrope_first), got {tuple(value.shape)}")
                    value = to_rows_first(value)
                if not isinstance(value, torch.Tensor) or value.shape[:1] != (rows,) or value.dim() not in (2, 3):
                    raise ValueError(f"micro-batch {step}: field {name!r} must be a [rows, length] or [rows, k, length] tensor")
                for row, sample in enumerate(samples):
                    sample[name] = value[row, ..., : lengths[row]]
            elif name in CONCAT_FIELDS or name in images:
                if name not in images:
                    raise ValueError(f"micro-batch {step}: field {name!r} needs vision_rows to be split into samples")
                spans = images[name]
                for sample, (start, stop) in zip(samples, spans):
                    sample[name] = value[start:stop]
            elif isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == rows:
                for row, sample in enumerate(samples):
                    sample[name] = value[row]
            elif isinstance(value, (list, tuple)) and len(value) == rows:
                for sample, item in zip(samples, value):
                    sample[name] = item
            else:
                raise ValueError(f"micro-batch {step}: field {name!r} has no entry per row, so it cannot be split into samples")
        return samples  # each sample's grids are checked where it enters the tail (CostAnnotator)

    def _image_spans(self, batch: Mapping[str, Any], samples: list[Sample], lengths: list[int], step: int) -> dict[str, list[tuple[int, int]]]:
        """Per row, its [start, stop) in each concatenated vision field."""
        for name in (*CONCAT_FIELDS, *(batch.get(VISION_ROWS) or {})):
            value = batch.get(name)
            if value is not None and (not isinstance(value, torch.Tensor) or value.dim() < 1):
                raise ValueError(f"micro-batch {step}: field {name!r} must be a tensor of rows concatenated over the "
                                 f"micro-batch, got {_shape_or_type(value)}")
            if name in GRIDS and value is not None and (value.dim() != 2 or value.shape[1] != 3 or value.dtype.is_floating_point):
                raise ValueError(f"micro-batch {step}: field {name!r} must be an integer [images, 3] tensor of (t, h, w), "
                                 f"got {value.dtype} of shape {tuple(value.shape)}")
        counts_by_field = batch.get(VISION_ROWS)
        if counts_by_field is not None:
            spans: dict[str, list[tuple[int, int]]] = {}
            for name, counts in counts_by_field.items():
                if name not in batch:
                    raise ValueError(f"micro-batch {step}: vision_rows names {name!r}, which the micro-batch does not hold")
                if not isinstance(counts, (list, tuple)) or len(counts) != len(samples):
                    size = f"{len(counts)} entries" if isinstance(counts, (list, tuple)) else f"a {type(counts).__name__}"
                    raise ValueError(f"micro-batch {step}: vision_rows[{name!r}] has {size}, expected one per row ({len(samples)})")
                ends = [int(c) for c in counts]
                if any(count < 0 for count in ends):
                    raise ValueError(f"micro-batch {step}: vision_rows[{name!r}] holds a negative count: {ends}")
                starts = [sum(ends[:row]) for row in range(len(ends))]
                if sum(ends) != batch[name].shape[0]:
                    raise ValueError(f"micro-batch {step}: vision_rows[{name!r}] adds up to {sum(ends)} rows but {name} "
                                     f"has {batch[name].shape[0]}")
                spans[name] = [(start, start + count) for start, count in zip(starts, ends)]
            return spans
        grid = batch.get("image_grid_thw")
        if grid is None:
            if "pixel_values" in batch:
                raise ValueError(f"micro-batch {step}: a micro-batch with pixel_values needs image_grid_thw to split them per sample")
            return {}
        patches = [int(p) for p in grid.to(torch.int64).prod(dim=1)]
        counts = batch.get(NUM_IMAGES)
        if counts is not None:
            per_row = [int(count) for count in counts]
        else:
            per_row = self._images_from_tokens(batch["input_ids"], samples, lengths, patches)
        grid_spans, pixel_spans = [], []
        image = pixel = 0
        for count in per_row:
            grid_spans.append((image, image + count))
            start = pixel
            pixel += sum(patches[image : image + count])
            image += count
            pixel_spans.append((start, pixel))
        if image != len(patches):
            raise ValueError(f"micro-batch {step}: rows claim {image} images but image_grid_thw has {len(patches)}")
        if "pixel_values" in batch and pixel != batch["pixel_values"].shape[0]:
            raise ValueError(f"micro-batch {step}: image_grid_thw describes {pixel} patches but pixel_values has "
                             f"{batch['pixel_values'].shape[0]} rows")
        return {"image_grid_thw": grid_spans, "pixel_values": pixel_spans}

    def _images_from_tokens(self, input_ids: torch.Tensor, samples: list[Sample], lengths: list[int], patches: list[int]) -> list[int]:
        merge2 = self.merge_size**2
        per_row, image = [], 0
        for row, sample in enumerate(samples):
            needed = image_token_count(input_ids[row, : lengths[row]], self.image_token_id)
            taken = count = 0
            while taken < needed and image + count < len(patches):
                if patches[image + count] % merge2:
                    message = f"{patches[image + count]} patches is not a multiple of merge_size**2 = {merge2}"
                    raise SampleError(sample[SAMPLE_ID], message, field="image_grid_thw")
                taken += patches[image + count] // merge2
                count += 1
            if taken != needed:
                raise SampleError(
                    sample[SAMPLE_ID],
                    f"has {needed} image placeholder tokens but the next image_grid_thw rows give {taken}; "
                    "pass num_images per row or check merge_size",
                    field="image_grid_thw",
                )
            per_row.append(count)
            image += count
        return per_row


def _check_metadata_lists(batch: Mapping[str, Any], rows: int, step: int) -> None:
    """Every metadata list (``sample_ids``, ``image_tokens``, ...) holds one entry per row: a list one short
    would shift every sample's metadata onto the wrong row, or fail deep inside with a bare IndexError."""
    for name in _METADATA_BY_LIST_NAME:
        if name == METADATA_LIST_NAMES[STEP] or name not in batch:
            continue
        value = batch[name]
        if not isinstance(value, (list, tuple)) or len(value) != rows:
            size = f"{len(value)} entries" if isinstance(value, (list, tuple)) else f"a {type(value).__name__}"
            raise ValueError(f"micro-batch {step}: metadata list {name!r} has {size}, expected one per row ({rows})")


def _check_sample_ids(ids: list | tuple, step: int) -> None:
    """``sample_ids`` given by the batch are integers: a float would be cut to another sample's id. An id may
    repeat (a sampler drawing with replacement, a bad row replaced by the next good one): rows are told apart
    by their place, never by their id."""
    for row, value in enumerate(ids):
        if not is_integer(value) and not isinstance(value, torch.Tensor):
            raise ValueError(f"micro-batch {step}: sample_ids[{row}] must be an integer, got {value!r} ({type(value).__name__})")
        if isinstance(value, torch.Tensor) and (value.dim() != 0 or value.dtype.is_floating_point or value.dtype == torch.bool):
            raise ValueError(f"micro-batch {step}: sample_ids[{row}] must be an integer, got a {value.dtype} tensor of shape {tuple(value.shape)}")


def _check_token_fields(batch: Mapping[str, Any], samples: list[Sample], step: int, mrope_first: bool) -> None:
    """Every per-token field has a row per row and the length of ``input_ids`` (a shorter ``labels`` or
    ``attention_mask`` would shift the labels or cut the sample without a word), and token ids, labels and
    positions are integers wide enough for a vocabulary and the pad value. Names the field and the first row."""
    rows, width = batch["input_ids"].shape
    for name in SEQUENCE_FIELDS:
        value = batch.get(name)
        if not isinstance(value, torch.Tensor) or value.dim() < 1:
            continue
        if name in INTEGER_FIELDS and not wide_integer(value.dtype):
            raise SampleError(samples[0][SAMPLE_ID], f"micro-batch {step}: must be an int32 or int64 tensor, "
                              f"got {value.dtype}", field=name)
        if value.shape[-1] != width:
            raise SampleError(samples[0][SAMPLE_ID], f"micro-batch {step}, row 0: {name} has {value.shape[-1]} tokens but "
                              f"input_ids has {width}; every per-token field needs one entry per token", field=name)
        row_axis = 1 if name == POSITION_IDS and mrope_first and value.dim() == 3 else 0
        if row_axis and value.shape[0] != MROPE_ROWS:
            continue  # not [3, rows, L]: split says so
        if value.shape[row_axis] != rows:
            raise ValueError(f"micro-batch {step}: field {name!r} has {value.shape[row_axis]} rows but input_ids has {rows}")


def _shape_or_type(value: Any) -> str:
    return "a 0-d tensor" if isinstance(value, torch.Tensor) else f"a {type(value).__name__}"


def _row_lengths(attention_mask: torch.Tensor, samples: list[Sample]) -> list[int]:
    """One past each row's last non-zero mask entry; a row that starts masked but has tokens is left padded."""
    nonzero = attention_mask != 0
    positions = torch.arange(1, attention_mask.shape[1] + 1)
    lengths = (nonzero * positions).amax(dim=1).tolist() if attention_mask.shape[1] else [0] * len(samples)
    for row, length in enumerate(lengths):
        if length and not bool(nonzero[row, 0]):
            raise SampleError(samples[row][SAMPLE_ID], "is padded on the left; only right padding is supported", field="attention_mask")
    return lengths
