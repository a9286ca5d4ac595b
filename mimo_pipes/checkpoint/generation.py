"""Checkpoint generations: a save is every rank's files plus a manifest, visible only once complete.

A state folder holds ``manifest.json`` (the current generation) and the generation's folder
``generation-<id>/`` with each rank's files (``rank{r}.json``, the loader state; ``rank{r}.pt`` for
``mimo-pipes train``). A save writes a new generation beside the current one, then commits it with one
atomic rename of its manifest over ``manifest.json``: until that rename the previous generation is the
folder's state, whole, and after it the new one. Folders of other generations are removed after the commit.

The manifest names the generation (a unique id), the consumed micro-batch count, the layout, the settings
and their digest, and every file's size and SHA-256. Reading a state checks each file it reads against it,
so nothing half-written, mixed from two saves or truncated is ever restored: it is refused in one line
that names the file and what differs. Plain file I/O: the ranks agree on when to write through the
exchange package's collectives.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mimo_pipes.errors import ConfigError
from mimo_pipes.parallel.topology import Topology, build_topology

STATE_FORMAT = 3  # 3: generations committed by a manifest; 2: meta.json beside the rank files (refused)
MANIFEST_FILE = "manifest.json"
GENERATION_PREFIX = "generation-"
OLD_META_FILE = "meta.json"  # format 2's description of the folder
RESUME_FLAG = "--resume"


def loader_file(rank: int) -> str:
    """One rank's loader state, inside its generation's folder."""
    return f"rank{rank}.json"


def model_file(rank: int) -> str:
    """One training rank's model and optimizer, beside its loader state."""
    return f"rank{rank}.pt"


def settings_digest(settings: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def new_generation_id() -> str:
    """A unique id for a save (random: two saves never share one)."""
    return secrets.token_hex(8)


# --- file operations: every change the save makes to the folder goes through these four -----------------


def _write_file(path: Path, data: bytes) -> None:
    """Write ``data`` and make it durable before returning."""
    with open(path, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def _make_folder(path: Path) -> None:
    os.makedirs(path, exist_ok=True)


def _replace(source: Path, target: Path) -> None:
    """The atomic rename that commits, then the folder's entry made durable."""
    os.replace(source, target)
    _sync_folder(target.parent)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _sync_folder(path: Path) -> None:
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


# --- saving ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileDigest:
    """What the manifest records of one file: its size and SHA-256."""

    size: int
    sha256: str

    @classmethod
    def of(cls, data: bytes) -> FileDigest:
        return cls(len(data), hashlib.sha256(data).hexdigest())

    def plain(self) -> dict[str, Any]:
        return {"bytes": self.size, "sha256": self.sha256}


def generation_folder(directory: str | Path, generation_id: str) -> Path:
    return Path(directory) / f"{GENERATION_PREFIX}{generation_id}"


def encode_loader_state(generation_id: str, rank: int, loader_state: Mapping[str, Any]) -> bytes:
    return json.dumps({"format": STATE_FORMAT, "generation": generation_id, "rank": rank, "loader": loader_state}).encode()


def encode_model_state(state: Mapping[str, Any]) -> bytes:
    """A training rank's model and optimizer (``state["model"]``, ``state["optimizer"]``) as bytes."""
    import torch

    buffer = io.BytesIO()
    torch.save({"model": state["model"], "optimizer": state["optimizer"]}, buffer)
    return buffer.getvalue()


def write_rank_files(directory: str | Path, generation_id: str, files: Mapping[str, bytes]) -> dict[str, FileDigest]:
    """One rank's part of a save: its files into the (not yet committed) generation's folder. Raises
    OSError (the failed file in ``filename``) when a write fails; nothing visible changes either way."""
    folder = generation_folder(directory, generation_id)
    _make_folder(folder)
    written = {}
    for name, data in files.items():
        _write_file(folder / name, data)
        written[name] = FileDigest.of(data)
    return written


def commit_generation(
    directory: str | Path,
    generation_id: str,
    *,
    consumed: int,
    world_size: int,
    layout: list[str],
    settings: Mapping[str, Any],
    files: Mapping[str, FileDigest],
) -> None:
    """Make a generation whose every file is written the folder's state: its manifest is written aside, then
    renamed over ``manifest.json`` (atomic); then the other generations' folders are removed. Raises
    OSError when the manifest cannot be written (the previous generation then stays the state)."""
    directory = Path(directory)
    manifest = {
        "format": STATE_FORMAT,
        "generation": generation_id,
        "folder": generation_folder(directory, generation_id).name,
        "consumed_microbatches": consumed,
        "world_size": world_size,
        "layout": list(layout),
        "settings": dict(settings),
        "settings_digest": settings_digest(settings),
        "files": {name: digest.plain() for name, digest in sorted(files.items())},
    }
    aside = directory / f".{MANIFEST_FILE}.{generation_id}"
    _write_file(aside, json.dumps(manifest, indent=1).encode())
    _replace(aside, directory / MANIFEST_FILE)
    remove_other_generations(directory, generation_id)


def remove_other_generations(directory: str | Path, keep: str) -> None:
    """What earlier or failed saves left: other generations' folders and manifests written aside."""
    for path in Path(directory).iterdir():
        stale_folder = path.name.startswith(GENERATION_PREFIX) and path.name != f"{GENERATION_PREFIX}{keep}"
        if stale_folder or path.name.startswith(f".{MANIFEST_FILE}."):
            _remove(path)


def discard_generation(directory: str | Path, generation_id: str) -> None:
    """A save that did not complete: its folder goes (the committed generation is untouched)."""
    _remove(generation_folder(directory, generation_id))
    _remove(Path(directory) / f".{MANIFEST_FILE}.{generation_id}")


# --- reading --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Generation:
    """The committed generation of a state folder, as its manifest describes it. Every read checks the
    file against the manifest (:meth:`read`)."""

    directory: Path
    manifest: dict[str, Any]
    flag: str = RESUME_FLAG

    @property
    def id(self) -> str:
        return str(self.manifest["generation"])

    @property
    def folder(self) -> Path:
        return self.directory / str(self.manifest["folder"])

    @property
    def consumed(self) -> int:
        return int(self.manifest["consumed_microbatches"])

    @property
    def world_size(self) -> int:
        return int(self.manifest["world_size"])

    @property
    def layout(self) -> list[str]:
        return list(self.manifest["layout"])

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.manifest["settings"])

    def source_rank(self, rank: int, topology: Topology) -> int:
        """The saved rank whose files rank ``rank`` of ``topology`` restores: its own when the layout is the
        saved one, else the first rank (DP, TP, CP and PP rank 0) of its module in the saved layout. Every
        rank of a module saved the same global position and the module's figures; a trainer whose state is
        replicated over its module's DP ranks restores it from there too."""
        if [module.spec for module in topology.modules] == self.layout:
            return rank
        name = topology.position(rank).module.name
        try:
            return build_topology(self.layout).module(name).rank_offset
        except KeyError:
            raise self._error(f"{self.directory} was saved without a module named {name}") from None

    def has(self, name: str) -> bool:
        return name in self.manifest["files"]

    def read(self, name: str) -> bytes:
        """A file of the generation, after checking it is the very file the save wrote; raises ConfigError
        naming the file and what differs."""
        path = self.folder / name
        expected = self.manifest["files"].get(name)
        if expected is None:
            raise self._error(f"{path} is not part of the saved state (its manifest lists no such file)")
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise self._error(f"{path} is missing: the state is incomplete") from None
        except OSError as error:
            raise self._error(f"{path} cannot be read ({error.strerror or error})") from None
        if len(data) != expected["bytes"]:
            raise self._error(f"{path} is {len(data)} bytes, the manifest says {expected['bytes']}: truncated, or not this save's file")
        digest = hashlib.sha256(data).hexdigest()
        if digest != expected["sha256"]:
            raise self._error(f"{path} differs from the manifest (sha256 {digest[:12]}, saved {expected['sha256'][:12]}): "
                              "it is not the file this save wrote")
        return data

    def verify(self) -> None:
        """Every file of the generation is there, whole and the save's own."""
        for name in self.manifest["files"]:
            self.read(name)

    def read_loader_state(self, rank: int) -> dict[str, Any]:
        """The loader state ``rank`` saved (checked)."""
        name = loader_file(rank)
        content = json.loads(self.read(name))
        if content.get("generation") != self.id or content.get("rank") != rank:
            raise self._error(f"{self.folder / name} belongs to another save (generation {content.get('generation')}, "
                              f"rank {content.get('rank')})")
        return content["loader"]

    def read_model_state(self, rank: int) -> dict[str, Any]:
        """A training rank's model and optimizer state (checked)."""
        import torch

        return torch.load(io.BytesIO(self.read(model_file(rank))), weights_only=True)

    def _error(self, message: str) -> ConfigError:
        return ConfigError(self.flag, message)


def open_generation(directory: str | Path, flag: str = RESUME_FLAG) -> Generation:
    """The committed generation of ``directory``; raises ConfigError naming ``flag`` and the file when there
    is none, or its manifest is damaged or of another format."""
    directory = Path(directory)
    path = directory / MANIFEST_FILE
    if not path.is_file():
        if (directory / OLD_META_FILE).is_file():
            raise ConfigError(flag, f"{directory} holds a state of format 2 (meta.json), saved by an older mimo-pipes: start the run again")
        if not directory.exists():
            raise ConfigError(flag, f"{directory} holds no saved state (no such folder)")
        if not directory.is_dir():
            raise ConfigError(flag, f"{directory} is a file, not a state folder")
        raise ConfigError(flag, f"{directory} holds no saved state ({MANIFEST_FILE} missing)")
    try:
        manifest = json.loads(path.read_bytes())
    except json.JSONDecodeError as error:
        raise ConfigError(flag, f"{path} is not a complete manifest ({error.msg} at character {error.pos}): it was cut short or edited") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(flag, f"{path} cannot be read ({getattr(error, 'strerror', None) or error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != STATE_FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise ConfigError(flag, f"{path}: state format {found} is not {STATE_FORMAT} (saved by another mimo-pipes version); start the run again")
    missing = [key for key in ("generation", "folder", "consumed_microbatches", "world_size", "layout", "settings", "settings_digest", "files")
               if key not in manifest]
    if missing:
        raise ConfigError(flag, f"{path} lacks {', '.join(missing)}: it is not a manifest this version wrote")
    if settings_digest(manifest["settings"]) != manifest["settings_digest"]:
        raise ConfigError(flag, f"{path}: its settings do not match their digest: the manifest was edited")
    return Generation(directory, manifest, flag)


def read_rank_state(directory: str | Path, rank: int, topology: Topology | None = None) -> dict[str, Any]:
    """The loader state of ``rank`` in the committed generation of ``directory`` (checked). With the run's
    ``topology``, for a layout other than the saved one: the state of the rank's module's first saved rank
    (which ``GraphLoader.load_state_dict`` continues on this layout)."""
    generation = open_generation(directory)
    return generation.read_loader_state(rank if topology is None else generation.source_rank(rank, topology))


def read_trainer_state(directory: str | Path, rank: int, topology: Topology | None = None) -> dict[str, Any]:
    """A training rank's model, optimizer and loader state, as its trainer's ``load_state_dict`` takes it
    (``topology``: as for :func:`read_rank_state`; the model and optimizer then come from the module's first
    saved rank, which is right for a trainer whose state is replicated over its module's DP ranks)."""
    generation = open_generation(directory)
    source = rank if topology is None else generation.source_rank(rank, topology)
    state = generation.read_model_state(source)
    state["loader"] = generation.read_loader_state(source)
    return state
