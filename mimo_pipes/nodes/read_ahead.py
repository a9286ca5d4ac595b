"""Reading windows ahead of the consumer, for the nodes that work on them on threads of their own."""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from torchdata.nodes import BaseNode

from mimo_pipes.samples.sample import Window

T = TypeVar("T")


def fill_ahead(source: BaseNode[Window], pending: deque[T], ahead: int, submit: Callable[[Window, Any], T]) -> bool:
    """Reads windows from ``source`` until ``pending`` holds ``ahead`` + 1 entries, each made by ``submit(window,
    state_after)`` (the source's state right after it handed the window out: what a state saved once the window
    is delivered holds). False once the source has ended."""
    while len(pending) <= ahead:
        try:
            window = next(source)
        except StopIteration:
            return False
        pending.append(submit(window, copy.deepcopy(source.state_dict())))
    return True
