"""The across-micro-batch planner on mixed text-and-image windows against a proving MILP solver
(docs/benchmarks.md, "Mixed text-and-image windows").

Windows (``tests/helpers/mixed_windows.py``): W 2-6 micro-batches, G 4-16 slots, 1-3 samples per slot,
30-45% text-only samples (cost 0), image costs of ~60-1300 with repeats (a few resolutions, a pool from a
continuous range, or both), half with a floor of 0.5-1.1x the mean slot load; plus windows of the reported
shape (4 x 16 over 8 slots, no floor). The reference is scipy's MILP (HiGHS) over counts of each cost per
slot (the planner's plan is no input to it); it proves the optimum or stops at ``--time-limit`` seconds,
when the best of its incumbent and the planner's plan is the reference and its dual bound is reported.
Without scipy the windows of at most 16 samples are solved by enumeration and the rest against
``window_path_bound`` only.

    python benchmarks/window_mixed.py [--windows 40] [--reported 30] [--seed 202] [--time-limit 10] [--milp-cache F]

"Without levels" is the planner with ``WindowTuning.levels_max_samples`` 0 (as it was before its search over
levels), timed side by side with it on every window (CPU time of one call). ``--milp-cache`` keeps the MILP's
results in a JSON file (by seed, window and time limit) so that a second run does not solve them again.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "helpers"), os.path.dirname(os.path.abspath(__file__))]

from mixed_windows import draw_window, path_of, reported_window  # noqa: E402

from mimo_pipes.balance import balance_window  # noqa: E402
from mimo_pipes.balance.quality import window_path_bound  # noqa: E402
from mimo_pipes.balance.window.tuning import TUNING  # noqa: E402

MAX_PATTERNS = 150_000  # windows whose slot contents come in more kinds are not given to the MILP


def milp_path(costs: list[list[int]], num_slots: int, floor: int, time_limit: float) -> tuple[int | None, int, bool]:
    """(best path found or None, proven lower bound, proven optimal) by a MILP over slot patterns.

    A pattern is a multiset of k costs (a slot's contents); x[p] counts the slots of pattern p. Sorting
    the W*G slots heaviest first and cutting them into runs of G is the best grouping, so micro-batch m
    costs the (mG+1)-th heaviest slot, and the path is W*floor plus, for every load level v above the
    floor, (v - previous level) times N[v] = ceil(slots of load >= v / G), the micro-batches whose top
    reaches v. The MILP takes N[v] as integers with G*N[v] >= the slots of load >= v (cumulated level by
    level): no labels, so none of the symmetry of slot or micro-batch numbers."""
    import itertools

    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    flat = [c for row in costs for c in row]
    count = len(costs)
    bins = count * num_slots
    per_bin = len(flat) // bins
    values, counts = np.unique(np.asarray(flat, dtype=np.int64), return_counts=True)
    lower = window_path_bound(np.sort(np.asarray(flat, dtype=np.int64))[::-1], count, num_slots, floor)
    types = values.shape[0]
    patterns = []
    for combo in itertools.combinations_with_replacement(range(types), per_bin):
        used = np.bincount(combo, minlength=types)
        if (used <= counts).all():
            patterns.append(used)
        if len(patterns) > MAX_PATTERNS:
            return None, lower, False
    use = np.asarray(patterns, dtype=np.int64)  # (P, types)
    loads = use @ values
    levels = np.unique(loads[loads > floor])  # ascending
    n_p, n_l = use.shape[0], levels.shape[0]
    # Variables: x[p] (P), s[l] = slots of load >= levels[l] (L), N[l] (L).
    n_vars = n_p + 2 * n_l
    rows, cols, data, lo, hi = [], [], [], [], []
    r = 0
    for t in range(types):  # every sample once
        nz = np.flatnonzero(use[:, t])
        rows += [r] * nz.size
        cols += nz.tolist()
        data += use[nz, t].tolist()
        lo.append(counts[t]), hi.append(counts[t])
        r += 1
    level_of = np.searchsorted(levels, loads)  # patterns of load == levels[v]: level_of == v (and load > floor)
    for v in range(n_l):  # s[v] = s[v+1] + slots of load == levels[v]
        members = np.flatnonzero((loads > floor) & (level_of == v))
        rows += [r] * (members.size + 1)
        cols += members.tolist() + [n_p + v]
        data += [1] * members.size + [-1]
        if v + 1 < n_l:
            rows.append(r), cols.append(n_p + v + 1), data.append(1)
        lo.append(0), hi.append(0)
        r += 1
        rows += [r, r]  # G * N[v] >= s[v]
        cols += [n_p + n_l + v, n_p + v]
        data += [num_slots, -1]
        lo.append(0), hi.append(np.inf)
        r += 1
    matrix = coo_matrix((data, (rows, cols)), shape=(r, n_vars)).tocsr()
    objective = np.zeros(n_vars)
    objective[n_p + n_l :] = np.diff(np.concatenate(([floor], levels)))
    upper = np.concatenate([np.full(n_p, float(bins)), np.full(n_l, float(bins)), np.full(n_l, float(count))])
    constraints = [LinearConstraint(matrix, lo, hi), LinearConstraint(np.concatenate([np.ones(n_p), np.zeros(2 * n_l)])[None, :], bins, bins)]
    result = milp(
        objective, constraints=constraints, integrality=np.ones(n_vars), bounds=Bounds(np.zeros(n_vars), upper),
        options={"time_limit": time_limit, "mip_rel_gap": 0.0, "disp": False},
    )
    base = count * floor
    best = base + int(round(result.fun)) if result.x is not None else None
    dual = getattr(result, "mip_dual_bound", None)
    dual = lower if dual is None or not np.isfinite(dual) else max(lower, base + int(np.ceil(dual - 1e-6)))
    return best, dual, result.status == 0


def _planned(costs: list[list[int]], slots: int, floor: int, levels: bool) -> tuple[int, float]:
    """(critical path, CPU ms) of the planner, with or without its search over levels."""
    tuning = TUNING if levels else replace(TUNING, levels_max_samples=0)
    started = time.process_time_ns()
    plan = balance_window(costs, slots, True, floor=floor, tuning=tuning)
    ms = (time.process_time_ns() - started) / 1e6
    return path_of([c for row in costs for c in row], plan, floor), ms


def _reference(costs: list[list[int]], slots: int, floor: int, time_limit: float, cache: dict, key: str) -> tuple:
    """(best path or None, dual bound, proven) of the MILP, from ``cache`` when it holds ``key``."""
    if key not in cache:
        try:
            cache[key] = milp_path(costs, slots, floor, time_limit)
        except ImportError:
            flat = np.sort(np.asarray([c for row in costs for c in row]))[::-1]
            return None, window_path_bound(flat, len(costs), slots, floor), False
    return tuple(cache[key])


def evaluate(windows: int, reported: int, seed: int, time_limit: float, progress=None, cache: dict | None = None) -> dict:
    rng = np.random.default_rng(seed)
    rows = []
    cache = {} if cache is None else cache
    cases = [draw_window(rng) for _ in range(windows)] + [reported_window(rng) for _ in range(reported)]
    for number, (costs, slots, floor, info) in enumerate(cases):
        before, before_ms = _planned(costs, slots, floor, levels=False)
        path, ms = _planned(costs, slots, floor, levels=True)
        best, dual, proven = _reference(costs, slots, floor, time_limit, cache, f"{seed}/{number}/{time_limit:g}")
        reference = min(path, before, best if best is not None else path)
        rows.append({**info, "costs": costs, "slots": slots, "path": path, "before": before, "best": reference,
                     "dual": dual, "proven": proven or reference <= dual, "ms": ms, "before_ms": before_ms})
        if progress is not None and (number + 1) % 10 == 0:
            progress(f"  mixed windows: {number + 1}/{len(cases)}")
    return {"rows": rows}


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.9 * (len(ordered) - 1))]


def render(result: dict, seed: int, time_limit: float) -> list[str]:
    lines = [
        "| windows | MILP proved | planner / best: mean, worst | > 1% | > 3% | without levels: mean, worst | > 3% | planner ms, median / p90 | without, median / p90 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    groups = {"generated": [r for r in result["rows"] if r["kind"] != "reported"],
              "reported shape (4 x 16 over 8)": [r for r in result["rows"] if r["kind"] == "reported"]}
    groups["all"] = result["rows"]
    for name, rows in groups.items():
        if not rows:
            continue
        ratios = [r["path"] / max(r["best"], 1) for r in rows]
        before = [r["before"] / max(r["best"], 1) for r in rows]
        ms, before_ms = [r["ms"] for r in rows], [r["before_ms"] for r in rows]
        lines.append(
            f"| {name}: {len(rows)} | {sum(r['proven'] for r in rows)} | {statistics.fmean(ratios):.4f}, "
            f"{max(ratios):.4f} | {sum(x > 1.01 for x in ratios)} | {sum(x > 1.03 for x in ratios)} | "
            f"{statistics.fmean(before):.4f}, {max(before):.4f} | {sum(x > 1.03 for x in before)} | "
            f"{statistics.median(ms):.0f} / {_p90(ms):.0f} | {statistics.median(before_ms):.0f} / {_p90(before_ms):.0f} |"
        )
    return [f"seed {seed}, MILP time limit {time_limit:g} s per window", "", *lines]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=40)
    parser.add_argument("--reported", type=int, default=30)
    parser.add_argument("--seed", type=int, default=202)
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--json", help="also write every window, its plan's path and the reference here")
    parser.add_argument("--milp-cache", help="a JSON file of the MILP's results, read and extended")
    args = parser.parse_args()
    cache = {}
    if args.milp_cache and os.path.exists(args.milp_cache):
        with open(args.milp_cache) as file:
            cache = json.load(file)
    result = evaluate(args.windows, args.reported, args.seed, args.time_limit,
                      progress=lambda m: print(m, file=sys.stderr, flush=True), cache=cache)
    if args.milp_cache:
        with open(args.milp_cache, "w") as file:
            json.dump(cache, file)
    print("\n".join(render(result, args.seed, args.time_limit)))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result["rows"], out)
    worst = sorted(result["rows"], key=lambda r: -r["path"] / max(r["best"], 1))[:6]
    for row in worst:
        shown = {key: value for key, value in row.items() if key != "costs"}
        print(f"  {row['path'] / max(row['best'], 1):.4f}: {shown}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
