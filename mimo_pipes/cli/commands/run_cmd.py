"""``mimo-pipes run``: the main job, on locally spawned ranks or under torchrun.

Flags follow the Megatron-Bridge Qwen3.5-VL example. Every setting is checked before any rank starts;
a bad one ends the command with one line that names it (exit 2), never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from mimo_pipes.cli.job.args import add_job_arguments, config_from_args
from mimo_pipes.cli.job.checks import hold_save_lock, validate_job
from mimo_pipes.cli.job.headline import headline
from mimo_pipes.cli.job.launcher import EXIT_CONFIG, RankMain, launch, say, under_torchrun
from mimo_pipes.config import PipelineConfig
from mimo_pipes.config.job_options import JobOptions
from mimo_pipes.errors import ConfigError
from mimo_pipes.parallel.topology import Topology

COMMAND = "mimo-pipes run"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run the balanced MIMO input pipeline on locally spawned ranks (Gloo on CPUs, NCCL on GPUs) or under "
        "torchrun, and print a per-module summary of the vision load before and after balancing."
    )
    add_job_arguments(parser)
    add_summary_json_argument(parser)


def add_summary_json_argument(parser: argparse.ArgumentParser) -> None:
    """``--summary-json`` (run and train)."""
    parser.add_argument("--summary-json", metavar="PATH", default=None,
                        help="also write the summary as JSON to PATH: per module the printed figures plus the samples "
                             "and bytes the exchange moved (format in docs/design.md) (default: none)")


def announcer(config: PipelineConfig, options: JobOptions, command: str) -> Callable[[Topology, int], None]:
    """The job's first line, as soon as its settings are checked (once: rank 0 under torchrun)."""
    def announce(topology: Topology, consumed: int) -> None:
        if os.environ.get("RANK", "0") == "0":
            stop = options.stop_after if options.stop_after is not None else options.steps
            say(f"{headline(config, topology, consumed, stop, command)}; {topology.world_size} ranks")

    return announce


def prepare(recipe: ModuleType, config: PipelineConfig) -> None:
    """The recipe's one-time preparation (the embedded data and processor), here, so the ranks only load them."""
    if not callable(getattr(recipe, "prepare", None)):
        return
    started = time.monotonic()
    recipe.prepare(config, log=say)
    elapsed = time.monotonic() - started
    if elapsed > 1:
        say(f"data and processor ready in {elapsed:.1f}s")


def checked_job(args: argparse.Namespace) -> tuple[PipelineConfig, JobOptions, int]:
    """Every setting of ``run`` checked (the recipe found), the job's first line said; returns the config,
    the options and the world size; raises ConfigError naming the flag."""
    from mimo_pipes.cli.job.recipe import load_recipe

    config, options = config_from_args(args)
    world_size = validate_job(config, options, announce=announcer(config, options, COMMAND))
    load_recipe(options.recipe)
    return config, options, world_size


def prepare_recipe(config: PipelineConfig, options: JobOptions) -> None:
    """The recipe's preparation, skipped under torchrun (where each rank prepares what it loads)."""
    from mimo_pipes.cli.job.recipe import load_recipe

    if not under_torchrun():
        prepare(load_recipe(options.recipe), config)


def prepare_job(args: argparse.Namespace) -> tuple[PipelineConfig, JobOptions, int]:
    """What ``run`` does before any rank starts: every setting checked, then the recipe's preparation."""
    config, options, world_size = checked_job(args)
    prepare_recipe(config, options)
    return config, options, world_size


def start_job(args: argparse.Namespace, *, command: str, checked: Callable[[argparse.Namespace], tuple[Any, Any, int]],
              rank_main: Callable[[], RankMain]) -> int:
    """A job from its command line: its settings checked, its save lock taken (before the preparation: a
    second job saving there is refused at once), the recipe prepared, its ranks launched (``rank_main``
    gives the per-rank function, imported only then). Bad configuration: one line, exit 2."""
    try:
        config, options, world_size = checked(args)
        lock = hold_save_lock(options)
    except ConfigError as error:
        print(f"{command}: error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        prepare_recipe(config, options)
        return launch(rank_main(), config, options, world_size, command, before_exit=lock.release if lock is not None else None)
    except ConfigError as error:
        print(f"{command}: error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    finally:
        if lock is not None:
            lock.release()


def _run_in_world() -> RankMain:
    from mimo_pipes.cli.rank.run_rank import run_in_world

    return run_in_world


def run(args: argparse.Namespace) -> int:
    return start_job(args, command=COMMAND, checked=checked_job, rank_main=_run_in_world)
