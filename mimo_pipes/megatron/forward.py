"""The keyword arguments a given ``MimoModel.forward`` takes: megatron-core's releases differ (``packing_kwargs``
arrived after 0.16), so a batch is fitted to the installed signature instead of guessed. megatron-core is
imported only when :func:`mimo_forward` is called."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any


def mimo_forward() -> Callable[..., Any]:
    """The installed megatron-core's ``MimoModel.forward`` (ImportError when megatron-core or its MIMO
    model is absent)."""
    from megatron.core.models.mimo import MimoModel

    return MimoModel.forward


def forward_parameters(forward: Callable[..., Any]) -> tuple[str, ...]:
    """The keyword parameters of ``forward`` (``self`` left out)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(name for name, p in inspect.signature(forward).parameters.items() if p.kind in kinds and name != "self")


def fit_to_forward(kwargs: Mapping[str, Any], forward: Callable[..., Any] | None = None) -> dict[str, Any]:
    """``kwargs`` without the keys ``forward`` (default: the installed ``MimoModel.forward``) lacks, where
    their value is None; a key it lacks with a value raises ValueError naming it (a packed micro-batch on a
    megatron-core without ``packing_kwargs`` cannot be run as packed)."""
    taken = forward_parameters(forward if forward is not None else mimo_forward())
    refused = [key for key, value in kwargs.items() if key not in taken and value is not None]
    if refused:
        raise ValueError(f"this MimoModel.forward takes no {', '.join(refused)} (it takes {', '.join(taken)}); "
                         "a packed micro-batch needs a megatron-core whose MimoModel takes packing_kwargs (0.17 or later)")
    return {key: value for key, value in kwargs.items() if key in taken}
