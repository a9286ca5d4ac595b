"""An exchange observer that writes each window's metrics to TensorBoard (``torch.utils.tensorboard``)."""

from __future__ import annotations

from mimo_pipes.observe.metrics import scalars
from mimo_pipes.observe.observer import ExchangeRecord

# Identity of the window, not a figure: the step axis already says which window it is.
_NOT_LOGGED = ("window", "first_step", "microbatches", "dp_rank", "dp_size")


class TensorBoardSink:
    """Writes the scalars of :func:`mimo_pipes.observe.metrics.scalars` for every delivered window, at the global
    step of the window's first micro-batch, to an event file under ``log_dir``. Use it as an observer:
    ``exchange.add_observer(TensorBoardSink(log_dir))``; ``close()`` flushes and closes the file."""

    def __init__(self, log_dir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter  # optional: imported only when logging

        self.writer = SummaryWriter(log_dir)

    def __call__(self, record: ExchangeRecord) -> None:
        if record.metrics is None:
            return
        for name, value in scalars(record.metrics).items():
            if name not in _NOT_LOGGED:
                self.writer.add_scalar(name, value, record.first_step)

    def close(self) -> None:
        self.writer.close()
