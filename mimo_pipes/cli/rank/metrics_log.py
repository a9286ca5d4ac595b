"""The exchange's metrics during `mimo-pipes run`: TensorBoard scalars and a periodic log line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mimo_pipes.config.job_options import JobOptions
from mimo_pipes.observe.metrics import summary_line
from mimo_pipes.observe.observer import ExchangeRecord


class MetricsLog:
    """On DP rank 0 of a module: the exchange's metrics to TensorBoard and, every N windows, to stderr.

    ``periodic``: this process draws the progress bar (rank 0), so its lines go through the bar's writer
    and keep it whole; other processes print no periodic line, and hand their last one to rank 0
    (:meth:`final_line`), which prints it once the bar is closed."""

    def __init__(self, module: str, options: JobOptions, periodic: bool) -> None:
        self.module = module
        self.interval = options.log_interval if options.progress else None
        self.periodic = periodic
        self.sink = None
        if options.tensorboard is not None:
            from mimo_pipes.observe.tensorboard_sink import TensorBoardSink

            self.sink = TensorBoardSink(str(Path(options.tensorboard) / module))
        self.printed_at = 0

    def __call__(self, record: ExchangeRecord) -> None:
        if self.sink is not None:
            self.sink(record)
        windows = record.metrics["cumulative/windows"] if record.metrics is not None else 0
        if self.periodic and self.interval and windows % self.interval == 0:
            self._print(record.metrics)

    def final_line(self, metrics: dict[str, Any] | None) -> str | None:
        """The line of the run's last figures, for rank 0 to print at the end (None: off, or already printed)."""
        if self.interval is None or metrics is None or metrics["cumulative/windows"] == self.printed_at:
            return None
        return _line(self.module, metrics)

    def _print(self, metrics: dict[str, Any]) -> None:
        self.printed_at = metrics["cumulative/windows"]
        from tqdm import tqdm

        # Through tqdm: the line gets its own line above the progress bar, not the bar's end.
        tqdm.write(_line(self.module, metrics), file=sys.stderr)

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()


def _line(module: str, metrics: dict[str, Any]) -> str:
    return f"exchange metrics: {summary_line(module, metrics)}"


def attach_metrics(loader, position, options: JobOptions, periodic: bool) -> MetricsLog | None:
    """Metrics come from the exchange node, identical on every DP rank of a module but for the rank's own
    times and bytes: the first rank of each module reports them (``periodic``: see :class:`MetricsLog`)."""
    exchange = loader.exchange_node() if hasattr(loader, "exchange_node") else None
    first = position.dp_rank == 0 and position.tp_rank == 0 and position.cp_rank == 0 and position.pp_rank == 0
    if exchange is None or not first or (options.tensorboard is None and not options.progress):
        return None
    log = MetricsLog(position.module.name, options, periodic)
    exchange.add_observer(log)
    return log


