"""Every split of small steps, timed on the GPU: how close to the mean rank can any assignment get?

For a layout where each vision rank gets k = micro-batch / dp samples of a step (dp 2, micro-batch 8: 4 of
8; dp 4, micro-batch 8: 2 of 8), every k-subset of each step's samples is one forward a rank could run.
The script times them all on the vision tower (one warm-up forward, then the median of ``--repeats``),
so every equal-count split of the step over the ranks has a measured time for each rank. From that one
table it reports, summed over the steps:

- the best split of each step (the one whose slowest rank is fastest): how far above the mean rank the
  slowest rank must stay, whatever the planner, because samples do not divide;
- the split each planner chose (reordering off; per-micro-batch balancing on image tokens; on the
  calibrated time model): the same ``balance_window`` call the exchange makes, timed from the same table.

The steps, samples and costs are ``benchmarks/time_model_gpu.py``'s (the embedded data, as ``mimo-pipes
run`` reads it). The measurement and the evaluation are separate: ``--from-results FILE`` re-evaluates a
saved table with another time model, without a GPU.

    python3 benchmarks/split_search_gpu.py --device cuda --out DIR              # calibrate, time, evaluate
    python3 benchmarks/split_search_gpu.py --from-results DIR/results.json --time-model M.json --out DIR2
    python3 benchmarks/split_search_gpu.py --device cpu --smoke --out DIR       # tiny tower (a test)
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from time_model_gpu import Timer, add_common_arguments, planner_floor, processed_samples, rank_assignments  # noqa: E402 - the same data and planner calls

from mimo_pipes.config import PipelineConfig, ReorderConfig  # noqa: E402
from mimo_pipes.demo_model.encoders import build_vision_tower, encode, patch_dim  # noqa: E402
from mimo_pipes.parallel.sharding import global_microbatch_indices  # noqa: E402
from mimo_pipes.time_model.calibrate import calibrate, fit_report  # noqa: E402
from mimo_pipes.time_model.model import TimeModel, load_time_model, save_time_model  # noqa: E402
from mimo_pipes.time_model.sweep import SWEEPS  # noqa: E402

PER_MICROBATCH = ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True)
LAYOUTS = ((4, 8), (2, 8))  # (vision dp, micro-batch): 28 and 70 forwards per step


def equal_splits(items: tuple[int, ...], parts: int) -> Iterator[list[tuple[int, ...]]]:
    """Every split of ``items`` into ``parts`` unordered groups of equal size (the first item fixes the first group)."""
    if parts == 1:
        yield [items]
        return
    size = len(items) // parts
    first, rest = items[0], items[1:]
    for others in itertools.combinations(rest, size - 1):
        group = (first, *others)
        remaining = tuple(i for i in rest if i not in others)
        for tail in equal_splits(remaining, parts - 1):
            yield [group, *tail]


def best_split_by(cost_of, items: tuple[int, ...], parts: int) -> tuple[float, float]:
    """(slowest, sum) of the equal-count split of ``items`` whose slowest group is fastest, ties to the
    smaller sum; ``cost_of(group)`` is a group's time. Branch and bound over :func:`equal_splits`'s order."""
    best = [float("inf"), float("inf")]

    def search(remaining: tuple[int, ...], parts_left: int, slowest: float, total: float) -> None:
        if parts_left == 1:
            cost = cost_of(remaining)
            candidate = (max(slowest, cost), total + cost)
            if candidate < tuple(best):
                best[:] = candidate
            return
        size = len(remaining) // parts_left
        first, rest = remaining[0], remaining[1:]
        for others in itertools.combinations(rest, size - 1):
            cost = cost_of((first, *others))
            if max(slowest, cost) > best[0]:
                continue
            search(tuple(i for i in rest if i not in others), parts_left - 1, max(slowest, cost), total + cost)

    search(items, parts, 0.0, 0.0)
    return best[0], best[1]


def modelled_search(samples: list[dict], model: TimeModel, dp: int, batch: int, steps: int, seed: int) -> dict:
    """Every split of each step on the model's forward times (no GPU): the best split's slowest and mean
    rank against the calibrated planner's, both in modelled seconds."""
    floor = planner_floor(dp, PER_MICROBATCH, model)
    sums = {"best": [0.0, 0.0], "calibrated": [0.0, 0.0]}
    for step in range(steps):
        ids = global_microbatch_indices(step, len(samples), batch, seed, True).tolist()
        cache: dict[tuple[int, ...], float] = {}

        def cost_of(group: tuple[int, ...]) -> float:
            if group not in cache:
                runs = [r for p in group for r in samples[ids[p]]["runs"]]
                cache[group] = model.forward_time_ns(runs) / 1e9 if runs else 0.0
            return cache[group]

        slowest, total = best_split_by(cost_of, tuple(range(batch)), dp)
        sums["best"][0] += slowest
        sums["best"][1] += total / dp
        plan = rank_assignments([[model.encoder_time_ns(samples[i]["runs"]) for i in ids]], dp, batch, True, False, floor)[0]
        times = [cost_of(tuple(sorted(group))) for group in plan]
        sums["calibrated"][0] += max(times)
        sums["calibrated"][1] += statistics.fmean(times)
    return {"dp": dp, "microbatch_size": batch, "steps": steps,
            **{name: {"slowest_ms": a * 1e3, "mean_rank_ms": b * 1e3, "slowest_over_mean": a / b} for name, (a, b) in sums.items()}}


def key_of(samples: list[dict], ids: tuple[int, ...]) -> str:
    """The forward a rank runs for these samples: its images' grids (sorted, so equal image lists share a timing)."""
    grids = sorted(tuple(g) for i in ids for g in samples[i]["grid"])
    return ";".join(",".join(map(str, g)) for g in grids)


def grids_of(key: str) -> list[list[int]]:
    return [list(map(int, g.split(","))) for g in key.split(";")] if key else []


def measure(samples: list[dict], timer: Timer, dp: int, batch: int, steps: int, seed: int, table: dict[str, float],
            deadline: float, log) -> int:
    """Times every k-subset of each step into ``table`` (grids key -> seconds); returns the steps completed."""
    per_rank = batch // dp
    for step in range(steps):
        ids = global_microbatch_indices(step, len(samples), batch, seed, True).tolist()
        keys = {key_of(samples, subset) for subset in itertools.combinations(ids, per_rank)} - set(table)
        order = sorted(keys)  # time_in_rounds times them in a shuffled order
        for key in order:
            timer.want(grids_of(key))
        timer.measure()
        for key in order:
            table[key] = timer(grids_of(key))
        log(f"dp {dp}, micro-batch {batch}: step {step + 1}/{steps} timed ({len(keys)} new forwards, {len(table)} in all)")
        if time.perf_counter() > deadline:
            log(f"time budget reached after step {step + 1}")
            return step + 1
    return steps


def chosen_splits(samples: list[dict], table: dict[str, float], model: TimeModel, dp: int, batch: int, steps: int,
                  seed: int) -> dict[str, list[list[str]]]:
    """Per method and step: the forwards (grid keys) of each rank. ``best`` is the split whose slowest rank is
    fastest by the table; the planners' splits are the exchange's ``balance_window`` call."""
    floor = planner_floor(dp, PER_MICROBATCH, model)
    methods: dict[str, list[list[str]]] = {"off": [], "linear": [], "calibrated": [], "best": []}
    for step in range(steps):
        ids = global_microbatch_indices(step, len(samples), batch, seed, True).tolist()

        def keys(groups) -> list[str]:
            return [key_of(samples, tuple(ids[p] for p in group)) for group in groups]

        linear = [[samples[i]["image_tokens"] for i in ids]]
        calibrated = [[model.encoder_time_ns(samples[i]["runs"]) for i in ids]]
        methods["off"].append(keys(rank_assignments(linear, dp, batch, False, False, 0)[0]))
        methods["linear"].append(keys(rank_assignments(linear, dp, batch, True, False, 0)[0]))
        methods["calibrated"].append(keys(rank_assignments(calibrated, dp, batch, True, False, floor)[0]))
        methods["best"].append(min((keys(split) for split in equal_splits(tuple(range(batch)), dp)),
                                   key=lambda ks: (max(table[k] for k in ks), sum(table[k] for k in ks))))
    return methods


def evaluate(samples: list[dict], table: dict[str, float], model: TimeModel, dp: int, batch: int, steps: int, seed: int,
             timings: dict[str, float] | None = None) -> dict:
    """Sums over the steps of each method's slowest and mean rank; times from ``timings`` (a fresh
    measurement of the chosen forwards, free of the selection's bias) or else from the table."""
    splits = chosen_splits(samples, table, model, dp, batch, steps, seed)
    timings = table if timings is None else timings
    methods = {name: [[timings[k] for k in ks] for ks in per_step] for name, per_step in splits.items()}
    summary = {}
    for name, per_step in methods.items():
        slowest = sum(max(t) for t in per_step)
        mean = sum(statistics.fmean(t) for t in per_step)
        summary[name] = {"slowest_ms": slowest * 1e3, "mean_rank_ms": mean * 1e3, "slowest_over_mean": slowest / mean, "steps": per_step}
    return {"dp": dp, "microbatch_size": batch, "steps": steps, "methods": summary}


def report(results: list[dict], model: TimeModel) -> list[str]:
    lines = ["| layout | steps | reorder off | per micro-batch, linear | per micro-batch, calibrated | best split of every step |",
             "|---|---:|---:|---:|---:|---:|"]
    for result in results:
        m = result["methods"]
        off = m["off"]["slowest_ms"]
        cells = [f"{off:.0f} ms ({m['off']['slowest_over_mean']:.3f})"]
        for name in ("linear", "calibrated", "best"):
            cells.append(f"{m[name]['slowest_ms']:.0f} ms ({(m[name]['slowest_ms'] / off - 1) * 100:+.1f}%; {m[name]['slowest_over_mean']:.3f})")
        lines.append(f"| vision dp {result['dp']}, micro-batch {result['microbatch_size']} | {result['steps']} | " + " | ".join(cells) + " |")
    lines += ["", "Cells: sum over steps of the slowest rank's forward (change against reordering off; slowest / mean rank).",
              f"Calibrated model: floor {model.floor_ps / 1e9:.2f} ms, per image {model.per_image_ps / 1e9:.3f} ms, "
              f"per patch {model.per_patch_ps / 1e6:.3f} us, per patch^2 {model.per_patch_squared_ps / 1e3:.3f} ns."]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, out_help="folder for results.md, results.json (and time_model.json when calibrating)", layouts=LAYOUTS)
    parser.add_argument("--from-results", default=None, help="evaluate the timings of an earlier run's results.json (no GPU)")
    parser.add_argument("--steps", type=int, default=None, help="steps per layout (default 32; 2 with --smoke)")
    parser.add_argument("--repeats", type=int, default=1, help="rounds: each forward timed once per round after one warm-up, median kept (default 1)")
    parser.add_argument("--validate", action="store_true",
                        help="with --from-results and a GPU: time every chosen split's forwards afresh (the table's best "
                             "split is the minimum over noisy timings, so its table time is biased low)")
    parser.add_argument("--modelled-layouts", default=None,
                        help="also search every split of these layouts (vision dp x micro-batch, comma-separated) on the model's "
                             "times, without a GPU (e.g. 4x16: 2,627,625 splits a step)")
    parser.add_argument("--budget-s", type=float, default=None, help="stop timing new steps after this many seconds (default: none)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        print(line, flush=True)

    layouts = [tuple(int(x) for x in item.split("x")) for item in args.layouts.split(",")]
    samples = processed_samples(args.embedded_samples or (16 if args.smoke else PipelineConfig.embedded_samples), args.seq_length, log)
    fresh: dict[str, dict[str, float]] = {}
    if args.from_results:
        saved = json.loads(Path(args.from_results).read_text())
        tables, done = saved["tables"], {tuple(map(int, k.split("x"))): v for k, v in saved["steps_timed"].items()}
        model = load_time_model(args.time_model) if args.time_model else TimeModel(**{k: v for k, v in saved["model"].items() if k not in ("format", "version")})
        device_name = saved["device"]
        if args.validate:
            device = torch.device(args.device)
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
            tower = build_vision_tower(args.tower or ("tiny" if args.smoke else "qwen2-vl-675m"), dtype=dtype, device=device)
            timer = Timer(tower, device, dtype, repeats=args.repeats, warmup=0 if args.smoke else 1, log=log)
            deadline = time.perf_counter() + (args.budget_s if args.budget_s is not None else float("inf"))
            for dp, batch in layouts:
                name = f"{dp}x{batch}"
                splits = chosen_splits(samples, tables[name], model, dp, batch, done[(dp, batch)], args.seed)
                wanted = sorted({k for per_step in splits.values() for ks in per_step for k in ks})
                for key in wanted:
                    timer.want(grids_of(key))
                log(f"{name}: timing the {len(wanted)} chosen forwards afresh")
                timer.measure()
                fresh[name] = {key: timer(grids_of(key)) for key in wanted}
                if time.perf_counter() > deadline and (dp, batch) != layouts[-1]:
                    log("time budget reached: later layouts are not validated")
                    layouts = layouts[:layouts.index((dp, batch)) + 1]
                    break
            device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
            (out / "validation.json").write_text(json.dumps({"repeats": args.repeats, "timings": fresh}, indent=0))
    else:
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            print("no GPU found; pass --device cpu (with --smoke) to check the script on the CPU", file=sys.stderr)
            return 2
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        tower_name = args.tower or ("tiny" if args.smoke else "qwen2-vl-675m")
        tower = build_vision_tower(tower_name, dtype=dtype, device=device)
        if args.time_model is not None:
            model = load_time_model(args.time_model)
        else:
            sweep = replace(SWEEPS["cuda"], sides=(4, 8), counts=(1, 2), mixes=1, repeats=1, warmup=0) if args.smoke else SWEEPS["cuda"]
            config = tower.config
            model, points, fitted = calibrate(
                lambda p, g: encode(tower, p, g), patch_dim=patch_dim(config), merge_size=config.spatial_merge_size,
                patch_size=config.patch_size, temporal_patch_size=config.temporal_patch_size, device=device, dtype=dtype,
                sweep=sweep, log=log,
            )
            lines = fit_report(model, points, fitted)
            log("\n".join(lines))
            save_time_model(model, out / "time_model.json", {"tower": tower_name, "device": str(device), "points": lines})
        timer = Timer(tower, device, dtype, repeats=args.repeats, warmup=0 if args.smoke else 1, log=lambda line: None)
        deadline = time.perf_counter() + (args.budget_s if args.budget_s is not None else float("inf"))
        tables: dict[str, dict[str, float]] = {}
        done = {}
        steps = args.steps or (2 if args.smoke else 32)
        for dp, batch in layouts:
            table = tables.setdefault(f"{dp}x{batch}", {})
            done[(dp, batch)] = measure(samples, timer, dp, batch, steps, args.seed, table, deadline, log)
        device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        (out / "results.json").write_text(json.dumps({
            "device": device_name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "model": model.terms(),
            "steps_timed": {f"{dp}x{batch}": n for (dp, batch), n in done.items()}, "tables": tables}, indent=0))
    results = [evaluate(samples, tables[f"{dp}x{batch}"], model, dp, batch, done[(dp, batch)], args.seed, fresh.get(f"{dp}x{batch}"))
               for dp, batch in layouts if done.get((dp, batch))]
    source = f"; chosen splits timed afresh (median of {args.repeats})" if fresh else ""
    lines = [f"Every split of each step timed on {device_name}{source}.", ""] + report(results, model)
    if args.modelled_layouts:
        modelled = [modelled_search(samples, model, *map(int, item.split("x")), args.steps or (2 if args.smoke else 32), args.seed)
                    for item in args.modelled_layouts.split(",")]
        lines += ["", "Every split searched on the model's times (modelled ms, slowest / mean rank):", ""]
        for result in modelled:
            b, c = result["best"], result["calibrated"]
            lines.append(f"- vision dp {result['dp']}, micro-batch {result['microbatch_size']}, {result['steps']} steps: best split "
                         f"{b['slowest_ms']:.0f} ms ({b['slowest_over_mean']:.4f}), calibrated planner {c['slowest_ms']:.0f} ms "
                         f"({c['slowest_over_mean']:.4f})")
        (out / "modelled.json").write_text(json.dumps(modelled))
    (out / "results.md").write_text("\n".join(lines) + "\n")
    (out / "evaluation.json").write_text(json.dumps(results))
    log("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
