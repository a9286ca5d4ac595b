"""Reading ahead of the consumer, the library's one mechanism: :class:`ReadAhead` (whole items made on a thread of
its own, each with the state that goes with it), :func:`on_hand_out` (what must follow the consumer, not the
thread) and :func:`fill_ahead` (windows handed to a node's own workers ahead of the one asked for)."""

from __future__ import annotations

import collections
import copy
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, NamedTuple, TypeVar

import torch
from torchdata.nodes import BaseNode

from mimo_pipes.samples.sample import Window

T = TypeVar("T")

STOP_WAIT_S = 5.0
"""How long :meth:`ReadAhead.stop` waits for the thread to end before it returns (the caller then stops what the
thread reads from, which ends an item still being made, and joins it with :meth:`ReadAhead.join`)."""

_hand_out = threading.local()


def on_hand_out(action: Callable[[], None]) -> None:
    """Run ``action`` when the item being made now is handed to the consumer: at once on a thread that does not
    read ahead, else by :meth:`ReadAhead.take` on the consumer's thread (observers and metrics follow the
    consumer, in order, never the read-ahead)."""
    deferred = getattr(_hand_out, "actions", None)
    if deferred is None:
        action()
    else:
        deferred.append(action)


@contextmanager
def _deferring() -> Iterator[list[Callable[[], None]]]:
    actions: list[Callable[[], None]] = []
    _hand_out.actions = actions
    try:
        yield actions
    finally:
        _hand_out.actions = None


class _Made(NamedTuple):
    kind: str  # "item", "end" or "error"
    value: Any  # the item or the error
    state: Any  # what ``snapshot()`` said right after the item was made
    actions: list[Callable[[], None]]  # run when the item is handed out (on_hand_out)


class ReadAhead(Generic[T]):
    """Makes items with ``make()`` on a thread of its own, up to ``depth`` ahead of the consumer, each with
    ``snapshot()`` taken right after it on that thread: the state to save once the item is handed out (as
    torchdata's ``Prefetcher`` inside its ``Loader``, whose snapshot travels with the item). :meth:`take` hands
    them out in order on the consumer's thread; an error of ``make`` is raised there, the same exception, once
    the items made before it are taken, and the thread has ended by then. :meth:`stop` ends the thread after
    the item it is making (the rest is dropped)."""

    def __init__(self, make: Callable[[], T], snapshot: Callable[[], Any], depth: int, name: str = "mimo-pipes-read-ahead") -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.make, self.snapshot, self.depth = make, snapshot, depth
        self._condition = threading.Condition()
        self._made: collections.deque[_Made] = collections.deque()
        self._stopping = False
        # The current CUDA device is per thread: the thread makes items on the consumer's (an exchange staged on the GPU).
        self._device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if self._device is not None:
            torch.cuda.set_device(self._device)
        while True:
            with self._condition:
                while not self._stopping and len(self._made) >= self.depth:
                    self._condition.wait()
                if self._stopping:
                    return
            try:
                with _deferring() as actions:
                    item = self.make()
                made = _Made("item", item, copy.deepcopy(self.snapshot()), actions)
            except StopIteration:
                made = _Made("end", None, None, [])
            except BaseException as error:  # noqa: BLE001 - raised on the consumer's thread
                made = _Made("error", error, None, [])
            with self._condition:
                if self._stopping:
                    return
                self._made.append(made)
                self._condition.notify_all()
            if made.kind != "item":
                return

    def take(self) -> tuple[T, Any]:
        """The next item and the state after it; raises ``make``'s StopIteration or error in its turn."""
        with self._condition:
            while not self._made:
                if not self._thread.is_alive():
                    raise RuntimeError("the read-ahead thread ended without an item (it was stopped)")
                self._condition.wait(timeout=1.0)
            made = self._made.popleft()
            self._condition.notify_all()
        if made.kind != "item":
            self._thread.join()  # it ended after publishing: nothing of it runs once the consumer sees the end
            if made.kind == "end":
                raise StopIteration
            raise made.value
        for action in made.actions:
            action()
        return made.value, made.state

    def stop(self, wait_s: float | None = STOP_WAIT_S, *, fill: bool = True) -> None:
        """End the thread and drop what was made ahead. With ``fill`` it first makes all it may (``depth`` items
        ahead of the consumer, or up to the end or an error): where the items come from collectives (the exchange),
        every rank of a module that stops at the same consumer position has then made the same items, so no rank's
        thread is left waiting in an exchange its peers' threads never enter. Waits up to ``wait_s`` seconds for the
        thread to end (None: until it ends)."""
        with self._condition:
            while fill and len(self._made) < self.depth and self._thread.is_alive() and not self._ended():
                self._condition.wait(timeout=1.0)
            self._stopping = True
            self._made.clear()
            self._condition.notify_all()
        self.join(wait_s)

    def _ended(self) -> bool:
        return bool(self._made) and self._made[-1].kind != "item"

    def join(self, wait_s: float | None = None) -> None:
        if self._thread is not threading.current_thread():
            self._thread.join(wait_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


def fill_ahead(source: BaseNode[Window], pending: collections.deque[T], ahead: int, submit: Callable[[Window, Any], T]) -> bool:
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
