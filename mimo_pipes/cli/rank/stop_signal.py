"""SIGTERM and SIGINT on a rank: a flag its loop reads at every micro-batch boundary.

A scheduler's preemption notice (SIGTERM) or Ctrl-C (SIGINT) must not kill a rank in the middle of a
collective or of a save: the handler only records the signal, and the loop stops at the next boundary
(after saving a complete state when the job saves one). A second signal stops the rank at once.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_status(signum: int) -> int:
    """The shell's exit status of a process stopped by ``signum``: 143 for SIGTERM, 130 for SIGINT."""
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopRequested(Exception):
    """The job was asked to stop (``signum``); raised by a rank's loop at a micro-batch boundary."""

    def __init__(self, signum: int, saved: str | None = None) -> None:
        self.signum = signum
        self.saved = saved
        super().__init__(f"stopped by {signal_name(signum)}" + (f" (state saved to {saved})" if saved else ""))


class StopSignal:
    """Installed for the duration of a rank's loop (``with StopSignal() as stop``): ``stop.signum`` is the
    first SIGTERM / SIGINT received, None before. Only the main thread can install handlers; elsewhere (a
    trainer's thread) nothing is installed and ``signum`` stays None."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignal:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise SystemExit(exit_status(signum))  # asked twice: now
        self.signum = signum
