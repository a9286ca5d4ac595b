"""One model's full weights loaded into any layout of the Megatron recipes: the colocated recipe's ``MimoModel``
(every module whole on one rank) saved as its parameters by name, and each rank of the non-colocated recipe given
its own part of them. megatron-core initialises each tensor-parallel rank and pipeline stage from its own random
state, so the two recipes start from the same weights only when one full set is loaded into both.

A rank's part: its pipeline stage's layers (a layer's ``layer_number`` is its place in the whole model, its name
the place in the stage), and of a tensor-parallel parameter (``tensor_model_parallel``) its rank's slice along
``partition_dim``. megatron-core lays the fused QKV projection out query group by query group, so equal slices
along the output dimension are whole heads, as its column-parallel layers expect."""

from __future__ import annotations

import re
from typing import Any

import torch

LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of the colocated ``MimoModel`` (unwrapped from its DDP), by name, copied to the CPU."""
    inner = getattr(model, "module", model)
    return {name: param.detach().cpu().clone() for name, param in inner.named_parameters()}


def _whole_name(module: torch.nn.Module, name: str) -> str:
    """``name`` inside a pipeline stage as it is in the whole model (its layer numbered by ``layer_number``)."""
    found = LAYER.match(name)
    if found is None:
        return name
    layer = module.decoder.layers[int(found.group(1))]
    return f"decoder.layers.{layer.layer_number - 1}.{name[found.end():]}"


def load_part(module: torch.nn.Module, weights: dict[str, torch.Tensor], *, prefix: str, tp_rank: int, tp_size: int) -> int:
    """Copies into ``module`` (a rank's module, DDP unwrapped: the language model's stage or a modality submodule,
    ``prefix`` its name in ``MimoModel``) its part of ``weights``; returns how many parameters it set. Every
    parameter must find its tensor, of the shape its slice has."""
    loaded = 0
    for name, param in module.named_parameters():
        whole = weights[prefix + _whole_name(module, name)]
        if getattr(param, "tensor_model_parallel", False) and tp_size > 1:
            whole = whole.chunk(tp_size, dim=param.partition_dim)[tp_rank]
        if whole.shape != param.shape:
            raise ValueError(f"{prefix}{name}: the full weights' part has shape {tuple(whole.shape)}, the rank's parameter {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(whole)
        loaded += 1
    return loaded


def unwrapped(module: Any) -> torch.nn.Module:
    return getattr(module, "module", module)
