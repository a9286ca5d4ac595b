"""The exchange's timing hook: what happened in one window, handed to observers on the training thread.

:class:`~mimo_pipes.nodes.BalanceExchange` calls each observer once per window it delivers, in window
order, from its ``next()`` (so on the thread that consumes the graph), with an :class:`ExchangeRecord`.
Benchmarks, metrics and loggers read the same record; none of them reaches into the exchange. Plain
data only, no torch.distributed: the record's figures are all known on every rank without any collective
beyond the exchange's own all-gather.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

# Phases of one window's exchange, in the order they run on the exchanging thread:
# encoding: per-sample cost and encoded size (validates that every sample can be encoded); gather: the
# all-gather of (status, window shape, per-sample cost, encoded size, image tokens); plan: balancing and the
# exchange plan; encode: the send buffer (and its copy to the GPU under NCCL); all_to_all: the ragged
# collective; decode: received samples back into canonical order. Then collate: padding into micro-batches, by
# the window collator after the exchange (on its own thread, or the training thread), set when it hands the
# window on.
PHASES = ("encoding", "gather", "plan", "encode", "all_to_all", "decode", "collate")
EXCHANGE_PHASES = PHASES[:-1]  # what the exchanging thread does (its metrics' time/{phase}_s)


@dataclass
class ExchangeRecord:
    """One window as one DP rank exchanged it. Lists are indexed by micro-batch ``m`` of the window and
    canonical position ``j`` (0 .. B-1) in the global micro-batch, as the readers placed the samples:
    DP rank r held positions ``r*B/d .. (r+1)*B/d - 1`` before the exchange. ``assignment[m][g]`` lists the
    flat indices ``m'*B + j`` placed in canonical slot g of output micro-batch m (slot g belongs to DP rank
    ``g // (G/d)``). Observers must treat it as read-only."""

    sequence: int  # windows exchanged before this one since the start of training
    first_step: int  # global micro-batch index of the window's first micro-batch
    dp_rank: int
    dp_size: int
    grid_size: int  # G, canonical slots per micro-batch
    across_microbatches: bool
    costs: list[list[int]] = field(default_factory=list)  # [m][j] the balanced cost
    image_tokens: list[list[int]] = field(default_factory=list)  # [m][j] (0 for a sample without the count)
    encoded_bytes: list[list[int]] = field(default_factory=list)  # [m][j] wire size (0 with DP 1: nothing encoded)
    assignment: list[list[list[int]]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # per PHASES entry that ran (collate: by the window collator)
    started_at: float = 0.0  # time.perf_counter() when the exchange began, on the exchanging thread
    exchange_seconds: float = 0.0  # the whole exchange of the window (collation is after it)
    bytes_sent: int = 0  # this rank's payload in the all_to_all
    bytes_received: int = 0
    samples_sent: int = 0
    samples_received: int = 0
    window_bytes: int = 0  # data the delivered window holds (rows or samples): what prefetching it costs
    on_training_thread: bool = True  # False when a background thread exchanged it (overlap)
    wait_seconds: float = 0.0  # the training thread's wait for this window in next() (set on delivery)
    metrics: dict[str, Any] | None = None  # the node's metrics for this window, when it collects them

    @property
    def micro_batch_size(self) -> int:
        return len(self.costs[0]) if self.costs else 0


class ExchangeObserver(Protocol):
    """Called once per delivered window, in order, on the thread that calls the node's ``next()``.

    Any callable taking an :class:`ExchangeRecord` qualifies. Keep it cheap: it runs on the training
    thread. An exception raised here propagates out of ``next()``."""

    def __call__(self, record: ExchangeRecord) -> None: ...
