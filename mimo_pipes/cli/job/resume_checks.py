"""The checks a resumed run makes of the command line's options (``--resume``): the settings of
:mod:`mimo_pipes.checkpoint.same_settings` plus the options of ``run`` and ``train`` that shape what it computes."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from mimo_pipes.checkpoint.generation import open_generation
from mimo_pipes.checkpoint.same_settings import (  # noqa: F401 - the checks' tables, named where the CLI's tests look
    RESUME_EXEMPT,
    WHY,
    check_same_settings,
    config_settings,
    layout_specs,
    setting_flag,
)
from mimo_pipes.config import PipelineConfig
from mimo_pipes.config.job_options import JobOptions, TrainOptions

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
def resume_settings(config: PipelineConfig, options: JobOptions | None) -> dict[str, Any]:
    """Every setting a resumed run must share with the saved one: the config's (:func:`config_settings`) and
    all options except :data:`OPTION_EXEMPT` (the recipe, and for ``train`` what shapes the losses)."""
    settings = config_settings(config)
    for item in dataclasses.fields(options) if options is not None else ():
        if item.name not in OPTION_EXEMPT:
            settings[item.name] = getattr(options, item.name)
    if isinstance(options, TrainOptions):
        from mimo_pipes.demo_model.encoders import vision_tower_identity

        settings["vision_tower"] = vision_tower_identity(options.vision_tower)  # a folder's config, not only its path
    return json.loads(json.dumps(settings))


def check_resume_dir(directory: str, config: PipelineConfig, world_size: int, options: JobOptions) -> int:
    """Validate a saved state before any rank starts (every launcher and torchrun rank runs it, so a mismatch
    ends every rank with exit 2 before any collective): the committed generation, the settings it was saved
    with, and every one of its files against its manifest. The layout may differ (``world_size`` ranks of
    other DP sizes, TP, PP or offsets): each rank then restores its module's first saved rank (see
    :meth:`~mimo_pipes.checkpoint.generation.Generation.source_rank`). Returns the consumed micro-batch count."""
    generation = open_generation(directory)
    check_same_settings(generation.settings, resume_settings(config, options), where=directory, setting="--resume")
    generation.verify()
    return generation.consumed
