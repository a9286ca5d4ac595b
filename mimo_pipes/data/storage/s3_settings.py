"""How a process reads object storage: one frozen object, from ``MIMO_PIPES_S3_*`` environment variables so that
every rank of a job, however it is launched, reads alike."""

from __future__ import annotations

import os
from dataclasses import dataclass

from mimo_pipes.errors import ConfigError

ENV = {
    "concurrency": "MIMO_PIPES_S3_CONCURRENCY",
    "cache_mb": "MIMO_PIPES_S3_CACHE_MB",
    "attempts": "MIMO_PIPES_S3_ATTEMPTS",
    "backoff_s": "MIMO_PIPES_S3_BACKOFF_S",
    "timeout_s": "MIMO_PIPES_S3_TIMEOUT_S",
    "prefetch_rows": "MIMO_PIPES_S3_PREFETCH_ROWS",
    "disk_mb": "MIMO_PIPES_S3_DISK_MB",
}


@dataclass(frozen=True)
class S3Settings:
    """``concurrency``: requests in flight at once per process; ``cache_mb``: each memory cache (Parquet row
    groups; image files) (MiB; 0 keeps only the one being read); ``attempts``: tries of one request on a transient
    error (503, connection reset or cut, timeout), waiting ``backoff_s`` doubled each time; ``timeout_s``:
    connect and read timeout of one request; ``prefetch_rows``: rows read ahead of the processing whose image
    files (named by path under an ``s3://`` image folder) are fetched ahead of need, ``concurrency`` at a time;
    ``disk_mb``: the local copies of S3 datasets' index files (JSON annotation files and their Arrow conversion,
    ``save_to_disk`` folders, Energon's metadata and shard indexes), all together (MiB; the least recently used
    are removed to make room)."""

    concurrency: int = 64  # what images fetched by path need for 20 ms requests (docs/benchmarks.md, Data in S3)
    cache_mb: float = 256.0
    attempts: int = 6
    backoff_s: float = 0.05
    timeout_s: float = 30.0
    prefetch_rows: int = 64
    disk_mb: float = 10240.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(ENV["concurrency"], f"must be >= 1, got {self.concurrency}")
        if self.prefetch_rows < 0:
            raise ConfigError(ENV["prefetch_rows"], f"must be >= 0, got {self.prefetch_rows}")
        if self.attempts < 1:
            raise ConfigError(ENV["attempts"], f"must be >= 1, got {self.attempts}")
        for name in ("cache_mb", "backoff_s", "disk_mb"):
            if getattr(self, name) < 0:
                raise ConfigError(ENV[name], f"must be >= 0, got {getattr(self, name)}")
        if not self.timeout_s > 0:
            raise ConfigError(ENV["timeout_s"], f"must be positive, got {self.timeout_s}")

    @property
    def cache_bytes(self) -> int:
        return int(self.cache_mb * 2**20)

    @property
    def disk_bytes(self) -> int:
        return int(self.disk_mb * 2**20)


def settings_from_env(environ: dict[str, str] | None = None) -> S3Settings:
    """The settings the ``MIMO_PIPES_S3_*`` variables give (defaults for those unset); one clear line for a bad one."""
    environ = dict(os.environ) if environ is None else environ
    values: dict[str, float | int] = {}
    for name, variable in ENV.items():
        text = environ.get(variable)
        if text is None or not text.strip():
            continue
        kind = int if name in ("concurrency", "attempts", "prefetch_rows") else float
        try:
            values[name] = kind(text)
        except ValueError:
            raise ConfigError(variable, f"must be {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    return S3Settings(**values)  # type: ignore[arg-type]
