"""The per-rank body of ``mimo-pipes run``: groups, graph, consume, dump, checkpoint, summary.

:func:`run_rank` is what every rank of ``run`` calls once the process group exists (spawned, under
torchrun, or in a pool of test ranks); :func:`run_in_world` joins the group first.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from mimo_pipes.checkpoint import read_rank_state
from mimo_pipes.cli.job.headline import headline
from mimo_pipes.cli.job.launcher import rank_started, report_phase
from mimo_pipes.cli.job.recipe import load_recipe
from mimo_pipes.cli.job.resume_checks import resume_settings
from mimo_pipes.cli.rank.assignment_dump import AssignmentDump, consumed_record
from mimo_pipes.cli.rank.metrics_log import attach_metrics
from mimo_pipes.cli.rank.progress import progress_bar
from mimo_pipes.cli.rank.report import RankReport, moved_by_module, watch_moves, write_summary_json
from mimo_pipes.cli.rank.setup import RankSetup, set_up_rank
from mimo_pipes.cli.rank.state_save import save_state
from mimo_pipes.cli.rank.stop_boundary import StopAtBoundary, stop_job
from mimo_pipes.cli.rank.stop_signal import StopRequested, signal_name
from mimo_pipes.config import PipelineConfig
from mimo_pipes.config.job_options import JobOptions
from mimo_pipes.exchange.world import check_same_consumed, gather_from_every_rank, join_world, leave_world, world_rank
from mimo_pipes.graph.traversal import graph_nodes
from mimo_pipes.nodes import SequencePacker
from mimo_pipes.observe.bad_rows_report import bad_row_fields, format_mask_report, format_skip_report, masked_rows, skipped_rows
from mimo_pipes.observe.summary import (
    ModuleSummary,
    PackingSummary,
    format_packing_summary,
    format_summary,
    summarize,
    summarize_packing,
)
from mimo_pipes.observe.warning_tally import WarningCount, WarningTally, collected, merge
from mimo_pipes.parallel.topology import Topology


@dataclass(frozen=True)
class RunResult:
    """What a run consumed, as rank 0 prints it: micro-batches ``start .. end-1``, the summaries, every
    rank's records of its consumed micro-batches, this rank's last exchange metrics, and per module the
    samples and bytes its exchange moved for those micro-batches."""

    start: int
    end: int
    summaries: list[ModuleSummary]
    packing: list[PackingSummary] = field(default_factory=list)
    skipped_rows: dict[int, str] = field(default_factory=dict)  # --skip-bad-samples: each bad row, why it was skipped
    skip_attempts: int = 0  # times a bad row was met (a row met again, in a later epoch or slot, counts again)
    masked_rows: dict[int, str] = field(default_factory=dict)  # --skip-bad-samples, rows: each row masked after the exchange, why
    masked_by_module: dict[str, list[int]] = field(default_factory=dict)  # the rows each module masked (the same everywhere)
    records: list[dict[str, Any]] = field(default_factory=list)  # every rank's consumed micro-batches
    metrics: dict[str, Any] | None = None
    warnings: list[WarningCount] = field(default_factory=list)  # every rank's, merged
    metrics_lines: list[str] = field(default_factory=list)  # each module's last exchange metrics line not yet printed
    moved: dict[str, tuple[int, int]] = field(default_factory=dict)  # per module: samples and bytes its exchange moved


def run_in_world(rank: int, world_size: int, config: PipelineConfig, options: JobOptions) -> None:
    """One rank of the job, from joining the process group to leaving it."""
    join_world(rank, world_size, config.exchange_timeout_s)
    try:
        run_rank(config, options)
    finally:
        leave_world()


def run_rank(config: PipelineConfig, options: JobOptions) -> RunResult | None:
    """Body of one rank; the process group exists. Rank 0 prints the summary; every rank of the job returns
    the run's result (None on ranks of the world beyond the job's)."""
    setup = set_up_rank(config)
    if setup is None:
        return None
    with collected() as tally:  # said once, in rank 0's summary
        return _run(setup, config, options, tally)


def _run(setup: RankSetup, config: PipelineConfig, options: JobOptions, tally: WarningTally) -> RunResult:
    # The handlers stay until the summary is printed: a SIGTERM after the last micro-batch (during the save,
    # the gathering or the summary) is held, the summary printed, and then the rank stops for it.
    with StopAtBoundary(setup, saving=options.save_state is not None) as stopper:
        result = _run_and_report(setup, config, options, tally, stopper)
        late = stopper.signal.signum
    if late:
        if world_rank() == 0:
            saved = f"; the state after {result.end} micro-batches is saved in {options.save_state}" if options.save_state else ""
            print(f"{signal_name(late)} came after the last micro-batch: the summary above is complete{saved}", flush=True)
        raise StopRequested(late, options.save_state)
    return result


def _run_and_report(setup: RankSetup, config: PipelineConfig, options: JobOptions, tally: WarningTally,
                    stopper: StopAtBoundary) -> RunResult:
    rank, position = world_rank(), setup.position
    loader = load_recipe(options.recipe).build(config, setup.layout)
    if options.resume:
        loader.load_state_dict(read_rank_state(options.resume, rank, setup.topology))  # on another layout: its module's
    start = loader.consumed_microbatches
    check_same_consumed(start, setup.control)  # every module restored the same micro-batch
    packer = next((node for node in graph_nodes(loader.root) if isinstance(node, SequencePacker)), None)
    stop = options.stop_after if options.stop_after is not None else options.steps
    loader.end_at(stop)  # nothing past the last window this run consumes is read, processed or exchanged
    rank_started()
    metrics_log = attach_metrics(loader, position, options, periodic=rank == 0)
    moved = watch_moves(loader)
    dump = AssignmentDump(options, rank)
    records: list[dict[str, Any]] = []
    progress = progress_bar(rank == 0 and options.progress, total=options.steps, initial=start)
    try:
        signum = 0
        while loader.consumed_microbatches < stop and not (signum := stopper.requested()):
            try:
                batch = next(loader)
            except StopIteration:
                break
            record = consumed_record(batch, position)
            dump.write(record)
            records.append({**record, **bad_row_fields(batch)})  # --skip-bad-samples
            if packer is not None:
                records[-1]["packing"] = packer.last_metrics
            if progress is not None:
                progress.update(1)
        end = loader.consumed_microbatches  # below stop when the data ended first (or a signal came)
        if options.save_state:
            save_state(setup, options.save_state, loader.state_dict(), resume_settings(config, options), end)
            report_phase("saved", end)  # the launcher says so if a signal comes now
        if signum:
            raise stop_job(signum, options.save_state, end)
        metrics = loader.exchange_metrics()
    finally:
        if progress is not None:
            progress.close()
        dump.close()
        # Stopped by a signal (the state, if any, saved): every rank is about to exit, nothing more is read ahead.
        loader.close(drain=not signum)
        if metrics_log is not None:
            metrics_log.close()
    report = RankReport(tally.snapshot(), metrics_log.final_line(metrics) if metrics_log is not None else None,
                        (position.module.name, position.dp_rank, position.tp_rank, position.pp_rank), moved.totals(end))
    everything = gather_from_every_rank((records, end, report), setup.job)
    reports = [rank_report for _, _, rank_report in everything]
    every_record = [r for per_rank, _, _ in everything for r in per_rank]
    skipped, attempts = skipped_rows(every_record, setup.topology.modules[0].name)
    masked, by_module = masked_rows(every_record)
    result = RunResult(
        start=start,
        end=min(rank_end for _, rank_end, _ in everything),
        summaries=summarize(every_record, setup.topology.grid_size),
        packing=summarize_packing(every_record),
        skipped_rows=skipped,
        skip_attempts=attempts,
        masked_rows=masked,
        masked_by_module=by_module,
        records=every_record,
        metrics=metrics,
        warnings=merge(rank_report.warnings for rank_report in reports),
        metrics_lines=[rank_report.metrics_line for rank_report in reports if rank_report.metrics_line],
        moved=moved_by_module(reports),
    )
    if rank == 0:
        _print_result(result, config, options, setup.topology, stop)
        if options.summary_json is not None:
            write_summary_json(options.summary_json, result.summaries, result.moved)
    return result


def _print_result(result: RunResult, config: PipelineConfig, options: JobOptions, topology: Topology, stop: int) -> None:
    for line in result.metrics_lines:
        print(line, file=sys.stderr, flush=True)
    print(headline(config, topology, result.start, result.end), flush=True)
    if result.end < stop:
        print(f"the data ended after {result.end} micro-batches, before the {stop} asked for "
              f"({'--stop-after' if options.stop_after is not None else '--steps'})", flush=True)
    print(format_summary(result.summaries), flush=True)
    if result.packing:
        print(format_packing_summary(result.packing), flush=True)
    if config.skip_bad_samples:
        print(format_skip_report(result.skipped_rows, result.skip_attempts), flush=True)
        if config.exchange_payload == "rows":
            print(format_mask_report(result.masked_rows, result.masked_by_module), flush=True)
    for count in result.warnings:
        print(count.line(), flush=True)
    if options.save_state:
        print(f"saved state after {result.end} micro-batches to {options.save_state}", flush=True)
