"""Argument types shared by the commands' parsers (torch-free: every parser is built for any command)."""

from __future__ import annotations

import argparse
import os


def positive_ints(text: str) -> tuple[int, ...]:
    """``"2,4,8"`` -> ``(2, 4, 8)``: comma-separated integers, each >= 1."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def path(text: str) -> str:
    """A path flag's value with ``~`` expanded (a quoted ``~`` or ``--flag=~/x`` reaches us unexpanded)."""
    return os.path.expanduser(text)
