"""``analyze``: every figure of one configuration, as a JSON-ready dict per module, plus plots."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mimo_pipes.analysis.replay import GridReplay, Planner, Schedule, critical_path_bound, rank_loads, replay, spread_and_path
from mimo_pipes.config import PipelineConfig
from mimo_pipes.cost import CostFunction
from mimo_pipes.cost_range import window_budget
from mimo_pipes.summary import summarize
from mimo_pipes.tail_settings import resolve_plan
from mimo_pipes.topology import Topology

PARALLEL_FROM_MICROBATCHES = 4096  # below this, starting worker processes costs more than it saves
MODELLED_TIME_UNIT = "ns of modelled encoder time"

Progress = Callable[[str, int], Callable[[int], None]]
"""(description, total) -> callback taking the units just done."""


@dataclass(frozen=True)
class Analysis:
    figures: dict[str, dict[str, Any]]  # per module name
    replay: GridReplay  # the configuration as given
    unreordered: GridReplay


def _no_progress(_description: str, _total: int) -> Callable[[int], None]:
    return lambda _done: None


def run_records(result: GridReplay, tokens: np.ndarray, topology: Topology) -> list[dict[str, Any]]:
    """One record per (module DP rank, step), shaped as ``mimo-pipes run`` collects them for its summary."""
    batch = result.after.shape[1]
    records = []
    for module in topology.modules:
        per_rank = batch // module.dp
        for i, step in enumerate(result.steps.tolist()):
            for rank in range(module.dp):
                span = slice(rank * per_rank, (rank + 1) * per_rank)
                records.append({
                    "module": module.name, "dp_rank": rank, "dp_size": module.dp, "step": step,
                    "image_tokens": tokens[result.after[i, span]].tolist(), "slots": result.after_slots[i, span].tolist(),
                    "read_steps": result.after_read_steps[i, span].tolist(),
                })
    return records


def analyze(
    config: PipelineConfig,
    topology: Topology,
    image_tokens: np.ndarray,
    real_tokens: np.ndarray,
    *,
    start: int,
    stop: int,
    encoder_costs: np.ndarray | None = None,
    compare_window_sizes: Sequence[int] = (2, 4, 8),
    progress: Progress = _no_progress,
) -> Analysis:
    """Figures of micro-batches ``start .. stop-1`` of a run with ``config``, from per-row token counts.

    With a time model (``reorder_cost_model``) ``encoder_costs`` are each row's modelled encoder ns
    (``RowCounts.encoder_costs``); the planner then balances on them with the model's floor, and every
    encoder module also gets its figures in modelled time (``modelled_encoder_time``). With two-level
    balance ``real_tokens`` must be counted; every module also gets its figures in real tokens."""
    reorder = config.reorder
    # The plan a run would balance with; the what-ifs reorder even where the given settings do not.
    plan = resolve_plan(dataclasses.replace(reorder, scalable_dp=True, intra_microbatch_reorder=True), topology)
    model = plan.time_model
    if model is not None and encoder_costs is None:
        raise ValueError("a time model (reorder_cost_model) needs encoder_costs: each row's modelled encoder ns")
    encoder = encoder_costs if model is not None else image_tokens
    planning = plan.planner
    widest = max(plan.window_size, *compare_window_sizes)
    config.check_cost_range(topology, widest)  # the what-ifs plan windows of up to `widest` micro-batches
    costs = plan.cost.cost(encoder, real_tokens)  # exact int64, or ConfigError
    _check_rows_fit(plan.cost, costs, encoder, real_tokens, window_budget(config.micro_batch_size * widest, widest, planning.floor),
                    config.micro_batch_size * widest)
    if planning.encoder_groups and (real_tokens < 0).any():
        raise ValueError("two-level balance needs every row's real tokens, and some were not counted")
    planner = Planner(costs, planning.floor, planning.encoder_groups, encoder, real_tokens)
    schedule = Schedule(len(image_tokens), config.micro_batch_size, topology.grid_size, config.seed, config.dataloader_type == "cyclic")
    consumed = max(schedule.end(stop) - start, 0)
    variants = {"per_microbatch": (True, 1, False), **{f"across_window_{w}": (True, w, True) for w in compare_window_sizes}}
    given = (reorder.intra_microbatch_reorder, reorder.reorder_window_size, reorder.reorder_across_microbatches)
    settings = [given, (False, 1, False), *(v for v in variants.values() if v not in (given, (False, 1, False)))]
    replays = _replay_all(schedule, planner, list(dict.fromkeys(settings)), start, stop, progress("replay", consumed * len(set(settings))))
    result, unreordered = replays[given], replays[(False, 1, False)]
    summaries = {s.module: s for s in summarize(run_records(result, image_tokens, topology), topology.grid_size)}
    figures: dict[str, dict[str, Any]] = {}
    for module in topology.modules:
        summary = summaries.get(module.name)
        base_spread, base_path = spread_and_path(rank_loads(unreordered.before, image_tokens, module.dp))
        what_if = {"no_reorder": {"spread": base_spread, "critical_path": base_path}}
        bounds: dict[str, int | None] = {}
        for name, setting in variants.items():
            spread, path = spread_and_path(rank_loads(replays[setting].after, image_tokens, module.dp))
            what_if[name] = {"spread": spread, "critical_path": path}
            bounds[name] = critical_path_bound(
                schedule, image_tokens, module.dp, start=start, stop=stop, window_size=setting[1], across_microbatches=setting[2]
            )
        figures[module.name] = {
            "dp_size": module.dp,
            "steps": summary.steps if summary else 0,
            "spread_before": summary.mean_spread_before if summary else 0.0,
            "spread_after": summary.mean_spread_after if summary else 0.0,
            "critical_path_before": summary.max_rank_tokens_before if summary else 0,
            "critical_path_after": summary.max_rank_tokens_after if summary else 0,
            "samples": summary.samples if summary else 0,
            "image_tokens": summary.image_tokens if summary else 0,
            "what_if": what_if,
            "critical_path_lower_bound": bounds,
        }
        if model is not None and module in topology.encoders:
            figures[module.name]["modelled_encoder_time"] = {
                "unit": MODELLED_TIME_UNIT, "floor": model.floor_ns, **_figures(result, encoder, module.dp, topology.grid_size, model.floor_ns)
            }
        if planning.encoder_groups:
            figures[module.name]["real_tokens"] = _figures(result, real_tokens, module.dp, topology.grid_size)
    return Analysis(figures, result, unreordered)


def _check_rows_fit(cost: CostFunction, costs: np.ndarray, encoder: np.ndarray, real_tokens: np.ndarray, budget: int,
                    samples: int) -> None:
    """Counts beyond what --seq-length allows (a recipe's own counter) are refused as the graph refuses them."""
    if encoder.size == 0:
        return
    worst = int(np.argmax(np.maximum(costs, encoder)))
    cost.check_range(worst, int(encoder[worst]), int(real_tokens[worst]), budget, samples)


def _figures(result: GridReplay, values: np.ndarray, dp_size: int, grid_size: int, floor: int = 0) -> dict[str, float | int]:
    """Spread and critical path before and after, as the run summary defines them for image tokens, of a
    per-row quantity; a rank's load per micro-batch is at least ``floor`` (an encoder forward's floor)."""
    after = np.maximum(rank_loads(result.after, values, dp_size), floor)
    read_steps, group = np.unique(result.after_read_steps, return_inverse=True)
    before = np.zeros((len(read_steps), dp_size), dtype=np.int64)  # by (read step, reading rank), as the summary
    np.add.at(before, (group.reshape(result.after.shape), result.after_slots // (grid_size // dp_size)), values[result.after])
    spread_before, path_before = spread_and_path(np.maximum(before, floor))
    spread_after, path_after = spread_and_path(after)
    return {"spread_before": spread_before, "spread_after": spread_after, "critical_path_before": path_before, "critical_path_after": path_after}


def _replay_one(schedule: Schedule, planner: Planner, setting: tuple[bool, int, bool], start: int, stop: int,
                progress: Callable[[int], None] | None = None) -> GridReplay:
    on, window, across = setting
    return replay(schedule, planner, start=start, stop=stop, reorder=on, window_size=window, across_microbatches=across, progress=progress)


def _replay_all(schedule: Schedule, planner: Planner, settings: list[tuple[bool, int, bool]], start: int, stop: int,
                tick: Callable[[int], None]) -> dict[tuple[bool, int, bool], GridReplay]:
    """Each setting's replay; large ones in worker processes, one per core (they are independent)."""
    consumed = max(schedule.end(stop) - start, 0)
    workers = min(len(settings), os.cpu_count() or 1)
    if workers < 2 or consumed < PARALLEL_FROM_MICROBATCHES:
        return {setting: _replay_one(schedule, planner, setting, start, stop, tick) for setting in settings}
    context = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = {setting: pool.submit(_replay_one, schedule, planner, setting, start, stop) for setting in settings}
        for future in concurrent.futures.as_completed(futures.values()):
            future.result()
            tick(consumed)
        return {setting: future.result() for setting, future in futures.items()}


def write_plots(out: Path, analysis: Analysis, image_tokens: np.ndarray, topology: Topology, title: str) -> list[Path]:
    """One PNG per module: ``out/<module>.png``."""
    from mimo_pipes.analysis.plot import plot_module

    paths = []
    for module in topology.modules:
        before = rank_loads(analysis.unreordered.before, image_tokens, module.dp)
        after = rank_loads(analysis.replay.after, image_tokens, module.dp)
        paths.append(plot_module(out / f"{module.name}.png", module.name, analysis.replay.steps, before, after, f"{module.name} dp={module.dp}: {title}"))
    return paths
