"""``mimo-pipes train``: run's flags, ranks and checks, with a recipe that trains (default: the tiny MIMO
model of ``mimo_pipes_recipes.tiny_mimo_train``) and a per-iteration summary.

``--steps`` and ``--stop-after`` still count global micro-batches, as for ``run``; both must be whole
iterations (global batches of ``--global-batch-size / --micro-batch-size`` micro-batches).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import os
import sys

from mimo_pipes.cli import run_cmd
from mimo_pipes.config import PipelineConfig, TrainOptions
from mimo_pipes.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run_cmd.add_arguments(parser)
    defaults = TrainOptions()
    parser.set_defaults(recipe=defaults.recipe)
    parser.add_argument("--lr", type=float, default=defaults.lr, help=f"SGD learning rate (default {defaults.lr})")
    parser.add_argument("--vision-tower", default=defaults.vision_tower,
                        help=f"vision tower preset or config folder, fp32 on the CPU (default {defaults.vision_tower})")


def options_from_args(args: argparse.Namespace) -> tuple[PipelineConfig, TrainOptions]:
    config, job = run_cmd.config_from_args(args)
    return config, TrainOptions(**dataclasses.asdict(job), lr=args.lr, vision_tower=args.vision_tower)


def validate_training(config: PipelineConfig, options: TrainOptions) -> int:
    """run's checks, then the trainer's: whole iterations, a supported layout, a saved model to resume."""
    from mimo_pipes.cli.job import checkpoint_path

    world_size = run_cmd.validate_job(config, options)
    per_iteration = config.microbatches_per_global_batch
    for name, value in (("--steps", options.steps), ("--stop-after", options.stop_after)):
        if value is not None and value % per_iteration:
            raise ConfigError(name, f"{value} micro-batches are not whole iterations of {per_iteration} micro-batches (one global batch)")
    if not (options.lr > 0 and math.isfinite(options.lr)):
        raise ConfigError("--lr", f"must be positive and finite, got {options.lr}")
    from mimo_pipes.encoders import vision_tower_config

    try:
        vision_tower_config(options.vision_tower)
    except (ValueError, OSError) as error:
        raise ConfigError("--vision-tower", str(error)) from None
    recipe = importlib.import_module(options.recipe)
    if hasattr(recipe, "check_layout"):
        recipe.check_layout(config.validate())
    if options.resume is not None:
        missing = [rank for rank in range(world_size) if not checkpoint_path(options.resume, rank).is_file()]
        if missing:
            raise ConfigError("--resume", f"{options.resume} has no model state for rank {missing[0]} (rank{missing[0]}.pt)")
    return world_size


def run(args: argparse.Namespace) -> int:
    try:
        config, options = options_from_args(args)
        world_size = validate_training(config, options)
        if not ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
            run_cmd._prepare_embedded(config)
    except ConfigError as error:
        print(f"mimo-pipes train: error: {error}", file=sys.stderr)
        return run_cmd.EXIT_CONFIG
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return run_cmd._run_under_torchrun(config, options, world_size)
    return run_cmd._spawn(config, options, world_size)
