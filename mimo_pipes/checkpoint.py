"""A job's saved state on disk and the checks a resume makes before any rank starts.

A state folder holds ``rank{r}.json`` per rank (the rank's loader state), ``meta.json`` (format, consumed
micro-batches, world size and every setting that shapes the stream) and, for ``mimo-pipes train``,
``rank{r}.pt`` (model and optimizer). Plain file I/O: the ranks agree on when to write through the
exchange package's collectives.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from mimo_pipes.config import JobOptions, PipelineConfig, TrainOptions, exact_weight, flag
from mimo_pipes.errors import ConfigError
from mimo_pipes.topology import COMPONENT_FLAG
from mimo_pipes.validity import MISSING, show_setting

STATE_FORMAT = 2  # 2: meta.json holds every setting that shapes the stream; node states say what they are valid for
META_FILE = "meta.json"
# Settings of PipelineConfig (and the configs inside it) that do not change the stream or the saved state,
# so a resumed run may change them. Every other field, present or added later, must match.
RESUME_EXEMPT = {
    "num_workers": "processing threads; the mapper keeps the order",
    "exchange_transport": "how the bytes travel, not which",
    "exchange_timeout_s": "how long a rank waits for a silent peer",
    "overlap_intra_microbatch_reorder": "which thread runs the exchange; the state is the same either way",
}
# Options of `run` and `train` (JobOptions, TrainOptions) that do not change what a resumed run computes:
# how far it goes, where it writes, what it prints. Every other option (the recipe; train's learning rate
# and vision tower; any option added later) is saved with the state and must match on resume.
OPTION_EXEMPT = {
    "steps": "how far to run: a resumed run goes further",
    "stop_after": "where this run stops and saves",
    "save_state": "where this run saves",
    "resume": "where this run resumes from",
    "dump_assignments": "a record of what the ranks consumed",
    "progress": "the progress bar and metrics lines",
    "tensorboard": "where the exchange metrics are written (their totals travel in the state)",
    "log_interval": "how often a metrics line is printed",
    "summary_json": "where the summary is written",
}
# Fields whose flag is not the field name with dashes.
FLAGS = {
    "components": COMPONENT_FLAG,
    "exchange_timeout_s": "--exchange-timeout",
    "overlap_intra_microbatch_reorder": "--no-overlap-intra-microbatch-reorder",
    "progress": "--quiet",
}


def state_path(directory: str | Path, rank: int) -> Path:
    """The loader state of one rank."""
    return Path(directory) / f"rank{rank}.json"


def model_path(directory: str | Path, rank: int) -> Path:
    """Model and optimizer state of one training rank; its loader state sits beside it in ``rank{r}.json``."""
    return Path(directory) / f"rank{rank}.pt"


def resume_settings(config: PipelineConfig, options: JobOptions) -> dict[str, Any]:
    """Every setting a resumed run must share with the saved one, by field name, JSON-plain: all fields of
    the config and of the configs inside it except :data:`RESUME_EXEMPT` (what shapes the stream), and all
    options except :data:`OPTION_EXEMPT` (the recipe, and for ``train`` what shapes the losses)."""
    settings: dict[str, Any] = {}

    def add(holder: Any) -> None:
        for item in dataclasses.fields(holder):
            value = getattr(holder, item.name)
            if dataclasses.is_dataclass(value):
                add(value)
            elif item.name not in RESUME_EXEMPT:
                settings[item.name] = value

    add(config)
    for name in ("reorder_encoder_cost_weight", "reorder_language_cost_weight"):  # 1, 1.0 and "1" are one weight
        settings[name] = str(exact_weight(settings[name], flag(name)))
    if config.dataset is not None:
        settings["embedded_samples"] = None  # the embedded data is not used
    for item in dataclasses.fields(options):
        if item.name not in OPTION_EXEMPT:
            settings[item.name] = getattr(options, item.name)
    if isinstance(options, TrainOptions):
        from mimo_pipes.encoders import vision_tower_identity

        settings["vision_tower"] = vision_tower_identity(options.vision_tower)  # a folder's config, not only its path
    return json.loads(json.dumps(settings))


def setting_flag(name: str) -> str:
    return FLAGS.get(name, flag(name))


def check_resume_dir(directory: str, config: PipelineConfig, world_size: int, options: JobOptions) -> int:
    """Validate a saved state before any rank starts (every launcher and torchrun rank runs it, so a mismatch
    ends every rank with exit 2 before any collective); returns the consumed micro-batch count."""
    meta_path = Path(directory) / META_FILE
    if not meta_path.is_file():
        raise ConfigError("--resume", f"{directory} holds no saved state ({META_FILE} missing)")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != STATE_FORMAT:
        raise ConfigError(
            "--resume", f"{directory}: state format {meta.get('format')} is not {STATE_FORMAT} (saved by another mimo-pipes version); start the run again"
        )
    saved, current = meta["settings"], resume_settings(config, options)
    for name in [*current, *(name for name in saved if name not in current)]:
        before, now = saved.get(name, MISSING), current.get(name, MISSING)
        if before != now:
            raise ConfigError("--resume", f"{directory} was saved with {setting_flag(name)} {_show(before)}, this run has {_show(now)}")
    missing = [rank for rank in range(world_size) if not state_path(directory, rank).is_file()]
    if missing:
        raise ConfigError("--resume", f"{directory} has no state for rank {missing[0]}")
    return int(meta["consumed_microbatches"])


def _show(value: Any) -> str:
    return show_setting(value, missing="no value (an unknown setting)", none="unset (the default)")


def write_rank_state(directory: str | Path, rank: int, loader_state: dict[str, Any]) -> None:
    """One rank's loader state; every rank writes its own before the first writes the meta file."""
    os.makedirs(directory, exist_ok=True)
    state_path(directory, rank).write_text(json.dumps({"format": STATE_FORMAT, "loader": loader_state}))


def write_meta(directory: str | Path, consumed: int, world_size: int, settings: dict[str, Any]) -> None:
    """The folder's description, written once every rank's state is in it."""
    meta = {"format": STATE_FORMAT, "consumed_microbatches": consumed, "world_size": world_size, "settings": settings}
    (Path(directory) / META_FILE).write_text(json.dumps(meta, indent=1))


def read_rank_state(directory: str | Path, rank: int) -> dict[str, Any]:
    """The loader state ``rank`` saved."""
    return json.loads(state_path(directory, rank).read_text())["loader"]


def write_model_state(directory: str | Path, rank: int, state: dict[str, Any]) -> None:
    """A training rank's model and optimizer (``state["model"]``, ``state["optimizer"]``)."""
    import torch

    os.makedirs(directory, exist_ok=True)
    torch.save({"model": state["model"], "optimizer": state["optimizer"]}, model_path(directory, rank))


def read_trainer_state(directory: str | Path, rank: int) -> dict[str, Any]:
    """A training rank's model, optimizer and loader state, as its trainer's ``load_state_dict`` takes it."""
    import torch

    state = torch.load(model_path(directory, rank), weights_only=True)
    state["loader"] = read_rank_state(directory, rank)
    return state
