"""Whole jobs in the Gloo pool reading from a local S3 server: each rank takes the server's environment (the
standard AWS variables), then runs the job as :func:`scenarios_jobs.run_job` does."""

from __future__ import annotations

from typing import Any

from s3_server import s3_environment
from scenarios_jobs import run_job


def run_job_on_s3(env: dict[str, str], argv: list[str]) -> dict[str, Any] | None:
    """``mimo-pipes run ARGV`` on this pool rank with ``env`` set (put back afterwards)."""
    with s3_environment(env):
        return run_job(argv)
