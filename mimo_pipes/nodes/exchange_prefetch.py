"""The exchange's prefetch thread: windows exchanged ahead of the consumer on a dedicated group."""

from __future__ import annotations

import collections
import contextlib
import copy
import threading
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torchdata.nodes import BaseNode

from mimo_pipes.exchange import AFTER_EXCHANGE, announce_end, announce_failure
from mimo_pipes.samples.sample import Window

if TYPE_CHECKING:
    from mimo_pipes.nodes.window_exchange import WindowExchange

# Windows exchanged ahead of the consumer. Every rank's thread runs at most this far ahead, which bounds
# memory (two extra windows per rank) and tells a stopping thread which exchanges its peers may have begun.
PREFETCH_DEPTH = 2


class Prefetched(NamedTuple):
    """Windows an overlapped exchange holds ahead of the consumer."""

    queued: int  # exchanged, not yet delivered
    in_flight: int  # being exchanged on the prefetch thread now (0 or 1)


class ExchangePrefetchThread:
    """Background exchanges on a dedicated group (not torchdata's ``Prefetcher`` node: a thread of the balance
    exchange, which owns it and stops it in ``shutdown()`` or when it is collected). Stops cooperatively: it finishes the exchanges any peer
    may already have entered (up to ``delivered + PREFETCH_DEPTH``), so no peer is left in a collective."""

    def __init__(self, source: BaseNode[Window], exchange: WindowExchange, first_sequence: int) -> None:
        self.source = source
        self.exchange = exchange
        self.condition = threading.Condition()
        self.results: collections.deque[tuple[str, Any, Any]] = collections.deque()
        self.produced = 0
        self.delivered = 0
        self.first_sequence = first_sequence
        self.stopping = False
        self.failure: BaseException | None = None  # a failure after delivery: announced in place of the next exchange
        self.in_flight = 0
        self.thread = threading.Thread(target=self._run, name="mimo-pipes-exchange", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        device = self.exchange.ctx.device
        if device is not None and device.type == "cuda":
            torch.cuda.set_device(device)  # the current CUDA device is per thread
        while True:
            with self.condition:
                while not self.stopping and self.failure is None and self.produced >= self.delivered + PREFETCH_DEPTH:
                    self.condition.wait()
                failure = self.failure
                if failure is None and self.produced >= self.delivered + PREFETCH_DEPTH:
                    return
            sequence = self.first_sequence + self.produced
            if failure is not None:
                with contextlib.suppress(BaseException):  # raises the failure itself, here already known
                    announce_failure(self.exchange.ctx, sequence, failure, AFTER_EXCHANGE)
                return
            try:
                try:
                    window = next(self.source)
                except StopIteration:
                    announce_end(self.exchange.ctx, sequence)
                    self._publish("end", None, None)
                    return
                except Exception as error:  # noqa: BLE001 - made an exception on every rank
                    announce_failure(self.exchange.ctx, sequence, error)
                state_after = copy.deepcopy(self.source.state_dict())
                self.in_flight = 1
                try:
                    result = self.exchange(window, sequence, on_training_thread=False)
                finally:
                    self.in_flight = 0
            except BaseException as error:  # noqa: BLE001 - handed to the consumer thread
                self._publish("error", error, None)
                return
            self._publish("window", result, state_after)

    def _publish(self, kind: str, value: Any, state: Any) -> None:
        with self.condition:
            self.produced += 1
            self.results.append((kind, value, state))
            self.condition.notify_all()

    def take(self) -> tuple[str, Any, Any]:
        with self.condition:
            while not self.results:
                if not self.thread.is_alive():
                    raise RuntimeError("exchange thread ended without a result")
                self.condition.wait(timeout=1.0)
            item = self.results.popleft()
            if item[0] == "window":
                self.delivered += 1
            self.condition.notify_all()
            return item

    def queued_windows(self) -> list[Any]:
        with self.condition:
            return [value[0] for kind, value, _ in self.results if kind == "window"]

    def fail(self, error: BaseException) -> None:
        with self.condition:
            self.failure = error
            self.condition.notify_all()

    def stop(self, join_timeout: float | None) -> None:
        with self.condition:
            self.stopping = True
            self.condition.notify_all()
        if join_timeout is None or join_timeout > 0:
            self.thread.join(join_timeout)

