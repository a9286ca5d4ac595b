"""Test-side helpers for whole jobs: ``run`` in the warm Gloo pool (through the per-rank body its ranks
call), ``analyze`` in this process (it is one process anyway), and what their outputs hold."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

from dist_pool import DistPool
from scenarios_jobs import run_job, train_job


def run_in_pool(pool: DistPool, argv: list[str], timeout: float = 300) -> dict[str, Any]:
    """Rank 0's outcome of ``mimo-pipes run ARGV`` run by every rank of the pool (``result``, ``stdout``)."""
    outcomes = pool.run(run_job, list(argv), timeout=timeout)
    return outcomes[0]


def train_in_pool(pool: DistPool, argv: list[str], timeout: float = 600) -> list[dict[str, Any] | None]:
    """Every rank's outcome of ``mimo-pipes train ARGV`` on the pool (None beyond the job's ranks)."""
    return pool.run(train_job, list(argv), timeout=timeout)


def analyze_here(argv: list[str], plots: bool = False) -> tuple[int, str, str]:
    """``mimo-pipes analyze ARGV`` in this process: (exit status, stdout, stderr). Without ``plots`` it adds
    ``--no-plots``: drawing the PNGs is most of a small analysis's time, and the tests that look at them ask."""
    from mimo_pipes.cli.main import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = main(["analyze", *argv, *(() if plots else ("--no-plots",))])
    return status, stdout.getvalue(), stderr.getvalue()


def read_dumps(directory: Path) -> list[dict]:
    """Every rank's ``--dump-assignments`` lines, rank by rank."""
    return [json.loads(line) for path in sorted(Path(directory).glob("rank*.jsonl")) for line in path.read_text().splitlines()]


def summary_lines(stdout: str) -> dict[str, list[str]]:
    """The printed summary's row of each module, split into its columns."""
    return {line.split()[0]: line.split() for line in stdout.splitlines() if line.split()[:1] in (["language"], ["images"])}


def run_and_analyze(pool: DistPool, root: Path, settings: dict[str, list[str]], common: list[str],
                    plots: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """Every setting once through ``run`` (dumps) and once through ``analyze`` (with its PNGs for the settings
    named in ``plots``)."""
    out = {}
    for name, flags in settings.items():
        outcome = run_in_pool(pool, [*common, *flags, "--dump-assignments", str(root / name / "dumps")])
        status, analyze_stdout, stderr = analyze_here([*common, *flags, "--out", str(root / name / "analysis")], plots=name in plots)
        assert status == 0, stderr
        out[name] = {
            "summary": summary_lines(outcome["stdout"]),
            "analyze_stdout": analyze_stdout,
            "dumps": read_dumps(root / name / "dumps"),
            "analysis": json.loads((root / name / "analysis" / "analysis.json").read_text()),
            "folder": root / name / "analysis",
        }
    return out
