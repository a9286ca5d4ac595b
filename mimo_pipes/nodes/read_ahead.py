"""Reading ahead of the consumer, the library's one mechanism: :class:`ReadAhead` (whole items made on a thread of
its own, each with the state that goes with it), :func:`on_hand_out` (what must follow the consumer, not the
thread) and :func:`fill_ahead` (windows handed to a node's own workers ahead of the one asked for)."""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, NamedTuple, TypeVar

import torch
from torchdata.nodes import BaseNode

from mimo_pipes.nodes.base import kept_state
from mimo_pipes.samples.sample import Window
from mimo_pipes.samples.serial_torch import serial_torch_here

T = TypeVar("T")

class _HandOut(threading.local):
    """Per thread: the actions deferred to the hand-out of the item being made (None: the thread does not read ahead)."""

    actions: list[Callable[[], None]] | None = None


_hand_out = _HandOut()


def on_hand_out(action: Callable[[], None]) -> None:
    """Run ``action`` when the item being made now is handed to the consumer: at once on a thread that does not
    read ahead, else by :meth:`ReadAhead.take` on the consumer's thread (observers and metrics follow the
    consumer, in order, never the read-ahead)."""
    deferred = _hand_out.actions
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
    """Makes items with ``make()`` on a thread of its own (``name``), up to ``depth`` ahead of the consumer, each
    with ``snapshot()`` taken right after it on that thread: the state to save once the item is handed out (as
    torchdata's ``Prefetcher`` inside its ``Loader``, whose snapshot travels with the item), kept as it is, so
    ``snapshot`` returns a value nothing changes later (:func:`~mimo_pipes.nodes.base.kept_state`). :meth:`take` hands
    them out in order on the consumer's thread; an error of ``make`` is raised there, the same exception, once
    the items made before it are taken, and the thread has ended by then. ``device``: the CUDA device the thread
    works on (default: the consumer's, when CUDA is in use; the current device is per thread).

    Stopping is cooperative (:meth:`stop`): the thread first makes all it may (``depth`` items beyond those
    taken, or up to the end or an error), then ends. Where items come from collectives (the exchange), every rank
    of a module that stops at the same consumer position has then made the same items, so no rank's thread is
    left waiting in a collective its peers' threads never enter. :meth:`interrupt` ends it with an action run
    in place of its next item (the exchange announces a failure there)."""

    def __init__(self, make: Callable[[], T], snapshot: Callable[[], Any], depth: int, name: str = "mimo-pipes-read-ahead",
                 device: Any = None) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.make, self.snapshot, self.depth = make, snapshot, depth
        self._condition = threading.Condition()
        self._made: collections.deque[_Made] = collections.deque()
        self._produced = self._delivered = 0
        self._stopping = self._making = False
        self._fill = True
        self._interrupt: Callable[[int], None] | None = None
        self._final: _Made | None = None  # the end or the error, once taken
        if device is None and torch.cuda.is_available() and torch.cuda.is_initialized():
            device = torch.cuda.current_device()
        self._device = device
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _next_turn(self) -> Callable[[int], None] | bool:
        """Waits for room; True: make the next item, False: end, or the interrupting action to run."""
        with self._condition:
            while not self._stopping and self._interrupt is None and self._full():
                self._condition.wait()
            if self._interrupt is not None:
                return self._interrupt
            if self._full() or (self._stopping and not self._fill):  # stopping, and all is made that any peer may have made
                return False
            self._making = True
            return True

    def _full(self) -> bool:
        return self._produced >= self._delivered + self.depth

    def _run(self) -> None:
        serial_torch_here()  # collation's large operations on this thread alone: an intra-op team spins on the workers' cores
        if self._device is not None:
            torch.cuda.set_device(self._device)
        while True:
            turn = self._next_turn()
            if turn is False:
                return
            if turn is not True:
                with contextlib.suppress(BaseException):  # the action's own failure is the one already known
                    turn(self._produced)
                return
            try:
                with _deferring() as actions:
                    item = self.make()
                made = _Made("item", item, self.snapshot(), actions)
            except StopIteration:
                made = _Made("end", None, None, [])
            except BaseException as error:  # noqa: BLE001 - raised on the consumer's thread
                made = _Made("error", error, None, [])
            with self._condition:
                self._produced += 1
                self._making = False
                if not self._stopping:
                    self._made.append(made)
                self._condition.notify_all()
            if made.kind != "item":
                return

    def take(self) -> tuple[T, Any]:
        """The next item and the state after it; raises ``make``'s StopIteration or error in its turn."""
        if self._final is not None:  # the stream ended or failed: so it stays
            self._raise(self._final)
        with self._condition:
            while not self._made:
                if not self._thread.is_alive():
                    raise RuntimeError(f"the {self._thread.name} thread ended without an item (it was stopped)")
                self._condition.wait(timeout=1.0)
            made = self._made.popleft()
            if made.kind == "item":
                self._delivered += 1
            self._condition.notify_all()
        if made.kind != "item":
            self._thread.join()  # it ended after publishing: nothing of it runs once the consumer sees the end
            self._final = made
            self._raise(made)
        for action in made.actions:
            action()
        return made.value, made.state

    @staticmethod
    def _raise(made: _Made) -> None:
        if made.kind == "end":
            raise StopIteration
        raise made.value

    def made_ahead(self) -> tuple[list[T], bool]:
        """The items made and not taken yet, and whether one is being made now."""
        with self._condition:
            return [made.value for made in self._made if made.kind == "item"], self._making

    def interrupt(self, action: Callable[[int], None]) -> None:
        """End the thread with ``action(items made)`` run on it in place of its next item (after the item it is
        making, at once when it waits for room)."""
        with self._condition:
            self._interrupt = action
            self._condition.notify_all()

    def stop(self, wait_s: float | None = None, *, fill: bool = True) -> None:
        """Drop what was made ahead and let the thread end once it has made all it may (see the class; ``fill``
        False: after the item it is making); wait up to ``wait_s`` seconds for it (None: until it ends; 0: not at all)."""
        with self._condition:
            self._stopping = True
            self._fill = fill
            self._made.clear()
            self._condition.notify_all()
        if wait_s is None or wait_s > 0:
            self.join(wait_s)

    def join(self, wait_s: float | None = None) -> None:
        if self._thread is not threading.current_thread():
            self._thread.join(wait_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


def fill_ahead(source: BaseNode[Window], pending: collections.deque[T], ahead: int,
               submit: Callable[[Window, Any], T]) -> StopIteration | None:
    """Reads windows from ``source`` until ``pending`` holds ``ahead`` + 1 entries, each made by ``submit(window,
    state_after)`` (the source's state right after it handed the window out: what a state saved once the window
    is delivered holds). None while the source goes on; once it has ended, the StopIteration it ended with (which
    may carry what its end still owes: :class:`~mimo_pipes.nodes.module_end.ModuleEnd`)."""
    while len(pending) <= ahead:
        try:
            window = next(source)
        except StopIteration as end:
            return end
        pending.append(submit(window, kept_state(source)()))
    return None
