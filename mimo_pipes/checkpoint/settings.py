"""What a resumed run must share with the saved one, and the check a resume makes before any rank starts."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from mimo_pipes.checkpoint.generation import open_generation
from mimo_pipes.checkpoint.validity import MISSING, show_setting
from mimo_pipes.config import JobOptions, PipelineConfig, TrainOptions, exact_weight, flag
from mimo_pipes.errors import ConfigError
from mimo_pipes.parallel.topology import COMPONENT_FLAG, parse_component

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
# Fields whose flag is not the field name with dashes.
FLAGS = {
    "components": COMPONENT_FLAG,
    "exchange_timeout_s": "--exchange-timeout",
    "overlap_intra_microbatch_reorder": "--no-overlap-intra-microbatch-reorder",
    "progress": "--quiet",
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


def resume_settings(config: PipelineConfig, options: JobOptions) -> dict[str, Any]:
    """Every setting a resumed run must share with the saved one, by field name, JSON-plain: all fields of
    the config and of the configs inside it except :data:`RESUME_EXEMPT` (what shapes the stream), and all
    options except :data:`OPTION_EXEMPT` (the recipe, and for ``train`` what shapes the losses). Values
    are compared by meaning: of the components, the modules' names (the layout may change; the manifest
    keeps it, see :func:`layout_specs`), cost weights as exact numbers."""
    settings: dict[str, Any] = {}

    def add(holder: Any) -> None:
        for item in dataclasses.fields(holder):
            value = getattr(holder, item.name)
            if dataclasses.is_dataclass(value):
                add(value)
            elif item.name not in RESUME_EXEMPT:
                settings[item.name] = value

    add(config)
    # The layout is the manifest's (another one may resume, see check_resume_dir); the modules must be the same.
    settings["components"] = sorted(spec.partition("=")[0].strip() for spec in config.components)
    for name in ("reorder_encoder_cost_weight", "reorder_language_cost_weight"):  # 1, 1.0 and "1" are one weight
        settings[name] = str(exact_weight(settings[name], flag(name)))
    if config.dataset is not None:
        settings["embedded_samples"] = None  # the embedded data is not used
    for item in dataclasses.fields(options):
        if item.name not in OPTION_EXEMPT:
            settings[item.name] = getattr(options, item.name)
    if isinstance(options, TrainOptions):
        from mimo_pipes.train.encoders import vision_tower_identity

        settings["vision_tower"] = vision_tower_identity(options.vision_tower)  # a folder's config, not only its path
    return json.loads(json.dumps(settings))


def setting_flag(name: str) -> str:
    return FLAGS.get(name, flag(name))


def check_resume_dir(directory: str, config: PipelineConfig, world_size: int, options: JobOptions) -> int:
    """Validate a saved state before any rank starts (every launcher and torchrun rank runs it, so a mismatch
    ends every rank with exit 2 before any collective): the committed generation, the settings it was saved
    with, and every one of its files against its manifest. The layout may differ (``world_size`` ranks of
    other DP sizes, TP, PP or offsets): each rank then restores its module's first saved rank (see
    :meth:`~mimo_pipes.checkpoint.generation.Generation.source_rank`). Returns the consumed micro-batch count."""
    generation = open_generation(directory)
    saved, current = generation.settings, resume_settings(config, options)
    for name in [*current, *(name for name in saved if name not in current)]:
        before, now = saved.get(name, MISSING), current.get(name, MISSING)
        if before != now:
            why = f": {WHY[name]}" if name in WHY else ""
            raise ConfigError("--resume", f"{directory} was saved with {setting_flag(name)} {_show(before)}, this run has {_show(now)}{why}")
    generation.verify()
    return generation.consumed


def _show(value: Any) -> str:
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return "modules " + ", ".join(value)
    return show_setting(value, missing="no value (an unknown setting)", none="unset (the default)")
