"""What both Megatron recipes hand megatron-core's schedules (``forward_backward_no_pipelining`` colocated, the 1F1B
``forward_backward_pipelining_without_interleaving`` non-colocated): the forward step over ``MimoModel`` and the
per-token loss, so that both train through the same code, and a module's gradient norm."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import torch

LOSS_KEY = "lm loss"
"""The schedule's per-micro-batch record: ``[summed token loss, loss tokens]``."""


def loss_func(loss_mask: torch.Tensor, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Summed per-token loss, its token count, and both for the log (megatron-core's per-token-loss contract: with
    ``calculate_per_token_loss`` the schedule divides nothing; the gradients are divided by the iteration's loss
    tokens once they are all counted)."""
    token_loss = (output.float() * loss_mask.float()).sum()
    tokens = loss_mask.float().sum().to(torch.int)
    return token_loss, tokens, {LOSS_KEY: torch.stack((token_loss.detach(), tokens.detach().float()))}


def forward_step(data_iterator: Iterator[dict[str, Any]], model: Any) -> tuple[Any, Any]:
    """The schedule's ``forward_step_func``: the next micro-batch (``MimoModel.forward``'s keyword arguments)
    through the model; ``MimoModel`` returns the per-token losses and their mask."""
    output, loss_mask = model(**next(data_iterator))
    return output, partial(loss_func, loss_mask)


def summed_loss(records: list[dict[str, torch.Tensor]] | None) -> torch.Tensor:
    """The iteration's summed token loss on this rank (float64; zero where the rank computes no loss)."""
    total = torch.zeros(1, dtype=torch.float64)
    for record in records or []:
        total += record[LOSS_KEY][0].detach().double().cpu()
    return total


def module_grad_norm(module: torch.nn.Module, pgs: Any) -> float:
    """The L2 norm of ``module``'s reduced gradients (megatron-core's ``main_grad``) over its model-parallel
    group (``pgs``: the module's ``ProcessGroupCollection``), each tensor-parallel duplicate counted once, on the
    module's own tensor-parallel group (megatron-core's global one is the wrong one under ``module_to_grid_map``):
    after the schedule's ``finalize_model_grads_func``, before the optimizer clips them."""
    from megatron.core.optimizer.clip_grads import get_grad_norm_fp32
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    grads = [param.main_grad for param in module.parameters()
             if param.requires_grad and getattr(param, "main_grad", None) is not None
             and param_is_not_tensor_parallel_duplicate(param, tp_group=pgs.tp)]
    return float(get_grad_norm_fp32(grads, grad_stats_parallel_group=pgs.mp))
