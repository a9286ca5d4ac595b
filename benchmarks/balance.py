"""Balancing benchmark: quality and planning time of the slot assignment on VLM-like cost mixes.

Run from the repository root:

    python benchmarks/balance.py            # full run, writes the "## Balancing" section of docs/benchmarks.md
    python benchmarks/balance.py --quick    # fewer instances, prints only

Methods compared on every micro-batch: the naive contiguous split, equal-count LPT (the anchor),
balanced Karmarkar-Karp alone, and the engine (``balance_microbatch``). Quality is the heaviest slot
relative to a reference: the proven optimum where the exact search finishes, otherwise the best
assignment known (the best of all methods and of a slower exhaustive three-slot search) together with
the lower bound, which brackets the optimum from below.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import platform
import statistics
import sys
import time
from dataclasses import replace

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _dist  # noqa: E402  (benchmarks/_dist.py)

from mimo_pipes.balance import balance_microbatch, balance_window, lpt_assignment, window_lower_bound  # noqa: E402
from mimo_pipes.balance.canonical import loads_of, sort_order  # noqa: E402
from mimo_pipes.balance.heuristics.karmarkar_karp import kk_members  # noqa: E402
from mimo_pipes.balance.heuristics.lpt import lpt_members  # noqa: E402
from mimo_pipes.balance.heuristics.refine import refine_members  # noqa: E402
from mimo_pipes.balance.microbatch import plan_indices  # noqa: E402
from mimo_pipes.balance.quality import sorted_lower_bound, window_path_bound  # noqa: E402
from mimo_pipes.balance.search.exact import exact_members, search_slots  # noqa: E402
from mimo_pipes.balance.search.window_search import search_window  # noqa: E402

DOCS = os.path.join(ROOT, "docs", "benchmarks.md")
SECTION = "## Balancing"

# ------------------------------------------------------------------ cost mixes
#
# Image tokens follow a 28-pixel patch grid (one placeholder token per 28x28 pixels after merging), as
# in Qwen2-VL-style processors; text tokens are the prompt and answer. A sample's cost is
# w_enc * image tokens + w_lang * real tokens (image placeholders + text).

PATCH = 28


def _grid(height, width):
    return (-(-height // PATCH)) * (-(-width // PATCH))


def _receipts(rng, n):  # tall narrow scans
    return _grid(rng.integers(600, 2001, n), rng.integers(300, 801, n)), rng.integers(50, 401, n)


def _documents(rng, n):  # full pages, capped at 4096 tokens by the processor's max_pixels
    tokens = np.minimum(_grid(rng.integers(1000, 2001, n), rng.integers(800, 1401, n)), 4096)
    return tokens, rng.integers(100, 1501, n)


def _charts(rng, n):
    side = rng.integers(400, 1001, n)
    return _grid(side, (side * rng.uniform(0.6, 1.6, n)).astype(np.int64)), rng.integers(50, 301, n)


def _photos(rng, n):
    return _grid(rng.integers(224, 1025, n), rng.integers(224, 1025, n)), rng.integers(20, 201, n)


def _text_only(rng, n):
    return np.zeros(n, dtype=np.int64), rng.integers(30, 2001, n)


def _multi_image(rng, n):  # 2 to 8 photos per sample
    counts = rng.integers(2, 9, n)
    tokens = np.array([int(_photos(rng, int(c))[0].sum()) for c in counts], dtype=np.int64)
    return tokens, rng.integers(50, 501, n)


def _bimodal(rng, n):  # thumbnails and maximum-resolution pages
    big = rng.random(n) < 0.2
    return np.where(big, rng.integers(3600, 4097, n), rng.integers(48, 81, n)), rng.integers(20, 101, n)


def _long_tail(rng, n):  # photos and screenshots of any size: log-normal area, capped like max_pixels
    area = np.exp(rng.normal(np.log(600 * 600), 1.0, n))
    aspect = np.exp(rng.normal(0.0, 0.5, n))
    height = np.sqrt(area * aspect).astype(np.int64) + 1
    width = (area / height).astype(np.int64) + 1
    return np.clip(_grid(height, width), 4, 16384), rng.integers(20, 401, n)


def _many_long_tail(rng, n):  # 1 to 12 such images per sample, most samples with few
    counts = np.minimum(rng.geometric(0.4, n), 12)
    tokens = np.array([int(_long_tail(rng, int(c))[0].sum()) for c in counts], dtype=np.int64)
    return tokens, rng.integers(50, 801, n)


KINDS = {
    "long tail": _long_tail,
    "many long tail": _many_long_tail,
    "receipts": _receipts,
    "documents": _documents,
    "charts": _charts,
    "photos": _photos,
    "text": _text_only,
    "multi": _multi_image,
    "bimodal": _bimodal,
}

# name: (kind shares, w_enc, w_lang)
MIXES = {
    "receipts": ({"receipts": 1.0}, 1, 0),
    "docs+charts": ({"documents": 0.6, "charts": 0.4}, 1, 0),
    "photos": ({"photos": 1.0}, 1, 0),
    "text+photos": ({"text": 0.5, "photos": 0.5}, 1, 0),
    "bimodal": ({"bimodal": 1.0}, 1, 0),
    "multi-image": ({"multi": 0.3, "photos": 0.5, "text": 0.2}, 1, 0),
    "general": (
        {"receipts": 0.15, "documents": 0.2, "charts": 0.1, "photos": 0.3, "multi": 0.1, "text": 0.15},
        1,
        0,
    ),
    "general 4:1": (
        {"receipts": 0.15, "documents": 0.2, "charts": 0.1, "photos": 0.3, "multi": 0.1, "text": 0.15},
        4,
        1,
    ),
}


# Heavy-tailed mixes for windows (with text-only samples, 0 image tokens, in three of them).
WINDOW_MIXES = {
    "long tail": ({"long tail": 1.0}, 1, 0),
    "long tail + text": ({"long tail": 0.6, "text": 0.4}, 1, 0),
    "many images + text": ({"many long tail": 0.7, "text": 0.3}, 1, 0),
    "long tail 4:1": ({"long tail": 0.7, "text": 0.3}, 4, 1),
}


def draw_costs(rng: np.random.Generator, mix: str, count: int) -> np.ndarray:
    shares, w_enc, w_lang = MIXES[mix] if mix in MIXES else WINDOW_MIXES[mix]
    names = list(shares)
    p = np.array([shares[name] for name in names], dtype=float)
    pick = rng.choice(len(names), size=count, p=p / p.sum())
    image = np.zeros(count, dtype=np.int64)
    text = np.zeros(count, dtype=np.int64)
    for i, name in enumerate(names):
        where = np.flatnonzero(pick == i)
        if where.size:
            image[where], text[where] = KINDS[name](rng, where.size)
    return w_enc * image + w_lang * (image + text)


# ------------------------------------------------------------------ reference (slow, benchmark only)


def _three_slot_search(sorted_costs, members, lower, node_budget=150_000, nodes_per_try=5_000):
    """Three-slot re-partition, exhaustive over partner pairs: the heaviest slot with every pair of
    other slots, repeated while it helps, within a total node budget."""
    members = members.copy()
    num_slots, per_slot = members.shape
    if num_slots < 3:
        return members
    cost_of = sorted_costs.tolist()
    budget = node_budget
    while budget > 0:
        loads = loads_of(sorted_costs, members)
        top = int(loads.max())
        if top <= lower:
            break
        heaviest = int(np.argmax(loads))
        load_list, rows = loads.tolist(), members.tolist()
        others = [s for s in range(num_slots) if s != heaviest]
        for a, b in itertools.combinations(others, 2):
            budget -= 1
            if budget <= 0:
                break
            if -(-(top + load_list[a] + load_list[b]) // 3) >= top:
                continue
            ranks = sorted(rows[heaviest] + rows[a] + rows[b])
            pooled = [cost_of[r] for r in ranks]
            found, _, _, used = search_slots(pooled, 3, top, lower, min(nodes_per_try, budget))
            budget -= used
            if found is not None:
                new_rows = [[], [], []]
                for rank, slot in zip(ranks, found):
                    new_rows[slot].append(rank)
                members[[heaviest, a, b]] = np.asarray(new_rows)
                members = refine_members(sorted_costs, members, target=lower, max_rounds=50)
                break
        else:
            break
    return members


def reference(sorted_costs, num_slots, candidates, exact_nodes, search):
    """(best heaviest load known, proven optimal, lower bound)."""
    lower = sorted_lower_bound(sorted_costs, num_slots)
    best_members = min(candidates, key=lambda m: int(loads_of(sorted_costs, m).max()))
    best = int(loads_of(sorted_costs, best_members).max())
    if best > lower and search and num_slots >= 3:
        improved = _three_slot_search(sorted_costs, best_members, lower)
        best = min(best, int(loads_of(sorted_costs, improved).max()))
    proven = best <= lower
    if not proven and exact_nodes:
        result = exact_members(sorted_costs, num_slots, incumbent=best, lower=lower, node_limit=exact_nodes)
        best, proven = result.best, result.proven
    return best, proven, lower


# ------------------------------------------------------------------ utilities


def machine() -> str:
    return (
        f"`nproc` {_dist.cpu_count()}, CPU \"{_dist.cpu_model()}\", Python {platform.python_version()}, "
        f"numpy {np.__version__}, {platform.system()} {platform.machine()}"
    )


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cpu_median_us(fn, repeats: int) -> float:
    """Median CPU time of one call in microseconds (process time: robust on shared cores)."""
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.process_time_ns()
        fn()
        samples.append(time.process_time_ns() - start)
    return statistics.median(samples) / 1000.0


def pct(values) -> str:
    return f"{100 * statistics.fmean(values):.3f} / {100 * max(values):.2f}"


# ------------------------------------------------------------------ experiments

GROUPS = (2, 4, 8, 16, 32, 64)


def microbatch_quality(reps: int, seed: int, exact_max: int, exact_nodes: int, search_max: int):
    rng = np.random.default_rng(seed)
    rows = []
    overall = {name: [] for name in ("naive", "lpt", "kk", "ours")}
    overall_proven = {name: [] for name in overall}
    spreads = {name: [] for name in overall}
    counts = {"instances": 0, "proven": 0, "ours_optimal_or_best": 0, "ours_worse_than_lpt": 0}
    for num_slots in GROUPS:
        for per_slot in range(1, 9):
            size = num_slots * per_slot
            gaps = {name: [] for name in overall}
            lb_gaps = []
            times = []
            proven_here = 0
            started = time.perf_counter()
            for mix in MIXES:
                for _ in range(reps):
                    costs = draw_costs(rng, mix, size)
                    order = sort_order(costs)
                    sorted_costs = costs[order]
                    # Rank-space assignments for the reference search, index-space for the figures.
                    naive = np.arange(size).reshape(num_slots, per_slot)
                    lpt = lpt_members(sorted_costs, num_slots)
                    kk = kk_members(sorted_costs, num_slots)
                    started_ns = time.process_time_ns()
                    ours_idx = plan_indices(costs, num_slots)
                    times.append((time.process_time_ns() - started_ns) / 1e6)
                    inverse = np.empty(size, dtype=np.int64)
                    inverse[order] = np.arange(size)
                    ours = inverse[ours_idx]
                    naive_ranks = inverse[naive]
                    loads = {
                        "naive": loads_of(costs, naive),
                        "lpt": loads_of(sorted_costs, lpt),
                        "kk": loads_of(sorted_costs, kk),
                        "ours": loads_of(costs, ours_idx),
                    }
                    best, proven, lower = reference(
                        sorted_costs,
                        num_slots,
                        [naive_ranks, lpt, kk, ours],
                        exact_nodes if size <= exact_max else 0,
                        size <= search_max,
                    )
                    counts["instances"] += 1
                    counts["proven"] += proven
                    proven_here += proven
                    ours_top = int(loads["ours"].max())
                    counts["ours_optimal_or_best"] += ours_top == best
                    lpt_key = (int(loads["lpt"].max()), int(loads["lpt"].max() - loads["lpt"].min()))
                    ours_key = (ours_top, int(ours_top - loads["ours"].min()))
                    counts["ours_worse_than_lpt"] += ours_key > lpt_key
                    for name, values in loads.items():
                        gap = int(values.max()) / best - 1 if best else 0.0
                        gaps[name].append(gap)
                        overall[name].append(gap)
                        if proven:
                            overall_proven[name].append(gap)
                        spreads[name].append(int(values.max() - values.min()) / best if best else 0.0)
                    lb_gaps.append(ours_top / lower - 1 if lower else 0.0)
            rows.append((num_slots, per_slot, size, gaps, lb_gaps, proven_here, times))
            progress(
                f"  G={num_slots:2d} B/G={per_slot} B={size:3d}: ours {pct(gaps['ours'])} % above best, "
                f"LPT {pct(gaps['lpt'])} %, proven {proven_here}/{len(lb_gaps)} "
                f"({time.perf_counter() - started:.1f} s)"
            )
    return rows, overall, overall_proven, spreads, counts


def window_quality(reps: int, seed: int, window: int):
    rng = np.random.default_rng(seed)
    rows = []
    for num_slots in GROUPS:
        for per_slot in (1, 2, 4, 8):
            size = num_slots * per_slot
            ratios = {name: [] for name in ("naive", "lpt", "ours", "across", "across_lb")}
            for mix in MIXES:
                for _ in range(reps):
                    costs = np.stack([draw_costs(rng, mix, size) for _ in range(window)])
                    mean = costs.sum() / num_slots
                    naive = sum(int(row.reshape(num_slots, per_slot).sum(axis=1).max()) for row in costs)
                    lpt = 0
                    for row in costs:
                        order = sort_order(row)
                        lpt += int(loads_of(row[order], lpt_members(row[order], num_slots)).max())
                    ours = sum(int(loads_of(row, plan_indices(row, num_slots)).max()) for row in costs)
                    plan = balance_window(costs.tolist(), num_slots, across_microbatches=True)
                    flat = costs.reshape(-1)
                    across = sum(max(int(flat[s].sum()) for s in mb) for mb in plan)
                    bound = window_lower_bound(costs.tolist(), num_slots)
                    ratios["naive"].append(naive / mean)
                    ratios["lpt"].append(lpt / mean)
                    ratios["ours"].append(ours / mean)
                    ratios["across"].append(across / mean)
                    ratios["across_lb"].append(across / bound)
            rows.append((num_slots, per_slot, ratios))
            progress(
                f"  window W={window} G={num_slots:2d} B/G={per_slot}: across "
                f"{statistics.fmean(ratios['across']):.3f}x of sum/G, LPT {statistics.fmean(ratios['lpt']):.3f}x"
            )
    return rows


def timings(seed: int, repeats: int):
    """Median CPU times per mix, each with the 1-minute load average read right after it."""
    rng = np.random.default_rng(seed)
    out = {}
    mixes = ["general", "docs+charts", "text+photos", "bimodal"]
    for mix in mixes:
        costs = draw_costs(rng, mix, 512).tolist()
        window = [draw_costs(rng, mix, 512).tolist() for _ in range(8)]
        array = np.asarray(costs, dtype=np.int64)
        order = sort_order(array)
        sorted_costs = array[order]
        # A time model's floor: 0.8x the mean slot load, as in the comparison with best known plans.
        floor = int(sum(map(sum, window)) / (len(window) * 64) * 0.8)
        row = {"ours": cpu_median_us(lambda: balance_microbatch(costs, 64), repeats)}
        row["load_ours"] = os.getloadavg()[0]
        row["lpt"] = cpu_median_us(lambda: lpt_members(sorted_costs, 64), repeats)
        row["kk"] = cpu_median_us(lambda: kk_members(sorted_costs, 64), repeats)
        few = max(5, repeats // 4)
        row["window_across"] = cpu_median_us(lambda: balance_window(window, 64, True), few)
        row["window_floor"] = cpu_median_us(lambda: balance_window(window, 64, True, floor=floor), few)
        row["window_each"] = cpu_median_us(lambda: balance_window(window, 64, False), few)
        row["load_windows"] = os.getloadavg()[0]
        out[mix] = row
        progress(
            f"  timing {mix}: 512/64 {row['ours']:.0f} us (load {row['load_ours']:.1f}), window 8x512/64 across "
            f"{row['window_across'] / 1000:.1f} ms, with a floor {row['window_floor'] / 1000:.1f} ms "
            f"(load {row['load_windows']:.1f})"
        )
    return out


# ------------------------------------------------------------------ report


def _floored_path(flat, plan, floor):
    return sum(max(floor, max(int(sum(flat[i] for i in slot)) for slot in slots)) for slots in plan)


# Window shapes (W micro-batches, G slots, B/G per slot): B from 8 to 512, G from 2 to 64. The first
# ones have at most 64 samples, where the planner ends with its branch and bound.
WINDOW_SHAPES = [
    (4, 4, 2), (4, 8, 2), (2, 8, 2), (2, 16, 2), (8, 4, 2), (2, 4, 3), (4, 4, 3), (2, 4, 4), (4, 2, 4),
    (8, 2, 4), (2, 2, 8), (4, 4, 4), (2, 8, 4),
    (4, 16, 2), (8, 16, 2), (4, 32, 2), (8, 64, 2), (8, 8, 4), (2, 32, 4), (8, 16, 1), (4, 32, 3),
    (8, 32, 4), (4, 64, 8), (8, 64, 8),
]
# The reference search: the same branch and bound with this budget (placements), on windows up to
# REFERENCE_MAX_SAMPLES samples; it proves most windows of up to 64 samples optimal.
REFERENCE_NODES = 300_000
REFERENCE_MAX_SAMPLES = 128


def _floored_path(flat, plan, floor):
    return sum(max(floor, max(int(sum(flat[i] for i in slot)) for slot in slots)) for slots in plan)


def lpt_window_path(costs, num_slots, floor):
    """Critical path of per-micro-batch LPT: every micro-batch balanced where it stands."""
    return sum(max(floor, max(sum(row[i] for i in slot) for slot in lpt_assignment(row, num_slots))) for row in costs)


def long_planner_path(costs, num_slots, floor):
    """The planner with 50x its budgets and every size gate open (a search of the same family)."""
    from mimo_pipes.balance.window.tuning import TUNING

    names = ("max_moves", "max_work", "fill_max_samples", "near_bound", "search_max_samples")
    longer = {name: getattr(TUNING, name) * 50 for name in names}
    # The reference's own branch and bound runs separately.
    tuning = replace(TUNING, **longer, exact_max_samples=0)
    flat = [c for row in costs for c in row]
    return _floored_path(flat, balance_window(costs, num_slots, True, floor=floor, tuning=tuning), floor)


def window_reference(costs, num_slots, floor, known):
    """(best critical path known, proven optimal, lower bound) for a window: the branch and bound with
    a large budget from the best plan known, on windows small enough; otherwise (and where it does not
    finish) also the planner with 50x its budgets."""
    from window_exact import MAX_SAMPLES, exact_window_path

    count = len(costs)
    flat = sorted((c for row in costs for c in row), reverse=True)
    lower = window_path_bound(np.asarray(flat, dtype=np.int64), count, num_slots, floor)
    best, proven = known, known <= lower
    if not proven and len(flat) <= REFERENCE_MAX_SAMPLES and len(flat) // (count * num_slots) > 1:
        result = search_window(flat, count, num_slots, floor, best, lower, REFERENCE_NODES)
        best, proven = min(best, result.best), result.proven
    if not proven:
        best = min(best, long_planner_path(costs, num_slots, floor))
        proven = best <= lower
    if len(flat) <= MAX_SAMPLES:  # every partition enumerated: an independent check of the proofs
        exact = exact_window_path(costs, num_slots, floor)
        assert exact == best or not proven, (costs, num_slots, floor, exact, best)
        best, proven = exact, True
    return best, proven, lower


def windows_vs_best(seed: int, reps: int):
    """The across-micro-batch planner on windows of every shape against the optimum where it is proven,
    otherwise the best plan known; and against per-micro-batch LPT."""
    rng = np.random.default_rng(seed)
    mixes = list(WINDOW_MIXES) + ["bimodal", "general", "text+photos", "docs+charts"]
    rows = []
    for count, slots, per_slot in WINDOW_SHAPES:
        size = slots * per_slot
        row = {"gap": [], "bound": [], "lpt": [], "proven": 0, "worse_than_lpt": 0, "ms": []}
        for mix in mixes:
            for _ in range(reps):
                for floor_share in (0.0, 0.8):
                    costs = [draw_costs(rng, mix, size).tolist() for _ in range(count)]
                    flat = [c for r in costs for c in r]
                    # The linear cost (no floor), and a time model whose light forwards pay a floor.
                    floor = int(sum(flat) / (count * slots) * floor_share)
                    started = time.process_time_ns()
                    plan = balance_window(costs, slots, True, floor=floor)
                    row["ms"].append((time.process_time_ns() - started) / 1e6)
                    path = _floored_path(flat, plan, floor)
                    lpt = lpt_window_path(costs, slots, floor)
                    best, proven, lower = window_reference(costs, slots, floor, min(path, lpt))
                    row["gap"].append(path / max(best, 1) - 1)
                    row["bound"].append(path / max(lower, 1) - 1)
                    row["lpt"].append(lpt / max(best, 1) - 1)
                    row["proven"] += proven
                    row["worse_than_lpt"] += path > lpt
        rows.append((count, slots, per_slot, row))
        progress(
            f"  W={count} G={slots} B/G={per_slot}: {pct(row['gap'])} % above best known, proven "
            f"{row['proven']}/{len(row['gap'])}, LPT {pct(row['lpt'])} %, {statistics.median(row['ms']):.1f} ms"
        )
    return rows, mixes


def render_windows_vs_best(rows, mixes, reps: int) -> list[str]:
    lines = [
        "| W | G | B/G | samples | windows | proven optimal | this planner: % above best known, average / worst "
        "| above the lower bound | per-micro-batch LPT | planner ms, median / max |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    every = {"gap": [], "lpt": [], "proven": 0, "worse": 0, "small": [], "small_proven": 0}
    for count, slots, per_slot, row in rows:
        samples = count * slots * per_slot
        lines.append(
            f"| {count} | {slots} | {per_slot} | {samples} | {len(row['gap'])} | {row['proven']} | "
            f"**{pct(row['gap'])}** | {pct(row['bound'])} | {pct(row['lpt'])} | "
            f"{statistics.median(row['ms']):.1f} / {max(row['ms']):.1f} |"
        )
        every["gap"] += row["gap"]
        every["lpt"] += row["lpt"]
        every["proven"] += row["proven"]
        every["worse"] += row["worse_than_lpt"]
        if samples <= 64:
            every["small"] += row["gap"]
            every["small_proven"] += row["proven"]
    gaps = every["gap"]
    lines.append(
        f"| all | | | | {len(gaps)} | {every['proven']} | **{pct(gaps)}** | | {pct(every['lpt'])} | |"
    )
    lines += [
        "",
        f"{reps} window(s) per mix and floor, {len(mixes)} mixes ({', '.join(mixes)}), each with floor 0 (the",
        "linear cost) and with a floor of 0.8x the mean slot load (a time model whose light forwards pay it).",
        f"{len(gaps)} windows: {every['proven']} proven optimal; {sum(g > 0.03 for g in gaps)} more than 3% above the "
        f"best known, {sum(g > 0.01 for g in gaps)} more than 1%; worse than per-micro-batch LPT: {every['worse']}. "
        f"Windows of at most 64 samples: {pct(every['small'])} % above the best known, "
        f"{every['small_proven']} of {len(every['small'])} proven optimal.",
    ]
    return lines


def render_windows(window: int, windows) -> list[str]:
    """The "Windows of W micro-batches" part: per (G, B/G) and over all windows."""
    lines = [
        f"### Windows of {window} micro-batches",
        "",
        "Critical path (sum over the window's micro-batches of the heaviest slot) divided by",
        "sum(all costs)/G, average / worst; `across` = `balance_window(..., across_microbatches=True)`;",
        "the last column is `across` against the window lower bound.",
        "",
        "| G | B/G | naive | LPT per micro-batch | ours per micro-batch | across | across vs lower bound |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    every = {name: [] for name in ("naive", "lpt", "ours", "across", "across_lb")}
    for num_slots, per_slot, ratios in windows:
        for name in every:
            every[name] += ratios[name]

        def cell(name, ratios=ratios):
            return f"{statistics.fmean(ratios[name]):.3f} / {max(ratios[name]):.3f}"

        lines.append(
            f"| {num_slots} | {per_slot} | {cell('naive')} | {cell('lpt')} | {cell('ours')} | "
            f"**{cell('across')}** | {cell('across_lb')} |"
        )
    multi = [r for r in windows if r[1] > 1]
    across_multi = [x for r in multi for x in r[2]["across"]]
    lpt_multi = [x for r in multi for x in r[2]["lpt"]]
    return lines + [
        "",
        "All windows: " + ", ".join(
            f"{label} {statistics.fmean(every[name]):.3f}x"
            for name, label in (("naive", "naive"), ("lpt", "LPT"), ("ours", "ours per micro-batch"),
                                ("across", "across"))
        )
        + f" of sum/G; across {statistics.fmean(every['across_lb']):.3f}x of the lower bound. With B/G >= 2: "
        f"across {statistics.fmean(across_multi):.3f}x, LPT {statistics.fmean(lpt_multi):.3f}x.",
    ]


def render(args, micro, windows, best_rows, times, elapsed: float) -> str:
    rows, overall, overall_proven, spreads, counts = micro
    lines = [SECTION, ""]
    lines += [
        "What it measures: how evenly one micro-batch is split over G canonical slots of B/G samples",
        "(heaviest slot, then spread), and the vision critical path of a window of micro-batches (sum over",
        "its micro-batches of the heaviest slot). Costs are drawn from VLM-like mixes (receipts, documents",
        "and charts, photos, text-only with 0 image tokens, thumbnails vs. full pages, multi-image samples,",
        "a general mix, and the general mix costed 4:1 encoder:language); image tokens run from 0 to about",
        "10 000 per sample. Methods: `naive` = contiguous split (slot s = samples s*B/G ..), `LPT` =",
        "equal-count greedy LPT (the published anchor), `KK` = balanced Karmarkar-Karp alone, `ours` =",
        "`balance_microbatch` (see docs/balancing.md).",
        "",
        "Command (repository root, project virtual environment):",
        "",
        f"    {args.command_line}",
        "",
        f"Machine: {machine()}; cores shared with other work. Date: {datetime.date.today().isoformat()}. "
        f"Run time {elapsed / 60:.1f} min; load average (1 min) {args.load_start:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end (timings scale with it).",
        "",
        "### One micro-batch",
        "",
        f"{len(MIXES)} mixes x {args.reps} micro-batches per (G, B/G), {counts['instances']} in all. The",
        "reference is the exact optimum where the exact search proves it "
        f"({counts['proven']} of {counts['instances']}), otherwise the best",
        "assignment known (best of all methods and of an exhaustive three-slot search); the last column",
        "gives ours against the lower bound, which brackets the optimum from below. Cells: average / worst",
        "% above the reference. The time column is the CPU time of the engine alone (`plan_indices`: no",
        "input checks, no output lists) for these micro-batches.",
        "",
        "| G | B/G | B | naive | LPT | KK | ours | ours vs lower bound | proven optimal | ours ms, median / max |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for num_slots, per_slot, size, gaps, lb_gaps, proven, row_times in rows:
        lines.append(
            f"| {num_slots} | {per_slot} | {size} | {pct(gaps['naive'])} | {pct(gaps['lpt'])} | "
            f"{pct(gaps['kk'])} | **{pct(gaps['ours'])}** | {pct(lb_gaps)} | {proven}/{len(lb_gaps)} | "
            f"{statistics.median(row_times):.2f} / {max(row_times):.1f} |"
        )
    lines += [
        "",
        "Summary over all micro-batches (average / worst % above the reference; spread as % of it):",
        "",
        "| method | all | proven-optimal instances only | spread |",
        "|---|---:|---:|---:|",
    ]
    for name, label in (("naive", "naive"), ("lpt", "LPT"), ("kk", "KK"), ("ours", "ours")):
        lines.append(
            f"| {label} | {pct(overall[name])} | {pct(overall_proven[name])} | "
            f"{100 * statistics.fmean(spreads[name]):.2f} avg |"
        )
    lines += [
        "",
        f"Ours reaches the reference in {counts['ours_optimal_or_best']} of {counts['instances']} micro-batches "
        f"and is worse than LPT by (heaviest, spread) in {counts['ours_worse_than_lpt']}.",
        "",
    ]
    lines += render_windows(args.window, windows)
    every = {name: [x for _, _, ratios in windows for x in ratios[name]] for name in ("across", "lpt")}
    lines += [
        "",
        "### Windows across micro-batches against exact optima",
        "",
        "Every window's critical path (sum over its micro-batches of max(floor, heaviest slot)) from",
        "`balance_window(..., across_microbatches=True, floor=...)`, against the optimum where it is proven",
        f"(the branch and bound of `window_search` with {REFERENCE_NODES:,} placements from the best plan known",
        "and the window path bound, on windows of at most "
        f"{REFERENCE_MAX_SAMPLES} samples; windows of at most 16 samples also by",
        "enumerating every partition, `benchmarks/window_exact.py`, which agrees with every proof), otherwise",
        "the best plan known (that search where it ran, and the planner with 50x its budgets and every size",
        "gate open). Where the optimum is not proven the true gap can be larger; the lower-bound column caps",
        "it. The planner time is the CPU time of one call per window.",
        "",
    ]
    lines += render_windows_vs_best(*best_rows, args.best_reps)
    lines += [
        "",
        "### Planning time",
        "",
        f"Median CPU time of one call (process time, {args.repeats} calls), B = 512 over G = 64, and a window",
        "of 8 such micro-batches (across micro-batches without and with a floor of 0.8x the mean slot load);",
        "`ours` includes input checks and the canonical output lists. The load columns are the 1-minute load",
        "average read right after the timings of that row (the cores are shared).",
        "",
        "| mix | ours 512/64 | load | LPT alone | KK alone | window 8x512/64, across | across, floor 0.8x mean slot "
        "| window 8x512/64, each | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mix, t in times.items():
        lines.append(
            f"| {mix} | {t['ours']:.0f} us | {t['load_ours']:.1f} | {t['lpt']:.0f} us | {t['kk']:.0f} us | "
            f"{t['window_across'] / 1000:.2f} ms | {t['window_floor'] / 1000:.2f} ms | {t['window_each'] / 1000:.2f} ms "
            f"| {t['load_windows']:.1f} |"
        )
    ours_all = overall["ours"]
    worst_single = max(t["ours"] for t in times.values())
    worst_window = max(max(t["window_across"], t["window_floor"]) for t in times.values()) / 1000
    loads = [t[key] for t in times.values() for key in ("load_ours", "load_windows")]
    best_table = best_rows[0]
    all_gaps = [g for *_, row in best_table for g in row["gap"]]
    small_gaps = [g for count, slots, per_slot, row in best_table if count * slots * per_slot <= 64 for g in row["gap"]]
    proven_all = sum(row["proven"] for *_, row in best_table)
    worse_lpt = sum(row["worse_than_lpt"] for *_, row in best_table)
    lines += [
        "",
        "Reading it:",
        "",
        f"- One micro-batch: ours is {100 * statistics.fmean(ours_all):.3f}% above the reference on average "
        f"and {100 * max(ours_all):.2f}% on the worst micro-batch (targets 0.1% and 1%), against "
        f"{100 * statistics.fmean(overall['lpt']):.2f}% / {100 * max(overall['lpt']):.1f}% for LPT. Where "
        "the optimum is not proven, the reference is only the best assignment known, so the true gap "
        "can be larger; the lower-bound column caps it from above.",
        f"- Windows against exact optima: {pct(all_gaps)} % above the best known over {len(all_gaps)} windows "
        f"(targets 0.2% / 3%), {proven_all} proven optimal, {sum(g > 0.03 for g in all_gaps)} more than 3% above; "
        f"windows of at most 64 samples {pct(small_gaps)} %. Never worse than per-micro-batch LPT: "
        f"{worse_lpt} windows worse.",
        f"- Windows: across micro-batches the critical path is {statistics.fmean(every['across']):.3f}x "
        f"sum/G on average (target 1.10x), against {statistics.fmean(every['lpt']):.2f}x for LPT per "
        "micro-batch. With one sample per slot the lower bound itself is well above sum/G: a micro-batch "
        "is never lighter than its heaviest sample.",
        f"- Time: at most {worst_single:.0f} us for 512 samples over 64 slots (target 1 ms) and "
        f"{worst_window:.1f} ms for a window of 8 of them (target 10 ms), medians over the mixes above, at a "
        f"load average of {min(loads):.1f} to {max(loads):.1f}. CPU time of a single thread; the cores are shared, "
        "so wall time can be higher under load.",
        "",
    ]
    return "\n".join(lines)


def write_section(text: str) -> None:
    if os.path.exists(DOCS):
        with open(DOCS) as handle:
            current = handle.read()
    else:
        current = "# Benchmarks\n"
    lines = current.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == SECTION), None)
    if start is None:
        body = current.rstrip("\n") + "\n\n" + text
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        tail = "".join(lines[end:])
        body = "".join(lines[:start]) + text + ("\n" + tail if tail else "")
    with open(DOCS, "w") as handle:
        handle.write(body.rstrip("\n") + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=4, help="micro-batches per mix and (G, B/G)")
    parser.add_argument("--window-reps", type=int, default=2, help="windows per mix and (G, B/G)")
    parser.add_argument("--best-reps", type=int, default=1,
                        help="windows per mix, shape and floor compared with exact optima / best known plans")
    parser.add_argument("--window", type=int, default=8, help="micro-batches per window")
    parser.add_argument("--repeats", type=int, default=41, help="timed calls per timing")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--exact-max", type=int, default=32, help="largest B given the long exact search")
    parser.add_argument("--exact-nodes", type=int, default=50_000, help="node budget of that search")
    parser.add_argument("--search-max", type=int, default=512, help="largest B given the three-slot search")
    parser.add_argument("--quick", action="store_true", help="1 micro-batch per mix, no docs update")
    parser.add_argument("--no-write", action="store_true", help="print the section instead of writing it")
    parser.add_argument("--windows-only", action="store_true",
                        help="only the table of windows of --window micro-batches (the section's seed); print it")
    parser.add_argument("--windows-vs-exact", action="store_true",
                        help="only compare the across-micro-batch planner with exact optima / best known plans, "
                        "and time it; print the table")
    args = parser.parse_args()
    if args.windows_only:
        print("\n".join(render_windows(args.window, window_quality(args.window_reps, args.seed + 1, args.window))))
        return 0
    if args.windows_vs_exact:
        rows = windows_vs_best(args.seed + 3, args.best_reps)
        print("\n".join(render_windows_vs_best(*rows, args.best_reps)))
        progress("timing ...")
        for mix, row in timings(args.seed + 2, args.repeats).items():
            print(f"{mix}: 512/64 {row['ours']:.0f} us (load {row['load_ours']:.1f}), window 8x512/64 across "
                  f"{row['window_across'] / 1000:.1f} ms, with a floor {row['window_floor'] / 1000:.1f} ms "
                  f"(load {row['load_windows']:.1f})")
        return 0
    if args.quick:
        args.reps, args.window_reps, args.repeats, args.no_write = 1, 1, 11, True
        global WINDOW_SHAPES
        WINDOW_SHAPES = WINDOW_SHAPES[::4]
    args.command_line = "python benchmarks/balance.py" + "".join(f" {a}" for a in sys.argv[1:])
    started = time.perf_counter()
    args.load_start = os.getloadavg()[0]
    # Timings first: the quality runs below take minutes, and the machine's load changes over them.
    progress("planning time ...")
    times = timings(args.seed + 2, args.repeats)
    progress("micro-batch quality ...")
    micro = microbatch_quality(args.reps, args.seed, args.exact_max, args.exact_nodes, args.search_max)
    progress("window critical path ...")
    windows = window_quality(args.window_reps, args.seed + 1, args.window)
    progress("windows against exact optima ...")
    best_rows = windows_vs_best(args.seed + 3, args.best_reps)
    text = render(args, micro, windows, best_rows, times, time.perf_counter() - started)
    if args.no_write:
        print(text)
    else:
        write_section(text)
        progress(f"wrote {SECTION!r} in {os.path.relpath(DOCS, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
