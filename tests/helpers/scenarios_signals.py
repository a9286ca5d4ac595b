"""Scenarios run on every rank of a Gloo pool: a stop signal that arrives after a job's last micro-batch."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import signal
from typing import Any

from mimo_pipes.cli.main import build_parser


def run_signalled_in_summary(argv: list[str]) -> dict[str, Any] | None:
    """``mimo-pipes run ARGV`` on this pool rank, rank 0 receiving SIGTERM while it formats the summary: what
    it printed, and the stop it raised (None when it returned)."""
    from mimo_pipes.cli.rank import run_rank as run_module
    from mimo_pipes.cli.rank.stop_signal import StopRequested

    original = run_module.format_summary

    def signalled(*args: Any, **kwargs: Any) -> str:
        os.kill(os.getpid(), signal.SIGTERM)  # the rank's handler holds it (the job is past its loop)
        return original(*args, **kwargs)

    run_module.format_summary = signalled
    args = build_parser().parse_args(["run", *argv])
    stdout, stderr = io.StringIO(), io.StringIO()
    stop = None
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            config, options, _ = importlib.import_module("mimo_pipes.cli.commands.run_cmd").prepare_job(args)
            try:
                if run_module.run_rank(config, options) is None:
                    return None
            except StopRequested as stopped:
                stop = (stopped.signum, stopped.saved)
    finally:
        run_module.format_summary = original
    return {"stdout": stdout.getvalue(), "stop": stop}
