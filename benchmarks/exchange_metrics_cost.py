"""What collecting the exchange's metrics costs the training thread: next() with metrics on vs off, one run.

The simulated training loop of exchange_overlap.py, with the exchange node's ``collect_metrics`` on and
off (no other observer, so with it off no record is built at all), overlap on and off, the four modes
interleaved round by round. Metrics need no collective of their own (image tokens ride in the exchange's
all-gather row), so what is left is arithmetic on the exchanging thread and a few additions on delivery.

    python benchmarks/exchange_metrics_cost.py [--ranks 2|4] [--rounds 4] [--out DIR]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _dist  # noqa: E402  (benchmarks/_dist.py)
import _exchange as common  # noqa: E402  (benchmarks/_exchange.py)

MODES = ("overlap on, metrics on", "overlap on, metrics off", "overlap off, metrics on", "overlap off, metrics off")
MARKER = "exchange_metrics_cost.py results"


def rank_main(rank: int, world_size: int, opts: dict) -> dict:
    env = common.rank_env(world_size, opts)
    say = common.say(rank)
    runs = []
    for round_index, window, mode in common.schedule(opts, MODES):
        started = time.perf_counter()
        loader = common.build_loader(env, opts, reorder=True, overlap=mode.startswith("overlap on"), window=window)
        loader.exchange_node().collect_metrics = mode.endswith("metrics on")
        run = common.training_run(env, opts, loader, window, observe=False)
        run.update(mode=mode, round=round_index)
        runs.append(run)
        say(f"  round {round_index + 1}/{opts['rounds']} W={window} {mode:<25} next() mean "
            f"{1e3 * statistics.fmean(run['next_s']):6.2f} ms ({time.perf_counter() - started:.1f} s)")
    return {"rank": rank, "runs": [{k: run[k] for k in ("mode", "round", "window", "next_s", "step_s")} for run in runs],
            "arithmetic": {window: arithmetic(env, opts, window) for window in opts["windows"]}}


def arithmetic(env: dict, opts: dict, window: int, repeats: int = 20) -> dict:
    """The metrics' own work, timed alone on records of real windows: the figures (on the exchanging thread)
    and the fold into the running totals (on delivery)."""
    from mimo_pipes.observe.metrics import MetricsAccumulator, window_metrics

    loader = common.build_loader(env, opts, reorder=True, overlap=False, window=window)
    records = []
    loader.exchange_node().add_observer(records.append)
    for _, _batch in zip(range(opts["steps"] // window * window), loader):
        pass
    loader.close()
    figures_s, fold_s = [], []
    for _ in range(repeats):
        accumulator = MetricsAccumulator()
        for record in records:
            start = time.perf_counter()
            figures = window_metrics(record)
            middle = time.perf_counter()
            accumulator.add(figures, record.wait_seconds)
            figures_s.append(middle - start)
            fold_s.append(time.perf_counter() - middle)
    return {"figures_us": 1e6 * statistics.median(figures_s), "fold_us": 1e6 * statistics.median(fold_s)}


def summarize(results: list[dict], opts: dict) -> dict:
    rows = []
    for window in opts["windows"]:
        for overlap in ("on", "off"):
            figures = {}
            for metrics in ("on", "off"):
                mode = f"overlap {overlap}, metrics {metrics}"
                nexts = [x for r in results for run in r["runs"] if run["window"] == window and run["mode"] == mode for x in run["next_s"]]
                steps = [x for r in results for run in r["runs"] if run["window"] == window and run["mode"] == mode for x in run["step_s"]]
                figures[metrics] = {"next_mean_ms": 1e3 * common.mean(nexts), "next_median_ms": 1e3 * statistics.median(nexts),
                                    "step_mean_ms": 1e3 * common.mean(steps), "timed": len(nexts)}
            arithmetic = [r["arithmetic"][window] for r in results]
            rows.append({"window": window, "overlap": overlap, **figures,
                         "figures_us": statistics.median(a["figures_us"] for a in arithmetic),
                         "fold_us": statistics.median(a["fold_us"] for a in arithmetic),
                         "ratio_mean": figures["on"]["next_mean_ms"] / figures["off"]["next_mean_ms"],
                         "ratio_step": figures["on"]["step_mean_ms"] / figures["off"]["step_mean_ms"]})
    return {"metrics_cost": rows}


def render(summary: dict, opts: dict, info: dict, command: str, seconds: float) -> str:
    fmt = common.fmt
    lines = [
        "### Cost of the metrics (`benchmarks/exchange_metrics_cost.py`)",
        "",
        common.setup_line(opts, f" Simulated compute per micro-batch: {opts['compute']} {opts['compute_ms']:g} ms, then a "
                          f"one-number all-reduce. {opts['rounds']} rounds of the 4 modes (order rotated per round), "
                          f"{opts['steps']} micro-batches per run, the first {opts['warmup']} not timed. Whole run: {seconds:.0f} s."),
        *_dist.provenance_lines(command, info),
        "Training-thread `next()` per micro-batch with the exchange node's `collect_metrics` on and off (all ranks, "
        "all rounds). The last two columns time the metrics' own work alone on the records of real windows (median "
        "per window over ranks and 20 repeats): the figures, computed on the exchanging thread, and the fold into "
        "the running totals, on the training thread at delivery.",
        "",
        "| W | overlap | next() mean ms, metrics on | metrics off | on / off (means) | next() median ms, on | off | step mean ms, on / off | figures per window, us | fold on delivery, us |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in summary["metrics_cost"]:
        on, off = row["on"], row["off"]
        lines.append(f"| {row['window']} | {row['overlap']} | {fmt(on['next_mean_ms'])} | {fmt(off['next_mean_ms'])} | "
                     f"{row['ratio_mean']:.2f} | {fmt(on['next_median_ms'])} | {fmt(off['next_median_ms'])} | {row['ratio_step']:.3f} | "
                     f"{row['figures_us']:.0f} | {row['fold_us']:.0f} |")
    return "\n".join(lines)


def main() -> int:
    parser = common.parser(__doc__.split("\n")[0])
    common.add_training_options(parser, rounds=4)
    args = parser.parse_args()
    common.check_training_options(parser, args)
    return common.drive("exchange_metrics_cost", MARKER, args, rank_main, summarize, render)


if __name__ == "__main__":
    sys.exit(main())
