"""Output paths checked before any work: each is, or can become, a folder (or file) this process can write,
so a mistake is one line naming the flag now, not an OSError on every rank after the whole job ran."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from mimo_pipes.errors import ConfigError


def check_output_folder(path: str | Path, flag: str) -> None:
    """``path`` is a folder, or can be created as one, and files can be written in it; raises ConfigError
    naming ``flag``. Nothing is left behind (the folder is not created here)."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(flag, f"{path} is a file, not a folder")
    _check_writable(path, flag, path)


def check_output_file(path: str | Path, flag: str) -> None:
    """``path`` names a file (not a folder) that can be written, its folder made if need be."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ConfigError(flag, f"{path} is a folder: give the path of the file to write")
    _check_writable(path.parent, flag, path)


def _check_writable(folder: Path, flag: str, named: Path) -> None:
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(flag, f"cannot create {named}: {existing} is a file")
    try:
        descriptor, probe = tempfile.mkstemp(prefix=".mimo-pipes-probe-", dir=existing)
    except OSError as error:
        raise ConfigError(flag, f"cannot write {named}: {existing} is not writable ({error.strerror or error})") from None
    os.close(descriptor)
    os.unlink(probe)


def write_failed(flag: str, path: str | Path, error: OSError) -> ConfigError:
    """A write of an output file that failed (a full disk, a file size limit), as one line naming the flag,
    the file and the cause: a full disk fails in write or flush, whose errors name no file."""
    return ConfigError(flag, f"could not write {error.filename or path} ({error.strerror or error})")
