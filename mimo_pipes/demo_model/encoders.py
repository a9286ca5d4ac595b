"""Vision towers for timing and training: a Qwen2-VL-style tower built offline from its config.

No hub: a preset name, a config folder (``config.json`` of a vision config or of a whole Qwen2-VL
model, whose ``vision_config`` is used) or a checkpoint folder (its weights are loaded). Presets give
random weights, which time exactly like trained ones.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import Any

import torch

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

# Qwen2-VL's own tower (675M parameters) and a tiny one for CPU tests; both take 14-pixel patches,
# 2 frames per temporal patch and merge 2x2 patches into one placeholder token.
TOWER_PRESETS: dict[str, dict[str, Any]] = {
    "qwen2-vl-675m": {"depth": 32, "embed_dim": 1280, "num_heads": 16, "hidden_size": 3584, "mlp_ratio": 4},
    "tiny": {"depth": 2, "embed_dim": 32, "num_heads": 2, "hidden_size": 32, "mlp_ratio": 2},
}


def vision_tower_config(source: str, **overrides: Any) -> Qwen2VLVisionConfig:
    """A preset name (``TOWER_PRESETS``) or a folder holding ``config.json``."""
    if source in TOWER_PRESETS:
        return Qwen2VLVisionConfig(**{**TOWER_PRESETS[source], **overrides})
    path = Path(source)
    if not (path / "config.json").is_file():
        raise ValueError(f"vision tower {source!r} is neither a preset ({', '.join(TOWER_PRESETS)}) nor a folder with config.json")
    config = Qwen2VLVisionConfig.from_pretrained(path)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def vision_tower_identity(source: str) -> str:
    """What a checkpoint records of ``source``: a preset's name, or a folder with a digest of its
    ``config.json`` (an edited config builds another model under the same path)."""
    config = Path(source) / "config.json"
    if source in TOWER_PRESETS or not config.is_file():
        return source
    return f"{source} (config.json sha256 {hashlib.sha256(config.read_bytes()).hexdigest()[:12]})"


def build_vision_tower(
    source: str, *, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu", attn_implementation: str = "sdpa", seed: int = 0
) -> Qwen2VisionTransformerPretrainedModel:
    """The tower from a preset or folder; weights from the folder when it has them, else seeded random."""
    config = vision_tower_config(source)
    config._attn_implementation = attn_implementation
    path = Path(source)
    if source not in TOWER_PRESETS and any(path.glob("*.safetensors")):
        tower = Qwen2VisionTransformerPretrainedModel.from_pretrained(path, config=config, dtype=dtype)
    else:
        torch.manual_seed(seed)
        tower = Qwen2VisionTransformerPretrainedModel._from_config(config, dtype=dtype)
    return tower.to(device)


def patch_dim(config: Qwen2VLVisionConfig) -> int:
    """Values per row of ``pixel_values``: channels x frames per temporal patch x patch pixels."""
    return config.in_channels * config.temporal_patch_size * config.patch_size**2


def encode(tower: Qwen2VisionTransformerPretrainedModel, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
    """One forward over a micro-batch's images (rows concatenated, as the processor emits them)."""
    device = next(tower.parameters()).device
    dtype = next(tower.parameters()).dtype
    output = tower(pixel_values.to(device=device, dtype=dtype), grid_thw=image_grid_thw.to(device))
    return output if isinstance(output, torch.Tensor) else output.pooler_output
