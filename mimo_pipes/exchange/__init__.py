"""The one package that moves bytes between ranks: process groups, the exchange's collectives and buffers,
and the pure plan and wire format they follow. Everything else in mimo_pipes is plain logic."""

from mimo_pipes.exchange.buffers import ExchangeBuffers
from mimo_pipes.exchange.collectives import AFTER_EXCHANGE, announce_end, announce_failure, exchange_window
from mimo_pipes.exchange.context import ExchangeContext, RankLayout

__all__ = [
    "AFTER_EXCHANGE",
    "ExchangeBuffers",
    "ExchangeContext",
    "RankLayout",
    "announce_end",
    "announce_failure",
    "exchange_window",
]
