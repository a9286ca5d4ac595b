"""Checks of a job's settings that run before any rank starts (``run``, ``train``, ``analyze``)."""

from __future__ import annotations

import os
from collections.abc import Callable

from mimo_pipes.checkpoint import SaveLock, acquire_save_lock, check_save_lock_free, current_job_id
from mimo_pipes.cli.job.output_paths import check_output_folder
from mimo_pipes.config import PipelineConfig
from mimo_pipes.config.job_options import JobOptions
from mimo_pipes.config.transport import resolve_exchange_transport
from mimo_pipes.errors import ConfigError
from mimo_pipes.parallel.topology import Topology

OUTPUT_FOLDERS = {"--save-state": "save_state", "--dump-assignments": "dump_assignments", "--tensorboard": "tensorboard"}


def validate_job(config: PipelineConfig, options: JobOptions, announce: Callable[[Topology, int], None] | None = None) -> int:
    """All checks that can run before a rank starts; returns the world size. The transport is checked last:
    it asks torch whether GPUs are here, and a plain mistake should not wait for that import. ``announce``
    is called with the topology and the micro-batches already consumed as soon as the settings hold."""
    return check_job(config, options, announce)[0].world_size


def check_job(config: PipelineConfig, options: JobOptions, announce: Callable[[Topology, int], None] | None = None) -> tuple[Topology, int]:
    """:func:`validate_job`'s checks, returning the topology and the micro-batches already consumed (``analyze``
    applies every check of ``run``, those of the flags it ignores included, so both accept the same lines)."""
    from mimo_pipes.data.from_config import check_data_settings  # here: the parsers import no torch

    topology = config.validate()
    check_data_settings(config)
    consumed = validate_consumption(config, options, topology.world_size)
    for setting, name in OUTPUT_FOLDERS.items():
        if getattr(options, name) is not None:
            check_output_folder(getattr(options, name), setting)
    if options.save_state is not None:
        check_save_lock_free(options.save_state)  # taken for real once the job starts (hold_save_lock)
    if announce is not None:
        announce(topology, consumed)
    if config.reorder.intra_microbatch_reorder:
        from mimo_pipes.exchange.world import world_backend

        resolve_exchange_transport(
            config.exchange_transport,
            world_backend(topology.world_size),
            config.reorder.overlap_intra_microbatch_reorder or config.read_ahead > 0,  # off the training thread
            os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
            warn=os.environ.get("RANK", "0") == "0",  # under torchrun every rank checks: rank 0 says it
        )
    return topology, consumed


def validate_consumption(config: PipelineConfig, options: JobOptions, world_size: int) -> int:
    """Checks of what the job consumes (also used by ``analyze``); returns the micro-batches already
    consumed (those of ``--resume``, else 0)."""
    from mimo_pipes.cli.job.recipe import check_recipe_exists

    check_recipe_exists(options.recipe)
    if options.steps < 1:
        raise ConfigError("--steps", f"must be >= 1, got {options.steps}")
    if options.stop_after is not None and options.save_state is None:
        raise ConfigError("--stop-after", "needs --save-state DIR: where the state after those micro-batches is saved")
    if options.stop_after is not None and not 1 <= options.stop_after <= options.steps:
        raise ConfigError("--stop-after", f"must be between 1 and --steps ({options.steps}), got {options.stop_after}")
    if options.tensorboard is not None and not config.reorder.intra_microbatch_reorder:
        raise ConfigError("--tensorboard", "exchange metrics need --scalable-dp --intra-microbatch-reorder (without "
                          "reordering every rank's load is its reader's: see the run summary's 'before')")
    if options.summary_json is not None and os.path.isdir(options.summary_json):
        raise ConfigError("--summary-json", f"{options.summary_json} is a folder; give the path of the JSON file to write")
    if options.log_interval < 0:
        raise ConfigError("--log-interval", f"must be >= 0, got {options.log_interval}")
    consumed = 0
    if options.resume is not None:
        from mimo_pipes.cli.job.resume_checks import check_resume_dir

        consumed = check_resume_dir(options.resume, config, world_size, options)
        if consumed >= options.steps:
            raise ConfigError("--steps", f"{options.steps} is not past the {consumed} micro-batches already consumed in {options.resume}")
        if options.stop_after is not None and options.stop_after <= consumed:
            raise ConfigError("--stop-after", f"must be past the {consumed} micro-batches already consumed")
    return consumed


def hold_save_lock(options: JobOptions) -> SaveLock | None:
    """The ``--save-state`` folder's lock for this job (None without ``--save-state``): a second job saving
    there is refused before any of its ranks starts. Release it when the job ends."""
    if options.save_state is None:
        return None
    return acquire_save_lock(options.save_state, current_job_id())
