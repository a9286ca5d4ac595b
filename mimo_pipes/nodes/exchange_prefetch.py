"""The exchange's prefetch thread: windows exchanged ahead of the consumer on a dedicated group, through the
library's one read-ahead mechanism (:class:`~mimo_pipes.nodes.read_ahead.ReadAhead`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from torchdata.nodes import BaseNode

from mimo_pipes.exchange import AFTER_EXCHANGE, announce_end, announce_failure
from mimo_pipes.nodes.base import kept_state
from mimo_pipes.nodes.read_ahead import ReadAhead
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
    exchange, which owns it and stops it in ``shutdown()`` or when it is collected): a :class:`ReadAhead` whose
    items are exchanged windows, each with its source's state after the window was read. Stops cooperatively: it
    finishes the exchanges any peer may already have entered (up to ``delivered + PREFETCH_DEPTH``), so no peer
    is left in a collective; a failure after delivery (:meth:`fail`) is announced in place of the next exchange."""

    def __init__(self, source: BaseNode[Window], exchange: WindowExchange, first_sequence: int) -> None:
        self.source = source
        self.exchange = exchange
        self.first_sequence = first_sequence
        self._attempted = 0  # exchanges begun on the thread (only the thread counts them)
        self.ended_at: int | None = None  # the sequence the module agreed on the end at (set on the thread)
        device = exchange.ctx.device
        self.reader: ReadAhead[Any] = ReadAhead(self._exchanged, kept_state(source), PREFETCH_DEPTH, name="mimo-pipes-exchange",
                                                device=device if device is not None and device.type == "cuda" else None)

    def _exchanged(self) -> Any:
        """The next window of the source, exchanged (on the thread): its peers' same window, or their end or failure."""
        sequence = self.first_sequence + self._attempted
        self._attempted += 1
        try:
            window = next(self.source)
        except StopIteration:
            announce_end(self.exchange.ctx, sequence)
            self.ended_at = sequence
            raise
        except Exception as error:  # noqa: BLE001 - made an exception on every rank
            announce_failure(self.exchange.ctx, sequence, error)
        return self.exchange(window, sequence, on_training_thread=False)

    def take(self) -> tuple[Any, Any]:
        """The next exchanged window (with its record) and the source's state after it; raises the end or a failure."""
        return self.reader.take()

    def prefetched(self) -> Prefetched:
        queued, making = self.reader.made_ahead()
        return Prefetched(len(queued), int(making))

    def queued_windows(self) -> list[Any]:
        return [value[0] for value in self.reader.made_ahead()[0]]

    def fail(self, error: BaseException) -> None:
        ctx, first = self.exchange.ctx, self.first_sequence
        # raises the failure itself, here already known: the thread suppresses it
        self.reader.interrupt(lambda made: announce_failure(ctx, first + made, error, AFTER_EXCHANGE))

    def end_agreed(self, wait_s: float) -> bool:
        """Whether the thread ended after agreeing on the end (waiting up to ``wait_s`` seconds for it to end)."""
        self.reader.join(wait_s)
        return not self.reader.alive and self.ended_at is not None

    def stop(self, join_timeout: float | None) -> None:
        self.reader.stop(join_timeout)
