"""Counts where they enter: consumed micro-batches and samples, batch sizes, window sizes, workers.

A count is an integer. Python's ``int``, numpy's integer scalars (``np.int64``) and a torch integer tensor of
one element with no dimensions are the same count and come out as ``int``; ``bool`` (an ``int`` to Python, a
flag to a person), floats (also ``6.0``: ``24 / 4`` gives a float, and a float position fails far from where
it was given), strings and everything else are refused where they are given, in one line naming the argument.
"""

from __future__ import annotations

import numbers
import sys

from mimo_pipes.errors import ConfigError


def as_count(value: object, name: str, *, minimum: int | None = 0) -> int:
    """``value`` as an ``int`` >= ``minimum``; ConfigError naming ``name`` (the argument, field or flag) otherwise.
    ``minimum`` None checks the kind alone (a setting whose range its own check words)."""
    number = _integer(value)
    if number is None:
        wanted = "an integer" if minimum is None else f"an integer >= {minimum}"
        raise ConfigError(name, f"must be {wanted}, got {value!r} ({_kind(value)})")
    if minimum is not None and number < minimum:
        raise ConfigError(name, f"must be an integer >= {minimum}, got {number}")
    return number


def _integer(value: object) -> int | None:
    """The integer ``value`` is, or None when it is not an integer (a bool is not)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):  # int and numpy's integer scalars (numpy's bool_ is not one)
        return int(value)
    torch = sys.modules.get("torch")  # a torch tensor exists only where torch is imported already
    if torch is not None and isinstance(value, torch.Tensor):
        integral = value.dim() == 0 and not (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool)
        return int(value.item()) if integral else None
    return None


def _kind(value: object) -> str:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"
