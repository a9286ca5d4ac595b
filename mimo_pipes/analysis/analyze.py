"""``analyze``: every figure of one configuration, as a JSON-ready dict per module, plus plots."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mimo_pipes.analysis.replay import (
    GridReplay,
    Planner,
    Schedule,
    critical_path_bound,
    critical_path_bounds,
    rank_loads,
    replay,
    spread_and_path,
)
from mimo_pipes.config import PipelineConfig
from mimo_pipes.config.counts import as_count
from mimo_pipes.config.tail_settings import resolve_plan
from mimo_pipes.observe.summary import ModuleSummary, summarize
from mimo_pipes.parallel.topology import ModuleSpec, Topology
from mimo_pipes.samples.cost import CostFunction
from mimo_pipes.samples.cost_range import window_budget
from mimo_pipes.samples.worker_start import worker_context

if TYPE_CHECKING:
    from mimo_pipes.analysis.plot import ModulePlot

PARALLEL_FROM_MICROBATCHES = 4096  # below this, starting worker processes costs more than it saves
MODELLED_TIME_UNIT = "ns of modelled encoder time"
NO_REORDER = "no_reorder"
PER_MICROBATCH = "per_microbatch"
Setting = tuple[bool, int, bool]  # (reorder, window size, across micro-batches)

Progress = Callable[[str, int], Callable[[int], None]]
"""(description, total) -> callback taking the units just done."""


@dataclass(frozen=True)
class Quantity:
    """A per-row quantity a module's figures are given in: ``values`` per dataset row, a rank's load per
    micro-batch counting at least ``floor``; ``unit`` and ``scale`` (raw / scale) say how to show it, and
    ``block`` is the analysis.json key holding its figures (None: the top level, image tokens)."""

    unit: str
    values: np.ndarray
    floor: int = 0
    scale: float = 1.0
    block: str | None = None

    @property
    def integer(self) -> bool:
        """Shown as whole numbers (counts of tokens), not as a scaled time."""
        return self.scale == 1.0


@dataclass(frozen=True)
class Analysis:
    """The figures (analysis.json), the replays behind them and, per module, the quantity its ranks were
    balanced on (``balanced``: modelled encoder time on encoder modules with a time model, real tokens on
    language modules with two-level balance, else image tokens)."""

    figures: dict[str, dict[str, Any]]  # per module name
    replay: GridReplay  # the configuration as given
    unreordered: GridReplay
    what_ifs: dict[str, GridReplay]  # per what-if name (no_reorder, per_microbatch, across_window_W)
    given: Setting
    balanced: dict[str, Quantity]
    schedule: Schedule
    start: int
    stop: int
    incomplete: frozenset[str] = frozenset()  # what-ifs with a window cut by the consumed range (see cut_window)

    def given_what_if(self) -> str | None:
        """The what-if name that replays the settings given (None: a window not among the compared ones)."""
        on, window, across = self.given
        if not on:
            return NO_REORDER
        name = f"across_window_{window}" if across else PER_MICROBATCH
        return name if name in self.what_ifs else None


def cut_window(schedule: Schedule, start: int, stop: int, window_size: int, across_microbatches: bool) -> bool:
    """Whether a window whose samples may move across micro-batches is cut by ``start`` or ``stop`` (--resume,
    --steps, --stop-after): its consumed micro-batches were balanced with samples of micro-batches the run
    never consumes, so the setting's figures cover part of its windows and compare with no other setting's."""
    if not across_microbatches:
        return False
    end = schedule.end(stop)
    return any((first < start or last > end) and max(first, start) < min(last, end) for first, last in schedule.windows(start, stop, window_size))


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
    bad_rows: Mapping[int, str] | None = None,
) -> Analysis:
    """Figures of micro-batches ``start .. stop-1`` of a run with ``config``, from per-row token counts.

    With a time model (``reorder_cost_model``) ``encoder_costs`` are each row's modelled encoder ns
    (``RowCounts.encoder_costs``); the planner then balances on them with the model's floor, and every
    encoder module also gets its figures in modelled time (``modelled_encoder_time``). With two-level
    balance ``real_tokens`` must be counted; every module also gets its figures in real tokens. ``bad_rows``
    (``--skip-bad-samples``: row -> why it cannot be processed): each is read as the next good row of the
    global order, as the graph replaces it."""
    start, stop = as_count(start, "start"), as_count(stop, "stop")
    compare_window_sizes = [as_count(size, "compare_window_sizes", minimum=1) for size in compare_window_sizes]
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
    schedule = Schedule(len(image_tokens), config.micro_batch_size, topology.grid_size, config.seed, config.dataloader_type == "cyclic",
                        dict(bad_rows or {}))
    consumed = max(schedule.end(stop) - start, 0)
    variants: dict[str, Setting] = {PER_MICROBATCH: (True, 1, False), **{f"across_window_{w}": (True, w, True) for w in compare_window_sizes}}
    off: Setting = (False, 1, False)
    given: Setting = (True, reorder.reorder_window_size, reorder.reorder_across_microbatches) if reorder.intra_microbatch_reorder else off
    settings = list(dict.fromkeys([given, off, *variants.values()]))
    replays = _replay_all(schedule, planner, settings, start, stop, progress("replay", consumed * len(settings)))
    result, unreordered = replays[given], replays[off]
    what_ifs = {NO_REORDER: unreordered, **{name: replays[setting] for name, setting in variants.items()}}
    incomplete = frozenset(name for name, (_, window, across) in variants.items() if cut_window(schedule, start, stop, window, across))
    summaries = {s.module: s for s in summarize(run_records(result, image_tokens, topology), topology.grid_size)}
    figures: dict[str, dict[str, Any]] = {}
    balanced: dict[str, Quantity] = {}
    tokens = Quantity("image tokens", image_tokens)
    bound_of = functools.partial(critical_path_bound, schedule, start=start, stop=stop)
    for module in topology.modules:
        figures[module.name], balanced[module.name] = _module_figures(
            module, summaries.get(module.name), topology=topology, result=result, what_ifs=what_ifs, variants=variants,
            tokens=tokens, bound_of=bound_of, incomplete=incomplete, model=model, encoder=encoder, real_tokens=real_tokens,
            two_level=bool(planning.encoder_groups),
        )
    return Analysis(figures, result, unreordered, what_ifs, given, balanced, schedule, start, stop, incomplete)


def _module_figures(
    module: ModuleSpec,
    summary: ModuleSummary | None,
    *,
    topology: Topology,
    result: Any,
    what_ifs: Mapping[str, Any],
    variants: Mapping[str, Setting],
    tokens: Quantity,
    bound_of: Callable[..., Any],
    incomplete: frozenset[str],
    model: Any,
    encoder: np.ndarray,
    real_tokens: np.ndarray,
    two_level: bool,
) -> tuple[dict[str, Any], Quantity]:
    """One module's figures (image tokens, then modelled time for an encoder with a time model, real tokens
    under two-level balance) and the quantity its planner balanced."""
    what_if, bounds = _what_ifs(what_ifs, variants, tokens, module.dp, bound_of, incomplete)
    figures: dict[str, Any] = {
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
    balanced = tokens
    extra = []
    if model is not None and module in topology.encoders:
        time = Quantity("modelled ms", encoder, model.floor_ns, 1e6, "modelled_encoder_time")
        extra.append(time)
        balanced = time
    if two_level:
        real = Quantity("real tokens", real_tokens, block="real_tokens")
        extra.append(real)
        if module.is_language:
            balanced = real
    for quantity in extra:
        block = {"unit": MODELLED_TIME_UNIT, "floor": quantity.floor} if quantity.block == "modelled_encoder_time" else {}
        what_if, bounds = _what_ifs(what_ifs, variants, quantity, module.dp, bound_of, incomplete)
        figures[str(quantity.block)] = {
            **block, **_figures(result, quantity.values, module.dp, topology.grid_size, quantity.floor),
            "what_if": what_if, "critical_path_lower_bound": bounds,
        }
    return figures, balanced


def skipped_rows(analysis: Analysis) -> tuple[dict[int, str], int]:
    """``--skip-bad-samples``: each distinct bad row the consumed samples stand in for, with why, and how many
    times bad rows were met (per consumed sample, the rows skipped to reach it), as the run's summary counts them."""
    schedule, replayed = analysis.schedule, analysis.replay
    if not schedule.bad_rows or replayed.after_positions is None:
        return {}, 0
    rows: dict[int, str] = {}
    attempts = 0
    by_step: dict[int, dict[int, list[int]]] = {}
    for step, position in zip(replayed.after_read_steps.reshape(-1).tolist(), replayed.after_positions.reshape(-1).tolist()):
        if step not in by_step:
            by_step[step] = schedule.replaced_rows(step)
        for row in by_step[step].get(position, []):
            rows.setdefault(row, schedule.bad_rows[row])
            attempts += 1
    return dict(sorted(rows.items())), attempts


def _what_ifs(what_ifs: dict[str, GridReplay], variants: dict[str, Setting], quantity: Quantity, dp_size: int,
              bound_of: Callable[..., int | None], incomplete: frozenset[str] = frozenset(),
              ) -> tuple[dict[str, dict[str, float | int | bool]], dict[str, int | None]]:
    """Spread and critical path of every what-if in ``quantity`` (no_reorder: the readers' shards), marked
    ``incomplete`` where the run cuts one of its windows, and the lower bound of each balancing setting."""
    figures: dict[str, dict[str, float | int | bool]] = {}
    for name, replayed in what_ifs.items():
        rows = replayed.before if name == NO_REORDER else replayed.after
        spread, path = spread_and_path(np.maximum(rank_loads(rows, quantity.values, dp_size), quantity.floor))
        figures[name] = {"spread": spread, "critical_path": path, **({"incomplete": True} if name in incomplete else {})}
    bounds = {name: bound_of(quantity.values, dp_size, window_size=window, across_microbatches=across, floor=quantity.floor)
              for name, (_, window, across) in variants.items()}
    return figures, bounds


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


def _replay_one(schedule: Schedule, planner: Planner, setting: Setting, start: int, stop: int,
                progress: Callable[[int], None] | None = None) -> GridReplay:
    on, window, across = setting
    return replay(schedule, planner, start=start, stop=stop, reorder=on, window_size=window, across_microbatches=across, progress=progress)


def _replay_all(schedule: Schedule, planner: Planner, settings: list[Setting], start: int, stop: int,
                tick: Callable[[int], None]) -> dict[Setting, GridReplay]:
    """Each setting's replay; large ones in worker processes, one per core (they are independent)."""
    consumed = max(schedule.end(stop) - start, 0)
    workers = min(len(settings), os.cpu_count() or 1)
    if workers < 2 or consumed < PARALLEL_FROM_MICROBATCHES:
        return {setting: _replay_one(schedule, planner, setting, start, stop, tick) for setting in settings}
    # Forked from the worker server, never from this process (which may hold threads).
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=worker_context()) as pool:
        futures = {setting: pool.submit(_replay_one, schedule, planner, setting, start, stop) for setting in settings}
        for future in concurrent.futures.as_completed(futures.values()):
            future.result()
            tick(consumed)
        return {setting: future.result() for setting, future in futures.items()}


WHAT_IF_LABELS = {NO_REORDER: "no reorder", PER_MICROBATCH: "per micro-batch"}


def what_if_label(name: str) -> str:
    """How the table and the plots name a what-if: ``across_window_4`` is "across 4"."""
    return WHAT_IF_LABELS.get(name, name.replace("across_window_", "across "))


def module_plot(analysis: Analysis, module: ModuleSpec, title: str) -> ModulePlot:
    """What ``module``'s PNG shows, in the quantity its ranks were balanced on."""
    from mimo_pipes.analysis.plot import ModulePlot, WhatIf

    quantity = analysis.balanced[module.name]
    block = analysis.figures[module.name] if quantity.block is None else analysis.figures[module.name][quantity.block]

    def loads(rows: np.ndarray) -> np.ndarray:
        return np.maximum(rank_loads(rows, quantity.values, module.dp), quantity.floor) / quantity.scale

    given = analysis.given_what_if()
    what_ifs = [
        WhatIf(what_if_label(name), figures["critical_path"] / quantity.scale, _scaled(block["critical_path_lower_bound"].get(name), quantity),
               name == given, name in analysis.incomplete)
        for name, figures in block["what_if"].items()
    ]
    on, window, across = analysis.given
    bound_window, bound_across = (window, across) if on else (1, False)  # reordering off: what per micro-batch balancing could reach
    bounds = critical_path_bounds(analysis.schedule, quantity.values, module.dp, start=analysis.start, stop=analysis.stop,
                                  window_size=bound_window, across_microbatches=bound_across, floor=quantity.floor)
    if given is None:
        what_ifs.append(WhatIf(f"given (window {window})", block["critical_path_after"] / quantity.scale,
                               None if bounds is None else sum(b for _, b in bounds) / quantity.scale, True,
                               on and cut_window(analysis.schedule, analysis.start, analysis.stop, window, across)))
    bound_name = f"across {window}" if on and across else "per micro-batch"
    return ModulePlot(
        title=f"{module.name} dp={module.dp}: {title}",
        unit=quantity.unit,
        integer=quantity.integer,
        steps=analysis.replay.steps,
        before=loads(analysis.unreordered.before),
        after=loads(analysis.replay.after),
        bound_steps=None if bounds is None else np.array([step for step, _ in bounds], dtype=np.int64),
        bound_path=None if bounds is None else np.cumsum([bound for _, bound in bounds]) / quantity.scale,
        bound_label=f"lower bound ({bound_name})" if bounds is not None else f"lower bound ({bound_name}): none, a window is cut by the steps",
        what_ifs=what_ifs,
    )


def _scaled(value: int | None, quantity: Quantity) -> float | None:
    return None if value is None else value / quantity.scale


def write_plots(out: Path, analysis: Analysis, topology: Topology, title: str) -> list[Path]:
    """One PNG per module: ``out/<module>.png``."""
    from mimo_pipes.analysis.plot import plot_module

    return [plot_module(out / f"{module.name}.png", module_plot(analysis, module, title)) for module in topology.modules]
