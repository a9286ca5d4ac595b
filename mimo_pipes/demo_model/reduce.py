"""A trainer's sums inside one module: gradients and scalars all-reduced over the module's DP group."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist


def sum_over(value: float, group: dist.ProcessGroup | None) -> float:
    """``value`` summed over the group's ranks, in float64 (a token count or a loss sum)."""
    tensor = torch.tensor([value], dtype=torch.float64)
    if group is not None:
        dist.all_reduce(tensor, group=group)
    return float(tensor.item())


def sum_gradients(parameters: Iterable[torch.nn.Parameter], group: dist.ProcessGroup | None) -> None:
    """Sum the gradients over the group in one flat all-reduce (no averaging: the loss is already divided by
    the global batch's token count). A parameter without a gradient counts as zeros, so every rank reduces
    the same flat buffer."""
    params = list(parameters)
    if group is None or dist.get_world_size(group) == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    offset = 0
    for param in params:
        count = param.numel()
        param.grad = flat[offset : offset + count].view_as(param).clone()
        offset += count
