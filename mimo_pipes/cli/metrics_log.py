"""The exchange's metrics during `mimo-pipes run`: TensorBoard scalars and a periodic log line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mimo_pipes.config import JobOptions
from mimo_pipes.metrics import summary_line
from mimo_pipes.observer import ExchangeRecord


class MetricsLog:
    """On DP rank 0 of a module: the exchange's metrics to TensorBoard and, every N windows, to stderr."""

    def __init__(self, module: str, options: JobOptions) -> None:
        self.module = module
        self.interval = options.log_interval if options.progress else None
        self.sink = None
        if options.tensorboard is not None:
            from mimo_pipes.tensorboard_sink import TensorBoardSink

            self.sink = TensorBoardSink(str(Path(options.tensorboard) / module))
        self.printed_at = 0

    def __call__(self, record: ExchangeRecord) -> None:
        if self.sink is not None:
            self.sink(record)
        windows = record.metrics["cumulative/windows"] if record.metrics is not None else 0
        if self.interval and windows % self.interval == 0:
            self._print(record.metrics)

    def finish(self, metrics: dict[str, Any] | None) -> None:
        if self.interval is not None and metrics is not None and metrics["cumulative/windows"] != self.printed_at:
            self._print(metrics)

    def _print(self, metrics: dict[str, Any]) -> None:
        self.printed_at = metrics["cumulative/windows"]
        from tqdm import tqdm

        # Through tqdm: on the rank that draws the progress bar the line gets its own line, not the bar's end.
        tqdm.write(f"exchange metrics: {summary_line(self.module, metrics)}", file=sys.stderr)

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()


def attach_metrics(loader, position, options: JobOptions) -> MetricsLog | None:
    """Metrics come from the exchange node, identical on every DP rank of a module but for the rank's own
    times and bytes: the first rank of each module reports them."""
    exchange = loader.exchange_node() if hasattr(loader, "exchange_node") else None
    first = position.dp_rank == 0 and position.tp_rank == 0 and position.cp_rank == 0 and position.pp_rank == 0
    if exchange is None or not first or (options.tensorboard is None and not options.progress):
        return None
    log = MetricsLog(position.module.name, options)
    exchange.add_observer(log)
    return log


