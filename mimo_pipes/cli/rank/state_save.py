"""The collective save of a state folder: one checkpoint generation, committed only if every rank wrote all
of its files, its outcome known on every rank."""

from __future__ import annotations

from typing import Any

from mimo_pipes.checkpoint import (
    commit_generation,
    discard_generation,
    encode_loader_state,
    loader_file,
    new_generation_id,
    open_generation,
    write_rank_files,
)
from mimo_pipes.cli.rank.setup import RankSetup
from mimo_pipes.errors import ConfigError
from mimo_pipes.exchange.world import gather_from_every_rank, world_rank


def save_state(
    setup: RankSetup,
    directory: str,
    loader_state: dict[str, Any],
    settings: dict[str, Any],
    consumed: int,
    extra_files: dict[str, bytes] | None = None,
) -> None:
    """Collective over the job: one checkpoint generation. Every rank writes its files into the new
    generation's folder, the ranks tell rank 0 what they wrote (or why they could not), and rank 0 commits
    the generation only if every rank wrote all of its files. Either way every rank learns the outcome; a
    save that did not complete raises ConfigError naming ``--save-state``, the rank and the file, on every
    rank, and the folder keeps its previous generation. ``extra_files``: this rank's other files by name
    (a trainer's model state)."""
    rank = world_rank()
    generation = _agreed(new_generation_id() if rank == 0 else None, setup)[0]
    files = {loader_file(rank): encode_loader_state(generation, rank, loader_state), **(extra_files or {})}
    try:
        outcome: tuple[str, Any] = ("written", write_rank_files(directory, generation, files))
    except OSError as error:
        outcome = ("failed", _os_error(error, directory))
    outcomes = _agreed(outcome, setup)
    failed = [(r, message) for r, (status, message) in enumerate(outcomes) if status != "written"]
    verdict: tuple[str, str] | None = None
    if rank == 0:
        if not failed:
            written = {name: digest for _, digests in outcomes for name, digest in digests.items()}
            try:
                commit_generation(directory, generation, consumed=consumed, world_size=setup.topology.world_size,
                                  layout=[module.spec for module in setup.topology.modules], settings=settings, files=written)
                verdict = ("committed", "")
            except OSError as error:
                failed = [(0, _os_error(error, directory))]
        if failed:
            discard_generation(directory, generation)
            verdict = ("failed", f"rank {failed[0][0]} {failed[0][1]}; {_kept(directory)}")
    status, message = _agreed(verdict, setup)[0]
    if status != "committed":
        raise ConfigError("--save-state", f"the state after {consumed} micro-batches was not saved: {message}")

def _agreed(value: Any, setup: RankSetup) -> list[Any]:
    """Every rank's ``value``; a rank gone in the middle of a save is a LostPeerError naming it (the folder keeps
    its previous generation: nothing was committed)."""
    return gather_from_every_rank(value, setup.control, what="the save of the state (the state folder keeps its previous state)")

def _os_error(error: OSError, directory: str) -> str:
    where = error.filename or directory
    return f"could not write {where} ({error.strerror or error})"

def _kept(directory: str) -> str:
    try:
        previous = open_generation(directory, flag="--save-state")
    except ConfigError:
        return f"{directory} holds no complete state"
    return f"{directory} keeps the complete state saved after {previous.consumed} micro-batches"
