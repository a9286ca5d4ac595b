"""A per-user cache for the built-in processor and dataset, built once and shared between processes."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

CACHE_ENV = "MIMO_PIPES_CACHE"
"""Environment variable that overrides the cache folder (default ``~/.cache/mimo-pipes``)."""


def cache_root() -> Path:
    """The folder that holds built artifacts: ``$MIMO_PIPES_CACHE`` or ``~/.cache/mimo-pipes``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path("~/.cache/mimo-pipes").expanduser()


def build_atomically(final: Path, build: Callable[[Path], None]) -> Path:
    """Return ``final``, building it first with ``build(tmp_dir)`` if it does not exist yet.

    The artifact is built in a private temporary folder next to ``final`` and renamed into place, so a
    reader never sees a half-written folder. When several processes race, each builds its own copy, one
    rename wins, and the others discard theirs and use the winner's (the builds are deterministic).
    """
    final = Path(final)
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():  # not a lost race: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
