"""Ready-processed synthetic samples for tests and benchmarks of the exchange, without running a processor.

Every tensor is a deterministic function of the sample index, so any rank can check that a sample it
received is intact (:func:`check_sample`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

IMAGE_TOKEN_ID = 151655
TEXT_TOKEN_ID = 1000
MERGE = 2  # patches per placeholder token along each side (Qwen2-VL merge_size)


def image_tokens_for(index: int, seed: int) -> int:
    """A heavy-tailed VLM mix: ~20% text-only, thumbnails, photos, documents up to ~1500 tokens."""
    generator = np.random.Generator(np.random.PCG64([seed, index]))
    kind = generator.random()
    if kind < 0.2:
        return 0
    if kind < 0.35:
        return int(generator.integers(4, 40))
    if kind < 0.75:
        return int(generator.integers(100, 500))
    return int(generator.integers(600, 1500))


class SyntheticProcessedDataset:
    """Map-style dataset of processed samples: input_ids with image placeholders, pixel_values rows.

    ``patch_dim`` is the width of a pixel_values row (1176 for Qwen2-VL; smaller keeps tests light).
    """

    def __init__(self, size: int, *, seed: int = 0, text_tokens: int = 64, patch_dim: int = 16) -> None:
        self.size = size
        self.seed = seed
        self.text_tokens = text_tokens
        self.patch_dim = patch_dim

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        image_tokens = image_tokens_for(index, self.seed)
        length = image_tokens + self.text_tokens + index % 7
        input_ids = torch.full((length,), TEXT_TOKEN_ID, dtype=torch.int64)
        input_ids[1 : 1 + image_tokens] = IMAGE_TOKEN_ID
        patches = image_tokens * MERGE * MERGE
        pixel_values = torch.arange(patches * self.patch_dim, dtype=torch.float32).reshape(patches, self.patch_dim)
        pixel_values += float(index)
        grid = torch.tensor([[1, MERGE, MERGE * image_tokens]], dtype=torch.int64)  # prod / merge**2 = tokens
        return {
            "input_ids": input_ids,
            "attention_mask": torch.ones(length, dtype=torch.int64),
            "labels": input_ids.clone(),
            "loss_mask": torch.ones(length, dtype=torch.float32),
            "position_ids": torch.arange(length, dtype=torch.int64),
            "pixel_values": pixel_values,
            "image_grid_thw": grid if image_tokens else torch.zeros((0, 3), dtype=torch.int64),
        }


def check_sample(sample: dict[str, Any], dataset: SyntheticProcessedDataset, index: int) -> None:
    """Raise AssertionError unless ``sample`` carries exactly dataset[index]'s tensors."""
    expected = dataset[index]
    for name, tensor in expected.items():
        got = sample[name]
        if got.dtype != tensor.dtype or got.shape != tensor.shape or not torch.equal(got, tensor):
            raise AssertionError(f"sample {index}: field {name} differs after the exchange")


def tail_settings(
    *,
    samples_per_rank: int,
    dp_size: int = 1,
    window_size: int = 1,
    reorder: bool = False,
    across_microbatches: bool = False,
    overlap: bool = True,
    pad_length: int | None = None,
    pad_values: dict[str, int | float] | None = None,
    image_token_id: int | tuple[int, ...] = IMAGE_TOKEN_ID,
    encoder_weight: int = 1,
    language_weight: int = 0,
    language_square_weight: int = 0,
    time_model: Any = None,
    floor: int = 0,
    encoder_groups: int = 0,
    pack_pad_multiple: int = 1,
    collator: Any = None,
    module: str | None = None,
    payload: str = "samples",
    workers: int = 1,
    method: str = "thread",
) -> Any:
    """Tail settings given term by term, for tests and benchmarks of single nodes (graphs resolve theirs
    with :func:`mimo_pipes.config.tail_settings.resolve_tail`). ``collator`` replaces ``pad_length`` and
    ``pad_values`` when given; ``module`` names the module (its fields), ``payload``, ``workers`` and
    ``method`` say where rows are processed."""
    from mimo_pipes.balance.settings import PlannerSettings
    from mimo_pipes.config.tail_settings import BalancePlan, Processing, TailSettings
    from mimo_pipes.samples.collate import DEFAULT_PAD_VALUES, Collator
    from mimo_pipes.samples.cost import CostFunction
    from mimo_pipes.samples.module_fields import module_fields

    plan = BalancePlan(
        cost=CostFunction(encoder_weight, language_weight, language_square_weight, time_model),
        window_size=window_size,
        reorder=reorder,
        overlap=overlap,
        across_microbatches=across_microbatches,
        planner=PlannerSettings(floor, encoder_groups),
    )
    ids = (image_token_id,) if isinstance(image_token_id, int) else tuple(image_token_id)
    return TailSettings(
        plan=plan,
        micro_batch_size=samples_per_rank * dp_size,
        samples_per_rank=samples_per_rank,
        image_token_ids=ids,
        collator=collator if collator is not None else Collator(pad_length, dict(DEFAULT_PAD_VALUES if pad_values is None else pad_values)),
        pack_pad_multiple=pack_pad_multiple,
        fields=module_fields(module),
        processing=Processing(payload, workers, method),
    )
