"""Multimodal rotary positions (M-RoPE) of the Qwen2-VL family, from token ids and vision grids: pure tensor code.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL rotate each token by three positions (temporal, height, width):

* a text token gets the next position on all three rows (one more than the previous text token, or, right
  after a vision block, the block's start plus its extent);
* the placeholder tokens of an image or video, after the vision tower merges ``m x m`` patches into one
  token, lie on a grid of ``t x (h / m) x (w / m)`` tokens in (t, h, w) order; each gets ``start + i`` for
  its index ``i`` along each axis (the temporal index scaled by the item's temporal interval), and the text
  after the block continues at ``start + max(h / m, w / m)``;
* padding (tokens outside the attention mask) gets 0; every packed sequence starts again at 0.

Placeholder tokens are recognised by their ids; the grids are consumed in order, each taking
``t * h * w / m**2`` placeholders. Families differ only for videos: Qwen2-VL steps time by 1, Qwen2.5-VL
by ``tokens_per_second * seconds_per_grid``, and Qwen3-VL splits a video into frames of one temporal step
each (separated by timestamps in the text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mimo_pipes.samples.mrope_layout import MROPE_ROWS

TEXT, IMAGE, VIDEO = 0, 1, 2


@dataclass(frozen=True)
class VisionItem:
    """One image or video frame block as the language model sees it: its token grid after the merge and
    the step of its temporal positions."""

    t: int
    h: int
    w: int
    interval: float = 1.0

    @property
    def tokens(self) -> int:
        return self.t * self.h * self.w


def vision_items(
    grid_thw: torch.Tensor | None, spatial_merge_size: int, *, intervals: Sequence[float] | float = 1.0, split_frames: bool = False
) -> list[VisionItem]:
    """The items of a ``[n, 3]`` grid field in order (``split_frames``: each temporal step its own item,
    as Qwen3-VL lays out video frames). ``intervals``: one temporal step per grid row, or one for all."""
    if grid_thw is None or grid_thw.numel() == 0:
        return []
    grid = grid_thw.reshape(-1, 3).tolist()
    steps = [float(intervals)] * len(grid) if isinstance(intervals, (int, float)) else [float(i) for i in intervals]
    if len(steps) != len(grid):
        raise ValueError(f"{len(steps)} temporal intervals for {len(grid)} grid rows")
    items = []
    for (t, h, w), step in zip(grid, steps):
        if h % spatial_merge_size or w % spatial_merge_size:
            raise ValueError(f"grid {[t, h, w]} is not divisible by the spatial merge size {spatial_merge_size}")
        merged = VisionItem(int(t), h // spatial_merge_size, w // spatial_merge_size, step)
        items.extend([VisionItem(1, merged.h, merged.w, step)] * int(t) if split_frames else [merged])
    return items


def token_kinds(input_ids: torch.Tensor | np.ndarray, image_token_id: int | None, video_token_id: int | None) -> np.ndarray:
    """TEXT, IMAGE or VIDEO for every token (transformers' ``mm_token_type_ids``)."""
    ids = input_ids.detach().cpu().numpy() if isinstance(input_ids, torch.Tensor) else np.asarray(input_ids)
    kinds = np.zeros(ids.shape, dtype=np.int64)
    if image_token_id is not None:
        kinds[ids == image_token_id] = IMAGE
    if video_token_id is not None:
        kinds[ids == video_token_id] = VIDEO
    return kinds


def runs(kinds: np.ndarray) -> list[tuple[int, int, int]]:
    """``(kind, start, stop)`` of each maximal run of equal kinds of a 1-d array."""
    n = int(kinds.size)
    if n == 0:
        return []
    bounds = [0, *(np.flatnonzero(kinds[1:] != kinds[:-1]) + 1).tolist(), n]
    return [(int(kinds[a]), a, b) for a, b in zip(bounds[:-1], bounds[1:])]


class _Queue:
    """The items of one kind, handed out in order. Its messages name the grid field and the id that finds
    the placeholders (``name`` is ``image`` or ``video``: ``image_grid_thw``, ``image_token_id``)."""

    def __init__(self, items: list[VisionItem], name: str, token_id: int | None) -> None:
        self.items, self.name, self.next, self.token_id = items, name, 0, token_id

    def take(self) -> VisionItem:
        if not self.items:
            raise ValueError(f"input_ids holds {self.name} placeholder tokens ({self.name}_token_id {self.token_id}) but "
                             f"{self.name}_grid_thw is missing or empty: M-RoPE needs each {self.name}'s grid")
        if self.next >= len(self.items):
            raise ValueError(f"input_ids holds more {self.name} placeholder tokens ({self.name}_token_id {self.token_id}) "
                             f"than {self.name}_grid_thw describes ({len(self.items)} items)")
        item = self.items[self.next]
        self.next += 1
        return item

    def check_done(self) -> None:
        if self.next != len(self.items):
            hint = (f"; no token of input_ids is {self.token_id}: is {self.name}_token_id the tokenizer's {self.name} placeholder id?"
                    if self.next == 0 else "")
            raise ValueError(f"{self.name}_grid_thw describes {len(self.items)} items but the {self.name} placeholder tokens of "
                             f"input_ids ({self.name}_token_id {self.token_id}) fill {self.next}{hint}")


def sequence_positions(kinds: np.ndarray, queues: dict[int, _Queue]) -> np.ndarray:
    """``[3, n]`` positions of one sequence's real tokens (their ``kinds``, 1-d), from position 0."""
    out = np.empty((MROPE_ROWS, kinds.size), dtype=np.int64)
    current = 0
    for kind, start, stop in runs(kinds):
        if kind == TEXT:
            out[:, start:stop] = np.arange(current, current + stop - start)
            current += stop - start
            continue
        at = start
        while at < stop:
            item = queues[kind].take()
            if at + item.tokens > stop:
                raise ValueError(f"a run of {stop - start} {queues[kind].name} placeholder tokens ends inside an item of "
                                 f"{item.tokens} tokens (grid t={item.t}, h={item.h}, w={item.w} after the merge)")
            out[:, at : at + item.tokens] = _item_positions(item, current)
            at += item.tokens
            current += max(item.h, item.w)
    return out


def _item_positions(item: VisionItem, start: int) -> np.ndarray:
    """(t, h, w) of every token of the item's grid, in (t, h, w) order, offset by ``start``."""
    t = (np.arange(item.t, dtype=np.float64) * item.interval).astype(np.int64)
    out = np.empty((MROPE_ROWS, item.t, item.h, item.w), dtype=np.int64)
    out[0] = t[:, None, None]
    out[1] = np.arange(item.h)[None, :, None]
    out[2] = np.arange(item.w)[None, None, :]
    return out.reshape(MROPE_ROWS, -1) + start


def mrope_position_ids(
    input_ids: torch.Tensor,
    *,
    image_token_id: int | None,
    video_token_id: int | None = None,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    spatial_merge_size: int = 2,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_unpadded: torch.Tensor | None = None,
    video_intervals: Sequence[float] | float = 1.0,
    split_video_frames: bool = False,
) -> torch.Tensor:
    """M-RoPE position ids ``[3, B, S]`` of a batch ``input_ids`` ``[B, S]`` (see the module doc).

    Right-padded rows: ``attention_mask`` ``[B, S]`` selects each row's real tokens (None: all are real).
    A packed THD row (``B == 1``): ``cu_seqlens`` gives where each sequence starts (its padding included)
    and ``cu_seqlens_unpadded`` its real length; positions restart at 0 for each one. The grids are
    ``[items, 3]`` in the order their placeholders appear, rows first. Raises ValueError when the
    placeholders and the grids disagree."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, sequence], got shape {tuple(input_ids.shape)}")
    queues = {
        IMAGE: _Queue(vision_items(image_grid_thw, spatial_merge_size), "image", image_token_id),
        VIDEO: _Queue(vision_items(video_grid_thw, spatial_merge_size, intervals=video_intervals, split_frames=split_video_frames),
                      "video", video_token_id),
    }
    kinds = token_kinds(input_ids, image_token_id, video_token_id)
    out = np.zeros((MROPE_ROWS, *kinds.shape), dtype=np.int64)
    for row, index in _sequences(kinds.shape, attention_mask, cu_seqlens, cu_seqlens_unpadded):
        out[:, row, index] = sequence_positions(kinds[row, index], queues)
    for queue in queues.values():
        queue.check_done()
    return torch.from_numpy(out).to(input_ids.device)


def _sequences(shape: tuple[int, ...], mask: torch.Tensor | None, cu: torch.Tensor | None, cu_real: torch.Tensor | None):
    """(row, token indices or slice) of every sequence in order."""
    rows, length = shape
    if cu is not None:
        if rows != 1 or cu_real is None:
            raise ValueError("a packed micro-batch is one row, with cu_seqlens and cu_seqlens_unpadded")
        starts, real = cu[:-1].tolist(), (cu_real[1:] - cu_real[:-1]).tolist()
        return [(0, slice(start, start + n)) for start, n in zip(starts, real)]
    if mask is None:
        return [(row, slice(0, length)) for row in range(rows)]
    if tuple(mask.shape) != (rows, length):
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)}, input_ids {(rows, length)}")
    keep = mask.detach().cpu().numpy() != 0
    return [(row, np.flatnonzero(keep[row])) for row in range(rows)]
