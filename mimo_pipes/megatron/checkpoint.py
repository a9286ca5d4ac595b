"""The pipeline's per-rank state inside a Megatron checkpoint's iteration folder, committed with it.

Megatron (Megatron-LM, Megatron-Bridge) saves iteration ``k`` into ``SAVE/iter_{k:07d}/`` and commits it by
writing ``k`` to ``SAVE/latest_checkpointed_iteration.txt`` once every rank's part of the folder is written;
loading reads that file first. :func:`save_pipeline_state` writes every rank's loader state into
``SAVE/iter_{k:07d}/mimo_pipes/`` as one checkpoint generation (:mod:`mimo_pipes.checkpoint.generation`: the
rank files, then a manifest naming each file's size and digest, renamed into place once every rank wrote its
files). Called before the iteration is committed (before Megatron's save, or before :func:`commit_iteration` in
a loop of your own), it is committed with the iteration: a job killed at any point of a save leaves the
previous iteration the latest, whole, and its pipeline state with it. :func:`load_pipeline_state` reads the
state of the iteration Megatron loads, checked file by file, for this rank (another layout of the same modules
restores each module's first saved rank, as ``mimo-pipes run --resume`` does).

Plain files and the exchange package's small collectives: nothing here needs megatron-core (its
dist_checkpointing needs CUDA); the layout of the folders is Megatron's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mimo_pipes.checkpoint.generation import (
    commit_generation,
    discard_generation,
    encode_loader_state,
    loader_file,
    new_generation_id,
    open_generation,
    write_rank_files,
)
from mimo_pipes.checkpoint.same_settings import check_same_settings, config_settings
from mimo_pipes.config import PipelineConfig
from mimo_pipes.config.counts import as_count
from mimo_pipes.errors import ConfigError, LostPeerError
from mimo_pipes.exchange.world import gather_from_every_rank, joined, world_rank
from mimo_pipes.graph.loader import GraphLoader
from mimo_pipes.parallel.topology import Topology, build_topology

TRACKER_FILE = "latest_checkpointed_iteration.txt"
"""Megatron's commit of an iteration: the iteration's number, written once its folder is complete."""
PIPELINE_FOLDER = "mimo_pipes"
"""The pipeline's part of an iteration folder."""
SAVE, LOAD = "--save", "--load"  # Megatron's flags (Megatron-Bridge: checkpoint.save, checkpoint.load)
COMMITTED = "committed"


def iteration_folder(checkpoint_dir: str | Path, iteration: int) -> Path:
    """``checkpoint_dir/iter_{iteration:07d}``, as Megatron names it."""
    return Path(checkpoint_dir) / f"iter_{as_count(iteration, 'iteration'):07d}"


def pipeline_state_folder(checkpoint_dir: str | Path, iteration: int) -> Path:
    return iteration_folder(checkpoint_dir, iteration) / PIPELINE_FOLDER


def latest_iteration(checkpoint_dir: str | Path) -> int | None:
    """The iteration Megatron resumes from (its tracker file), or None: no checkpoint yet, or a ``release``
    checkpoint (weights without a training position). ConfigError naming ``--load`` when the file is damaged."""
    tracker = Path(checkpoint_dir) / TRACKER_FILE
    try:
        text = tracker.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ConfigError(LOAD, f"{tracker} cannot be read ({error.strerror or error})") from None
    if text == "release":
        return None
    if not text.isdigit():
        raise ConfigError(LOAD, f"{tracker} holds {text[:40]!r}, not an iteration number: it was cut short or edited")
    return int(text)


def commit_iteration(checkpoint_dir: str | Path, iteration: int) -> None:
    """Commit ``iteration`` as Megatron does, for a training loop that writes its checkpoints itself (Megatron-LM and
    Megatron-Bridge write this file in their own save): call it on one rank, after every rank's part of the iteration
    folder, the pipeline state included, is written. The number is written aside and renamed over the tracker, so a
    kill leaves either the previous iteration or this one, never a cut file."""
    tracker = Path(checkpoint_dir) / TRACKER_FILE
    aside = tracker.with_name(f".{TRACKER_FILE}.{os.getpid()}")
    with open(aside, "w") as file:
        file.write(str(as_count(iteration, "iteration")))
        file.flush()
        os.fsync(file.fileno())
    os.replace(aside, tracker)


def save_pipeline_state(
    checkpoint_dir: str | Path,
    iteration: int,
    loader_state: Mapping[str, Any],
    *,
    config: PipelineConfig,
    consumed_microbatches: int,
    group: Any = None,
) -> Path:
    """Collective over the job's ranks (``group``; None: the world, or this process alone outside a process
    group): every rank's ``loader_state`` (its loader's ``state_dict()``) into iteration ``iteration``'s folder.
    ``consumed_microbatches`` is where training stands (:func:`~mimo_pipes.megatron.consumed.microbatches_from_samples`
    of the checkpoint's ``consumed_train_samples``): a state that stands elsewhere (a thread that reads the loader
    ahead of training) is refused. Returns the folder; a save that did not complete raises ConfigError naming
    ``--save`` on every rank, and nothing of it becomes the folder's state."""
    consumed = as_count(consumed_microbatches, "consumed_microbatches")
    folder = pipeline_state_folder(checkpoint_dir, iteration)
    topology = build_topology(config.components)
    rank = world_rank() if joined() else 0
    committer, generation = min(_saved((rank, new_generation_id()), group, iteration, folder, "choosing the generation"))
    try:
        position = as_count(loader_state.get(GraphLoader.CONSUMED_KEY), f"loader_state[{GraphLoader.CONSUMED_KEY!r}]")
        if position != consumed:
            raise ConfigError(SAVE, f"its loader has handed out {position} micro-batches, training stands at {consumed} "
                                    "(save the loader's state where training stands, not where a thread reading ahead is)")
        outcome: tuple[str, Any] = ("written", write_rank_files(folder, generation, {loader_file(rank): encode_loader_state(generation, rank, loader_state)}))
    except (ConfigError, OSError) as error:
        outcome = ("failed", f"rank {rank}: {error}")
    outcomes = _saved(outcome, group, iteration, folder, "gathering every rank's part")
    failed = [message for status, message in outcomes if status != "written"]
    if len(outcomes) != topology.world_size:
        failed.append(f"{len(outcomes)} ranks saved, the components lay out {topology.world_size}")
    verdict = None
    if rank == committer:
        if not failed:
            files = {name: digest for _, digests in outcomes for name, digest in digests.items()}
            try:
                commit_generation(folder, generation, consumed=consumed, world_size=topology.world_size,
                                  layout=[module.spec for module in topology.modules], settings=config_settings(config), files=files)
            except OSError as error:
                failed = [f"the manifest: {error}"]
        if failed:
            discard_generation(folder, generation)
        verdict = failed[0] if failed else COMMITTED
    verdict = next(item for item in _saved(verdict, group, iteration, folder, "agreeing on the commit") if item is not None)
    if verdict != COMMITTED:
        raise ConfigError(SAVE, f"the pipeline state of iteration {iteration} was not saved in {folder}: {verdict}")
    return folder


def load_pipeline_state(
    checkpoint_dir: str | Path,
    iteration: int | None = None,
    *,
    config: PipelineConfig,
    consumed_microbatches: int | None = None,
    rank: int | None = None,
) -> dict[str, Any] | None:
    """This rank's loader state of iteration ``iteration`` (None: the one Megatron resumes from, its tracker's),
    for ``loader.load_state_dict``; None when there is no checkpoint to resume. ``config`` must be the saved
    one but for the layout (other DP, TP, PP sizes and offsets of the same modules restore each module's first
    saved rank). With ``consumed_microbatches`` (where the checkpoint's ``consumed_train_samples`` put training),
    a state that stands elsewhere is refused. ConfigError naming ``--load`` and the file for anything missing,
    damaged, of another save or of other settings."""
    iteration = latest_iteration(checkpoint_dir) if iteration is None else as_count(iteration, "iteration")
    if iteration is None:
        return None
    folder = pipeline_state_folder(checkpoint_dir, iteration)
    if not folder.is_dir() and iteration_folder(checkpoint_dir, iteration).is_dir():
        raise ConfigError(LOAD, f"{folder.parent} holds no pipeline state ({PIPELINE_FOLDER}/ missing): it was saved without "
                                "save_pipeline_state; build the loader with consumed_microbatches= from its consumed_train_samples instead")
    generation = open_generation(folder, flag=LOAD)
    check_same_settings(generation.settings, config_settings(config), where=folder, setting=LOAD)
    if consumed_microbatches is not None and as_count(consumed_microbatches, "consumed_microbatches") != generation.consumed:
        raise ConfigError(LOAD, f"{folder} was saved after {generation.consumed} micro-batches, the checkpoint's consumed samples "
                                f"make {consumed_microbatches}: the pipeline state is not this checkpoint's")
    topology = build_topology(config.components)
    rank = as_count(rank, "rank") if rank is not None else (world_rank() if joined() else 0)
    return generation.read_loader_state(_source_rank(generation, rank, topology))


def _source_rank(generation: Any, rank: int, topology: Topology) -> int:
    if rank >= topology.world_size:
        raise ConfigError(LOAD, f"rank {rank} is beyond the {topology.world_size} ranks the components lay out")
    return generation.source_rank(rank, topology)


def _gathered(value: Any, group: Any) -> list[Any]:
    return gather_from_every_rank(value, group, what="the save") if joined() else [value]


def _saved(value: Any, group: Any, iteration: int, folder: Path, step: str) -> list[Any]:
    """Every rank's ``value`` at one ``step`` of a save: a rank lost on the way is the save's ConfigError naming
    ``--save``, the step and the rank the job's roll finds gone, on every rank that is left (Megatron then
    commits no iteration, so the previous one stays the latest with its pipeline state)."""
    try:
        return _gathered(value, group)
    except LostPeerError as error:
        lost = f"; {error.phrase}" if error.phrase else ""
        raise ConfigError(SAVE, f"the pipeline state of iteration {iteration} was not saved in {folder}: a rank was lost "
                                f"while {step} ({error.cause}){lost}") from error
