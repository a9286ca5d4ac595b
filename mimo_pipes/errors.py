"""Exceptions that name what went wrong: the setting, the sample, or the rank."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid. ``setting`` names the flag or field at fault."""

    def __init__(self, setting: str, message: str) -> None:
        self.setting = setting
        super().__init__(f"{setting}: {message}")


class StateMismatchError(ConfigError):
    """A saved state was made for other settings than the graph that is asked to restore it."""

    def __init__(self, node: str, setting: str, message: str) -> None:
        self.node = node
        self.setting = setting
        ValueError.__init__(self, f"{node}: {message}")


class SampleError(ValueError):
    """One sample cannot be processed, packed or exchanged. Names the sample and, if known, the field."""

    def __init__(self, sample_id: object, message: str, field: str | None = None) -> None:
        self.sample_id = sample_id
        self.field = field
        where = f"sample {sample_id!r}" + (f", field {field!r}" if field else "")
        super().__init__(f"{where}: {message}")


class PeerError(RuntimeError):
    """A failure on another rank of the module (or a collective that timed out), raised on every rank."""

    def __init__(self, rank: int | None, message: str) -> None:
        self.rank = rank
        where = f"rank {rank}" if rank is not None else "a peer rank"
        super().__init__(f"{where} failed: {message}")
