"""Checks of folders a user passes on the command line."""

from __future__ import annotations

from pathlib import Path

from mimo_pipes.errors import ConfigError


def existing_folder(path: str | Path, setting: str, hint: str) -> Path:
    """``path`` as an existing folder, else ConfigError naming ``setting`` with the ``hint``."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise ConfigError(setting, f"{str(path)!r} does not exist; {hint}")
    if not folder.is_dir():
        raise ConfigError(setting, f"{str(path)!r} is not a folder; {hint}")
    return folder
