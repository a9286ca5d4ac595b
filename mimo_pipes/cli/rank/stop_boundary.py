"""Stopping a rank's loop on SIGTERM / SIGINT at a micro-batch boundary, agreed by every rank when the job
saves its state on a stop."""

from __future__ import annotations

from mimo_pipes.cli.job.launcher import report_phase
from mimo_pipes.cli.rank.setup import RankSetup
from mimo_pipes.cli.rank.stop_signal import StopRequested, StopSignal
from mimo_pipes.exchange.world import largest_over_ranks


class StopAtBoundary:
    """Reads SIGTERM / SIGINT at every micro-batch (or iteration) boundary of a rank's loop.

    ``saving``: the job saves its state on a stop, so every rank must stop at the same boundary: the ranks
    agree at each boundary (the largest signal any rank received, one small all-reduce over the control
    group). Without it each rank stops on its own signal."""

    def __init__(self, setup: RankSetup, saving: bool) -> None:
        self.setup = setup
        self.saving = saving
        self.signal = StopSignal()

    def __enter__(self) -> StopAtBoundary:
        self.signal.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.signal.__exit__(*exc_info)

    def requested(self) -> int:
        """The signal to stop for (0: go on); collective when saving."""
        local = self.signal.signum or 0
        return largest_over_ranks(local, self.setup.control) if self.saving else local

def stop_job(signum: int, saved: str | None, consumed: int) -> StopRequested:
    """The rank's exception for a stop (``saved``: where a complete state of ``consumed`` micro-batches went)."""
    if saved is not None:
        report_phase("saved", consumed)
    return StopRequested(signum, saved)
