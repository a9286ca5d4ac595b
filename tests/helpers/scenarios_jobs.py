"""Whole jobs in the Gloo pool, through the functions the commands' ranks call: the command line parsed
and checked as the launcher does (``prepare_job``), then ``run_rank`` / ``train_rank`` on every rank.
Rank 0's printed summary is captured and returned with the rank's result."""

from __future__ import annotations

import contextlib
import io
from typing import Any

from mimo_pipes.cli.main import build_parser


def _job(command: str, argv: list[str]) -> dict[str, Any] | None:
    import importlib

    from mimo_pipes.cli.rank.run_rank import run_rank
    from mimo_pipes.cli.rank.train_rank import train_rank

    args = build_parser().parse_args([command, *argv])
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        config, options, _ = importlib.import_module(f"mimo_pipes.cli.commands.{command}_cmd").prepare_job(args)
        result = (run_rank if command == "run" else train_rank)(config, options)
    if result is None:
        return None
    return {"result": result, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}


def run_job(argv: list[str]) -> dict[str, Any] | None:
    """``mimo-pipes run ARGV`` on this pool rank (None on ranks beyond the job's layout)."""
    return _job("run", argv)


def train_job(argv: list[str]) -> dict[str, Any] | None:
    """``mimo-pipes train ARGV`` on this pool rank."""
    return _job("train", argv)
