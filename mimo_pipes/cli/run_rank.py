"""The per-rank body of ``mimo-pipes run``: groups, graph, consume, dump, checkpoint, summary.

:func:`run_rank` is what every rank of ``run`` calls once the process group exists (spawned, under
torchrun, or in a pool of test ranks); :func:`run_in_world` joins the group first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mimo_pipes.checkpoint import read_rank_state, resume_settings
from mimo_pipes.cli.metrics_log import attach_metrics
from mimo_pipes.cli.rank_job import AssignmentDump, StopAtBoundary, consumed_record, progress_bar, save_state, set_up_rank, stop_job
from mimo_pipes.config import JobOptions, PipelineConfig
from mimo_pipes.exchange.world import gather_from_every_rank, join_world, leave_world, world_rank
from mimo_pipes.loader import graph_nodes
from mimo_pipes.metrics import MovedPerWindow
from mimo_pipes.nodes import SequencePacker
from mimo_pipes.recipe import load_recipe
from mimo_pipes.summary import (
    ModuleSummary,
    PackingSummary,
    format_packing_summary,
    format_summary,
    summarize,
    summarize_packing,
    summary_document,
)
from mimo_pipes.topology import Topology


@dataclass(frozen=True)
class RunResult:
    """What a run consumed, as rank 0 prints it: micro-batches ``start .. end-1``, the summaries, every
    rank's records of its consumed micro-batches, this rank's last exchange metrics, and per module the
    samples and bytes its exchange moved for those micro-batches."""

    start: int
    end: int
    summaries: list[ModuleSummary]
    packing: list[PackingSummary] = field(default_factory=list)
    skipped_rows: list[int] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, Any] | None = None
    moved: dict[str, tuple[int, int]] = field(default_factory=dict)


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
    rank, position = world_rank(), setup.position
    loader = load_recipe(options.recipe).build(config, setup.layout)
    if options.resume:
        loader.load_state_dict(read_rank_state(options.resume, rank))
    start = loader.num_yielded
    packer = next((node for node in graph_nodes(loader.root) if isinstance(node, SequencePacker)), None)
    stop = options.stop_after if options.stop_after is not None else options.steps
    metrics_log = attach_metrics(loader, position, options)
    moved = watch_moves(loader)
    dump = AssignmentDump(options, rank)
    records: list[dict[str, Any]] = []
    progress = progress_bar(rank == 0 and options.progress, total=options.steps, initial=start)
    try:
        with StopAtBoundary(setup, saving=options.save_state is not None) as stopper:
            signum = 0
            while loader.num_yielded < stop and not (signum := stopper.requested()):
                try:
                    batch = next(loader)
                except StopIteration:
                    break
                record = consumed_record(batch, position)
                dump.write(record)
                replaced = [row for rows in batch.get("replaced_rows") or [] for row in rows]  # --skip-bad-samples
                records.append({**record, "replaced_rows": replaced})
                if packer is not None:
                    records[-1]["packing"] = packer.last_metrics
                if progress is not None:
                    progress.update(1)
        end = loader.num_yielded  # below stop when the data ended first (or a signal came)
        if options.save_state:
            save_state(setup, options.save_state, loader.state_dict(), resume_settings(config, options), end)
        if signum:
            raise stop_job(signum, options.save_state, end)
        metrics = loader.exchange_metrics()
        if metrics_log is not None:
            metrics_log.finish(metrics)
    finally:
        if progress is not None:
            progress.close()
        dump.close()
        loader.close()
        if metrics_log is not None:
            metrics_log.close()
    line = (position.module.name, position.dp_rank, position.tp_rank, position.pp_rank)
    everything = gather_from_every_rank((records, end, line, moved.totals(end)), setup.job)
    end = min(rank_end for _, rank_end, _, _ in everything)
    result = RunResult(
        start=start,
        end=end,
        summaries=summarize((r for per_rank, *_ in everything for r in per_rank), setup.topology.grid_size),
        packing=summarize_packing(r for per_rank, *_ in everything for r in per_rank),
        skipped_rows=_skipped_rows(everything, setup.topology.modules[0].name),
        records=[r for per_rank, *_ in everything for r in per_rank],
        metrics=metrics,
        moved=moved_by_module(everything),
    )
    if rank == 0:
        _print_result(result, config, options, setup.topology, stop)
        if options.summary_json is not None:
            write_summary_json(options.summary_json, result.summaries, result.moved)
    return result


def watch_moves(loader: Any) -> MovedPerWindow:
    """What the loader's exchange moves, window by window (nothing without an exchange)."""
    moved = MovedPerWindow()
    exchange = loader.exchange_node()
    if exchange is not None:
        exchange.add_observer(moved)
    return moved


def moved_by_module(everything: list) -> dict[str, tuple[int, int]]:
    """Each module's (samples, bytes) moved, from what every rank gathered, ``(..., (module, dp_rank,
    tp_rank, pp_rank), totals)``: module-wide figures, so its first rank's."""
    moved = {}
    for *_, (module, dp_rank, tp_rank, pp_rank), totals in everything:
        if dp_rank == tp_rank == pp_rank == 0:
            moved[module] = (int(totals[0]), int(totals[1]))
    return moved


def write_summary_json(path: str, summaries: list[ModuleSummary], moved: dict[str, tuple[int, int]]) -> None:
    """``--summary-json``: the document of :func:`~mimo_pipes.summary.summary_document` (rank 0)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(summary_document(summaries, moved), indent=1) + "\n")


def _print_result(result: RunResult, config: PipelineConfig, options: JobOptions, topology: Topology, stop: int) -> None:
    print(headline(config, topology, result.start, result.end), flush=True)
    if result.end < stop:
        print(f"the data ended after {result.end} micro-batches, before the {stop} asked for "
              f"({'--stop-after' if options.stop_after is not None else '--steps'})", flush=True)
    print(format_summary(result.summaries), flush=True)
    if result.packing:
        print(format_packing_summary(result.packing), flush=True)
    if config.skip_bad_samples:
        skipped = result.skipped_rows
        print(f"skipped {len(skipped)} bad dataset row(s) (--skip-bad-samples), each replaced by the next good row "
              f"of its slot{': rows ' + ', '.join(map(str, skipped[:20])) if skipped else ''}", flush=True)
    if options.save_state:
        print(f"saved state after {result.end} micro-batches to {options.save_state}", flush=True)


def _skipped_rows(everything: list, module: str) -> list[int]:
    """The dataset rows one module skipped (every module skips the same ones)."""
    return sorted(row for per_rank, *_ in everything for r in per_rank if r["module"] == module for row in r.get("replaced_rows", []))


def headline(config: PipelineConfig, topology: Topology, start: int, end: int, command: str = "mimo-pipes run") -> str:
    """``end``: the count of micro-batches consumed when the run stopped (start..end-1 were this run's)."""
    reorder = config.reorder
    if reorder.intra_microbatch_reorder:
        mode = (
            f"reorder on (window {reorder.reorder_window_size}"
            f"{', across micro-batches' if reorder.reorder_across_microbatches else ''}, "
            f"overlap {'on' if reorder.overlap_intra_microbatch_reorder else 'off'})"
        )
    else:
        mode = "reorder off (enable with --scalable-dp --intra-microbatch-reorder)"
    if config.pack_sequences_in_batch:
        mode += f", sequence packing on (THD, pad multiple {config.pack_pad_multiple})"
    modules = " + ".join(f"{m.name} dp={m.dp}" for m in topology.modules)
    return (
        f"{command}: {modules}, canonical grid {topology.grid_size}, micro-batch {config.micro_batch_size}, "
        f"{f'micro-batches {start}..{end - 1}' if end > start else 'no micro-batches'}, {mode}"
    )
