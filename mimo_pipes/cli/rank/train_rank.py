"""The per-rank body of ``mimo-pipes train``: run's ranks and groups, with the recipe's Trainer around
the recipe's loader, a checkpoint of model, optimizer and loader, and a per-iteration summary."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from mimo_pipes.checkpoint import encode_model_state, model_file, read_trainer_state
from mimo_pipes.cli.job.headline import headline
from mimo_pipes.cli.job.launcher import rank_started
from mimo_pipes.cli.job.recipe import load_recipe
from mimo_pipes.cli.job.resume_checks import resume_settings
from mimo_pipes.cli.rank.assignment_dump import AssignmentDump
from mimo_pipes.cli.rank.metrics_log import attach_metrics
from mimo_pipes.cli.rank.progress import progress_bar
from mimo_pipes.cli.rank.report import RankReport, moved_by_module, watch_moves, write_summary_json
from mimo_pipes.cli.rank.setup import RankSetup, set_up_rank
from mimo_pipes.cli.rank.state_save import save_state
from mimo_pipes.cli.rank.stop_boundary import StopAtBoundary, stop_job
from mimo_pipes.config import PipelineConfig
from mimo_pipes.config.job_options import TrainOptions
from mimo_pipes.exchange.world import check_same_consumed, gather_from_every_rank, join_world, leave_world, world_rank
from mimo_pipes.observe.bad_rows_report import format_mask_report, format_skip_report, masked_rows, skipped_rows
from mimo_pipes.observe.summary import ModuleSummary, format_summary, summarize
from mimo_pipes.observe.warning_tally import WarningCount, WarningTally, collected, merge


@dataclass(frozen=True)
class TrainResult:
    """Iterations ``start .. stop-1`` as rank 0 prints them: every rank's step results, the summaries, and
    this rank's last exchange metrics."""

    start: int
    stop: int
    steps: list[Any]  # every rank's StepResult of every iteration
    summaries: list[ModuleSummary]
    mine: list[Any]  # this rank's StepResults
    metrics: dict[str, Any] | None = None
    warnings: list[WarningCount] = field(default_factory=list)  # every rank's, merged


def train_in_world(rank: int, world_size: int, config: PipelineConfig, options: TrainOptions) -> None:
    # The tiny trainer's models live on the CPU: Gloo even where GPUs are visible.
    join_world(rank, world_size, config.exchange_timeout_s, backend="gloo")
    try:
        train_rank(config, options)
    finally:
        leave_world()


def train_rank(config: PipelineConfig, options: TrainOptions) -> TrainResult | None:
    """Body of one training rank: iterations of the recipe's Trainer, checkpoint, summary on rank 0; every
    rank of the job returns the result (None on ranks of the world beyond the job's)."""
    setup = set_up_rank(config, exchange_transport="gloo")
    if setup is None:
        return None
    with collected() as tally:  # said once, in rank 0's summary
        return _train(setup, config, options, tally)


def _train(setup: RankSetup, config: PipelineConfig, options: TrainOptions, tally: WarningTally) -> TrainResult:
    from mimo_pipes.cli.rank.train_report import format_training

    rank = world_rank()
    recipe = load_recipe(options.recipe, needs=("build", "Trainer"), command="train")
    trainer = recipe.Trainer(config, options, setup.groups, setup.topology, recipe.build(config, setup.layout))
    if options.resume:
        trainer.load_state_dict(read_trainer_state(options.resume, rank, setup.topology))  # on another layout: its module's
    check_same_consumed(trainer.loader.consumed_microbatches, setup.control)  # every module restored the same micro-batch
    rank_started()
    per_iteration = config.microbatches_per_global_batch
    start = trainer.iteration
    stop = (options.stop_after if options.stop_after is not None else options.steps) // per_iteration
    # A trainer consumes what it trains on and no more (its loader's count is what a save records), so the graph
    # reads nothing past the last window of the last iteration.
    trainer.loader.end_at(stop * per_iteration)
    metrics_log = attach_metrics(trainer.loader, setup.position, options, periodic=rank == 0)  # --tensorboard, --log-interval as for run
    moved = watch_moves(trainer.loader)
    dump = AssignmentDump(options, rank)
    results = []
    progress = progress_bar(rank == 0 and options.progress, options.steps // per_iteration, start, "iterations", "it")
    try:
        with StopAtBoundary(setup, saving=options.save_state is not None) as stopper:
            signum = 0
            while trainer.iteration < stop and not (signum := stopper.requested()):
                result = trainer.step()
                results.append(result)
                for record in result.records:
                    dump.write(record)
                if progress is not None:
                    progress.update(1)
        if options.save_state:
            state = trainer.state_dict()
            save_state(setup, options.save_state, state["loader"], resume_settings(config, options), trainer.loader.consumed_microbatches,
                       extra_files={model_file(rank): encode_model_state(state)})
        if signum:
            raise stop_job(signum, options.save_state, trainer.loader.consumed_microbatches)
        metrics = trainer.loader.exchange_metrics()
    finally:
        if progress is not None:
            progress.close()
        dump.close()
        trainer.close()
        if metrics_log is not None:
            metrics_log.close()
    position = setup.position
    report = RankReport(tally.snapshot(), metrics_log.final_line(metrics) if metrics_log is not None else None,
                        (position.module.name, position.dp_rank, position.tp_rank, position.pp_rank), moved.totals(trainer.loader.consumed_microbatches))
    everything = gather_from_every_rank((results, report), setup.job)
    flat = [result for per_rank, _ in everything for result in per_rank or []]
    reports = [rank_report for _, rank_report in everything]
    warnings = merge(rank_report.warnings for rank_report in reports)
    records = [{**r, "tp_rank": 0, "pp_rank": 0} for result in flat for r in result.records]
    summaries = summarize(records, setup.topology.grid_size)
    if rank == 0:
        for rank_report in reports:
            if rank_report.metrics_line:
                print(rank_report.metrics_line, file=sys.stderr, flush=True)
        print(headline(config, setup.topology, start * per_iteration, stop * per_iteration, command="mimo-pipes train"), flush=True)
        print(format_training(flat), flush=True)
        print(format_summary(summaries), flush=True)
        if config.skip_bad_samples:
            print(format_skip_report(*skipped_rows(records, setup.topology.modules[0].name)), flush=True)
            if config.exchange_payload == "rows":
                print(format_mask_report(*masked_rows(records)), flush=True)
        for count in warnings:
            print(count.line(), flush=True)
        if options.save_state:
            print(f"saved model, optimizer and loader state after iteration {stop} to {options.save_state}", flush=True)
        if options.summary_json is not None:
            write_summary_json(options.summary_json, summaries, moved_by_module(reports))
    return TrainResult(start, stop, flat, summaries, results, metrics, warnings)
