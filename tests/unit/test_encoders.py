"""The vision tower builder: presets and config folders, one placeholder token per merged patch."""

from __future__ import annotations

import pytest
import torch

from mimo_pipes.demo_model.encoders import build_vision_tower, encode, patch_dim, vision_tower_config


def test_tiny_tower_emits_one_embedding_per_placeholder_token() -> None:
    tower = build_vision_tower("tiny", dtype=torch.float32)
    grid = torch.tensor([[1, 4, 6], [1, 2, 2]])
    pixels = torch.randn(int(grid.prod(dim=1).sum()), patch_dim(tower.config))
    out = encode(tower, pixels, grid)
    merge = tower.config.spatial_merge_size**2
    assert out.shape == (int(grid.prod(dim=1).sum()) // merge, tower.config.hidden_size)


def test_config_folder_round_trips_and_seeded_weights_repeat(tmp_path) -> None:
    vision_tower_config("tiny").save_pretrained(tmp_path)
    assert vision_tower_config(str(tmp_path)).depth == vision_tower_config("tiny").depth
    first = build_vision_tower(str(tmp_path), dtype=torch.float32, seed=3)
    second = build_vision_tower("tiny", dtype=torch.float32, seed=3)
    for a, b in zip(first.parameters(), second.parameters()):
        assert torch.equal(a, b)


def test_unknown_tower_is_refused_by_name(tmp_path) -> None:
    with pytest.raises(ValueError, match="neither a preset"):
        vision_tower_config(str(tmp_path / "missing"))
