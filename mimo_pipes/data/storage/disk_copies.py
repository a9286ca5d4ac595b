"""The local copies reading object storage makes (JSON annotation files and their Arrow conversion, ``save_to_disk``
folders, Energon's ``.nv-meta/`` and shard indexes), under one folder of the cache, bounded in total size: the
copies used least recently are removed to make room, and a copy larger than the bound alone is refused before
anything is downloaded."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from mimo_pipes.data.cache import build_atomically, cache_root
from mimo_pipes.data.storage.s3_settings import ENV, settings_from_env
from mimo_pipes.errors import ConfigError

ARROW = ".arrow"
"""The folder in a copy of JSON files that holds their Arrow conversion (hidden: the files' glob leaves it out)."""
USED = ".used"
"""A file in each copy whose modification time says when the copy was last used."""


def copies_root() -> Path:
    return cache_root() / "s3"


def folder_bytes(folder: Path) -> int:
    """Bytes of every file under ``folder`` (0 when it is gone)."""
    total = 0
    for base, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_size
            except OSError:  # removed meanwhile
                pass
    return total


def bounded_copy(name: str, size: int, build: Callable[[Path], None], what: str) -> Path:
    """The copy ``name`` (built with ``build(folder)`` unless it exists), marked used now, after removing the
    least recently used other copies while all of them hold more than ``MIMO_PIPES_S3_DISK_MB``. ``size``: the
    bytes the copy will hold, as far as known before it is built (refused, naming ``what``, when over the bound)."""
    limit = settings_from_env().disk_bytes
    if size > limit:
        raise ConfigError(ENV["disk_mb"], f"{what}: its local copy needs {size / 2**20:.1f} MiB, more than the "
                                          f"{limit / 2**20:.1f} MiB the copies of object storage may hold")
    folder = build_atomically(copies_root() / name, build)
    (folder / USED).touch()
    trim(limit, keep=folder)
    return folder


def trim(limit: int, keep: Path) -> None:
    """Remove the least recently used copies but ``keep`` until all of them hold at most ``limit`` bytes."""
    root = copies_root()
    copies = []
    for entry in root.iterdir() if root.is_dir() else ():
        if entry.is_dir() and not entry.name.startswith("."):  # a copy being built is a hidden folder
            used = entry / USED
            copies.append((used.stat().st_mtime if used.exists() else 0.0, entry, folder_bytes(entry)))
    total = sum(size for _, _, size in copies)
    for _, entry, size in sorted(copies, key=lambda c: c[0]):
        if total <= limit:
            break
        if entry == keep:
            continue
        shutil.rmtree(entry, ignore_errors=True)  # files another process holds open stay readable to it
        total -= size
