"""The encoder's inputs of one micro-batch: its patch rows and their grids, images and videos in token order.

A Qwen2-VL-style tower takes one tensor of patch rows ``[patches, patch dim]`` and one grid ``[items, 3]``
saying how the rows group into images. A micro-batch holds images and videos in separate fields
(``pixel_values`` / ``image_grid_thw`` and ``pixel_values_videos`` / ``video_grid_thw``); where both are
present, the encoder must see them in the order their placeholders appear in ``input_ids``, so that its
outputs fill the placeholders in order. Where only one kind is present its fields pass as they are.
"""

from __future__ import annotations

import numpy as np
import torch

from mimo_pipes.megatron.rope import IMAGE, TEXT, VIDEO, runs, token_kinds


def merged_vision(
    images: tuple[torch.Tensor, torch.Tensor] | None,
    videos: tuple[torch.Tensor, torch.Tensor] | None,
    *,
    input_ids: torch.Tensor | None,
    image_token_id: int | None,
    video_token_id: int | None,
    spatial_merge_size: int,
    token_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(patch rows, grid)`` of the images and videos (each ``(pixels, grid)`` or None, or empty).

    With both kinds, ``input_ids`` (rows first; ``token_mask`` marks the real tokens, None: all) orders
    them: each placeholder run takes the next items of its kind, ``t * h * w / m**2`` tokens each."""
    present = [pair for pair in (images, videos) if pair is not None and pair[1].numel() > 0]
    if not present:
        return None
    if len(present) == 1:
        return present[0]
    if input_ids is None:
        raise ValueError("a micro-batch with both images and videos needs input_ids to order them for one encoder "
                         "(an encoder module's micro-batches have none: give videos their own modality, video_modality=)")
    assert images is not None and videos is not None
    kinds = token_kinds(input_ids, image_token_id, video_token_id)
    if token_mask is not None:
        kinds = np.where(token_mask.detach().cpu().numpy() != 0, kinds, TEXT)
    order = _item_order(kinds.reshape(-1), {IMAGE: _tokens(images[1], spatial_merge_size), VIDEO: _tokens(videos[1], spatial_merge_size)})
    pixels, grids = [], []
    spans = {IMAGE: _row_spans(images[1]), VIDEO: _row_spans(videos[1])}
    sources = {IMAGE: images, VIDEO: videos}
    for kind, index in order:
        start, stop = spans[kind][index]
        pixels.append(sources[kind][0][start:stop])
        grids.append(sources[kind][1][index : index + 1])
    return torch.cat(pixels), torch.cat(grids)


def _tokens(grid: torch.Tensor, merge: int) -> list[int]:
    return [int(n) // merge**2 for n in grid.reshape(-1, 3).prod(dim=1).tolist()]


def _row_spans(grid: torch.Tensor) -> list[tuple[int, int]]:
    counts = [int(n) for n in grid.reshape(-1, 3).prod(dim=1).tolist()]
    starts = [sum(counts[:k]) for k in range(len(counts))]
    return [(start, start + n) for start, n in zip(starts, counts)]


def _item_order(kinds: np.ndarray, tokens: dict[int, list[int]]) -> list[tuple[int, int]]:
    """(kind, item index) in the order the items' placeholders start."""
    order: list[tuple[int, int]] = []
    taken = {IMAGE: 0, VIDEO: 0}
    left = {IMAGE: 0, VIDEO: 0}
    for kind, start, stop in runs(kinds):
        if kind == TEXT:
            continue
        n = stop - start
        while n > 0:
            if left[kind] == 0:
                if taken[kind] >= len(tokens[kind]):
                    raise ValueError(f"more {'image' if kind == IMAGE else 'video'} placeholder tokens than grid rows describe")
                left[kind] = tokens[kind][taken[kind]]
                order.append((kind, taken[kind]))
                taken[kind] += 1
            used = min(n, left[kind])
            left[kind] -= used
            n -= used
    for kind, name in ((IMAGE, "image"), (VIDEO, "video")):
        if taken[kind] != len(tokens[kind]) or left[kind]:
            raise ValueError(f"the {name} placeholder tokens do not match the {len(tokens[kind])} {name} grid rows")
    return order
