"""``mimo-pipes train``: run's flags, ranks and checks, with a recipe that trains (default: the tiny MIMO
model of ``mimo_pipes_recipes.tiny_mimo_train``) and a per-iteration summary.

``--steps`` and ``--stop-after`` still count global micro-batches, as for ``run``; both must be whole
iterations (global batches of ``--global-batch-size / --micro-batch-size`` micro-batches).
"""

from __future__ import annotations

import argparse
import dataclasses
import math

from mimo_pipes.cli.commands.argtypes import path
from mimo_pipes.cli.commands.run_cmd import add_summary_json_argument, announcer, prepare_recipe, start_job
from mimo_pipes.cli.job.args import add_job_arguments, config_from_args
from mimo_pipes.cli.job.checks import validate_job
from mimo_pipes.cli.job.launcher import RankMain
from mimo_pipes.config import PipelineConfig
from mimo_pipes.config.job_options import TrainOptions
from mimo_pipes.errors import ConfigError

COMMAND = "mimo-pipes train"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Train a tiny non-colocated MIMO model on the pipeline (CPU, Gloo): the vision tower on the encoder "
        "module's ranks, a small language model on the language ranks, fed by the balanced loader, with the "
        "loss normalised over each global batch. Takes run's flags; --steps counts global micro-batches."
    )
    add_job_arguments(parser)
    add_summary_json_argument(parser)
    defaults = TrainOptions()
    parser.set_defaults(recipe=defaults.recipe)
    parser.add_argument("--lr", type=float, default=defaults.lr, help="SGD learning rate")
    parser.add_argument("--vision-tower", type=path, default=defaults.vision_tower,
                        help="vision tower preset or config folder, fp32 on the CPU")


def options_from_args(args: argparse.Namespace) -> tuple[PipelineConfig, TrainOptions]:
    config, job = config_from_args(args)
    return config, TrainOptions(**dataclasses.asdict(job), lr=args.lr, vision_tower=args.vision_tower)


def validate_training(config: PipelineConfig, options: TrainOptions) -> int:
    """run's checks, then the trainer's: whole iterations, a supported layout, a saved model to resume."""
    from mimo_pipes.checkpoint import model_file, open_generation
    from mimo_pipes.cli.job.recipe import load_recipe

    announced: list = []
    world_size = validate_job(config, options, announce=lambda *facts: announced.append(facts))
    per_iteration = config.microbatches_per_global_batch
    for name, value in (("--steps", options.steps), ("--stop-after", options.stop_after)):
        if value is not None and value % per_iteration:
            raise ConfigError(name, f"{value} micro-batches are not whole iterations of {per_iteration} micro-batches (one global batch)")
    if not (options.lr > 0 and math.isfinite(options.lr)):
        raise ConfigError("--lr", f"must be positive and finite, got {options.lr}")
    from mimo_pipes.demo_model.encoders import vision_tower_config

    try:
        vision_tower_config(options.vision_tower)
    except (ValueError, OSError) as error:
        raise ConfigError("--vision-tower", str(error)) from None
    recipe = load_recipe(options.recipe, needs=("build", "Trainer"), command="train")
    if hasattr(recipe, "check_layout"):
        recipe.check_layout(config.validate())
    if options.resume is not None:
        generation = open_generation(options.resume)  # its files were checked by run's checks
        missing = [rank for rank in range(generation.world_size) if not generation.has(model_file(rank))]
        if missing:
            raise ConfigError("--resume", f"{options.resume} has no model state for rank {missing[0]} ({model_file(missing[0])}): "
                                          "it was saved by mimo-pipes run, not train")
    announcer(config, options, COMMAND)(*announced[0])  # the first line, once the trainer's checks hold too
    return world_size


def checked_job(args: argparse.Namespace) -> tuple[PipelineConfig, TrainOptions, int]:
    """Every setting of ``train`` checked (run's and the trainer's)."""
    config, options = options_from_args(args)
    return config, options, validate_training(config, options)


def prepare_job(args: argparse.Namespace) -> tuple[PipelineConfig, TrainOptions, int]:
    """What ``train`` does before any rank starts (as ``run``'s, with the trainer's checks)."""
    config, options, world_size = checked_job(args)
    prepare_recipe(config, options)
    return config, options, world_size


def _train_in_world() -> RankMain:
    from mimo_pipes.cli.rank.train_rank import train_in_world

    return train_in_world


def run(args: argparse.Namespace) -> int:
    return start_job(args, command=COMMAND, checked=checked_job, rank_main=_train_in_world)
