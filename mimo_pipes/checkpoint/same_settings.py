"""What a resumed graph must share with the saved one: the settings that shape the global stream, compared by
meaning, and the one line that names the first that differs. The command line (``--resume``) and a graph
saved inside another trainer's checkpoint (:mod:`mimo_pipes.megatron.checkpoint`) check alike."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from mimo_pipes.checkpoint.validity import MISSING, show_setting
from mimo_pipes.config import PipelineConfig, exact_weight, flag
from mimo_pipes.errors import ConfigError
from mimo_pipes.parallel.topology import parse_component

# Settings of PipelineConfig (and the configs inside it) that do not change the stream or the saved state,
# so a resumed run may change them. Every other field, present or added later, must match.
RESUME_EXEMPT = {
    "num_workers": "processing workers; the mapper keeps the order",
    "processing": "threads or worker processes make the same samples in the same order",
    "exchange_transport": "how the bytes travel, not which",
    "exchange_timeout_s": "how long a rank waits for a silent peer",
    "overlap_intra_microbatch_reorder": "which thread runs the exchange; the state is the same either way",
    "read_ahead": "how far the loader works ahead; the state is the one at the last micro-batch handed out",
}
# Why a setting must match: each shapes the global stream (which samples form every global micro-batch and
# window) or what the saved state holds; said with the refusal.
WHY = {
    "components": "a run resumes on another layout (DP, TP, PP, rank offsets) of the same modules, each continuing its own state",
    "micro_batch_size": "the global micro-batch size decides which samples form every global micro-batch",
    "global_batch_size": "it decides where windows and training iterations end",
    "seed": "the seed decides the order every global micro-batch is drawn from",
    "dataloader_type": "it decides the order of the samples and where the data ends",
    "dataset": "the data is what every global micro-batch is drawn from",
    "embedded_samples": "the data is what every global micro-batch is drawn from",
    "processor": "the processor makes the samples and their costs",
    "image_folder": "it decides which images the samples hold",
    "split_part": "the split part is what every global micro-batch is drawn from",
    "seq_length": "it decides what the samples hold and how they are padded",
    "pad_to_seq_length": "it decides how the micro-batches are padded",
    "skip_bad_samples": "it decides which rows stand in for bad ones",
    "reorder_window_size": "windows are balanced as a whole: their size decides where they start and which micro-batches samples move between",
    "reorder_across_microbatches": "it decides whether samples move between the micro-batches of a window",
    "intra_microbatch_reorder": "it decides the window size and where samples go",
    "scalable_dp": "it decides what each rank reads",
    "reorder_encoder_cost_weight": "the cost decides where samples move",
    "reorder_language_cost_weight": "the cost decides where samples move",
    "reorder_language_cost": "the cost decides where samples move",
    "reorder_attention_crossover": "the cost decides where samples move",
    "reorder_cost_model": "the cost decides where samples move",
    "reorder_two_level": "it decides where samples move",
    "pack_sequences_in_batch": "it decides what each micro-batch holds",
    "pack_pad_multiple": "it decides what each micro-batch holds",
    "drop_last": "it decides where the data ends",
    "exchange_payload": "the saved state holds the graph of that payload (rows are processed after the exchange, samples before it) "
                        "and its window in flight in that form",
    "exchange_image_paths": "the saved window in flight holds its rows' images in that form (paths or the files' bytes)",
    "recipe": "the recipe builds the graph whose state was saved",
    "lr": "the saved optimizer state was made with it",
    "vision_tower": "the saved model state holds that vision tower's weights",
}


def layout_specs(config: PipelineConfig) -> list[str]:
    """The run's modules with every key written out, so two spellings of one layout compare equal."""
    specs = []
    for spec in config.components:
        try:
            specs.append(parse_component(spec).spec)
        except ConfigError:  # refused by the run's own checks, with the reason
            specs.append(spec)
    return specs


def config_settings(config: PipelineConfig) -> dict[str, Any]:
    """Every setting of ``config`` a resumed graph must share with the saved one, by field name, JSON-plain: all
    fields of the config and of the configs inside it except :data:`RESUME_EXEMPT`. Values are compared by
    meaning: of the components, the modules' names (the layout may change; the manifest keeps it, see
    :func:`layout_specs`), cost weights as exact numbers."""
    settings: dict[str, Any] = {}

    def add(holder: Any) -> None:
        for item in dataclasses.fields(holder):
            value = getattr(holder, item.name)
            if dataclasses.is_dataclass(value):
                add(value)
            elif item.name not in RESUME_EXEMPT:
                settings[item.name] = value

    add(config)
    # The layout is the manifest's (another one may resume); the modules must be the same.
    settings["components"] = sorted(spec.partition("=")[0].strip() for spec in config.components)
    for name in ("reorder_encoder_cost_weight", "reorder_language_cost_weight"):  # 1, 1.0 and "1" are one weight
        settings[name] = str(exact_weight(settings[name], flag(name)))
    if config.dataset is not None:
        settings["embedded_samples"] = None  # the embedded data is not used
    return json.loads(json.dumps(settings))


def setting_flag(name: str) -> str:
    """How a message names setting ``name``: the field in Python, its flag inside a command (config/flags.py)."""
    return flag(name)


def check_same_settings(saved: dict[str, Any], current: dict[str, Any], *, where: str | Path, setting: str) -> None:
    """ConfigError naming ``setting`` and the first setting that differs between a save (in ``where``) and this run."""
    for name in [*current, *(name for name in saved if name not in current)]:
        before, now = saved.get(name, MISSING), current.get(name, MISSING)
        if before != now:
            why = f": {WHY[name]}" if name in WHY else ""
            raise ConfigError(setting, f"{where} was saved with {setting_flag(name)} {_show(before)}, this run has {_show(now)}{why}")


def _show(value: Any) -> str:
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return "modules " + ", ".join(value)
    return show_setting(value, missing="no value (an unknown setting)", none="unset (the default)")
