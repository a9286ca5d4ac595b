"""How many exchanged windows the overlapped exchange holds ahead of the consumer, and the RSS that costs.

The simulated training loop of exchange_overlap.py with overlap on and off, while a sampler thread (every
2 ms) reads the exchange node's ``prefetched()`` (windows exchanged but not delivered, and in flight on the
prefetch thread) and the process RSS. Bytes per window come from the exchange's records.

    python benchmarks/exchange_memory.py [--ranks 2|4] [--rounds 2] [--out DIR]
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _dist  # noqa: E402  (benchmarks/_dist.py)
import _exchange as common  # noqa: E402  (benchmarks/_exchange.py)

MODES = ("on", "off")
MARKER = "exchange_memory.py results"


class Sampler(threading.Thread):
    """Every ``period`` seconds: RSS, and the exchange node's queued and in-flight windows."""

    def __init__(self, node: Any, period: float = 0.002) -> None:
        super().__init__(name="benchmark-sampler", daemon=True)
        self.node, self.period = node, period
        self.done = threading.Event()
        self.max_rss = self.max_queued = self.max_in_flight = self.max_held = self.samples = 0

    def run(self) -> None:
        while not self.done.is_set():
            self.max_rss = max(self.max_rss, common.rss_bytes())
            queued, in_flight = self.node.prefetched()
            self.max_queued = max(self.max_queued, queued)
            self.max_in_flight = max(self.max_in_flight, in_flight)
            self.max_held = max(self.max_held, queued + in_flight)
            self.samples += 1
            self.done.wait(self.period)

    def stop(self) -> None:
        self.done.set()
        self.join()


def rank_main(rank: int, world_size: int, opts: dict) -> dict:
    env = common.rank_env(world_size, opts)
    say = common.say(rank)
    runs = []
    for round_index, window, mode in common.schedule(opts, MODES):
        started = time.perf_counter()
        loader = common.build_loader(env, opts, reorder=True, overlap=mode == "on", window=window)
        sampler = Sampler(loader.exchange_node())
        try:
            run = common.training_run(env, opts, loader, window, during=sampler.start)
        finally:
            if sampler.is_alive():
                sampler.stop()
        run.update(mode=mode, round=round_index, rss_peak_growth=sampler.max_rss - run["rss_before"],
                   max_queued=sampler.max_queued, max_in_flight=sampler.max_in_flight, max_held=sampler.max_held,
                   sampler_samples=sampler.samples)
        runs.append(run)
        say(f"  round {round_index + 1}/{opts['rounds']} W={window} overlap {mode:<3} held at most "
            f"{sampler.max_held} windows ({time.perf_counter() - started:.1f} s)")
    return {"rank": rank, "runs": runs}


def summarize(results: list[dict], opts: dict) -> dict:
    memory = []
    for window in opts["windows"]:
        runs = {mode: [run for r in results for run in r["runs"] if run["window"] == window and run["mode"] == mode] for mode in MODES}
        both = runs["on"] + runs["off"]
        window_bytes = common.mean([b for run in both for b in run["window_bytes"]])
        received = common.mean([b for run in both for b in run["received_bytes"]])
        growth_on = max(run["rss_peak_growth"] for run in runs["on"])
        growth_off = max(run["rss_peak_growth"] for run in runs["off"])
        memory.append({
            "window": window,
            "window_mb": window_bytes / 1e6,
            "received_mb": received / 1e6,
            "max_queued": max(run["max_queued"] for run in runs["on"]),
            "max_in_flight": max(run["max_in_flight"] for run in runs["on"]),
            "max_held": max(run["max_held"] for run in runs["on"]),
            "rss_growth_on_mb": growth_on / 1e6,
            "rss_growth_off_mb": growth_off / 1e6,
            "extra_windows_rss": (growth_on - growth_off) / window_bytes if window_bytes else float("nan"),
            "extra_received_rss": (growth_on - growth_off) / received if received else float("nan"),
            "sampler_samples": sum(run["sampler_samples"] for run in runs["on"]),
        })
    return {"memory": memory}


def render(summary: dict, opts: dict, info: dict, command: str, seconds: float) -> str:
    fmt = common.fmt
    lines = [
        "### Memory with overlap (`benchmarks/exchange_memory.py`)",
        "",
        common.setup_line(opts, f" The training loop of the overlap benchmark ({opts['compute']} {opts['compute_ms']:g} ms), "
                          f"overlap on and off, {opts['rounds']} rounds, {opts['steps']} micro-batches per run. Whole run: {seconds:.0f} s."),
        *_dist.provenance_lines(command, info),
        "Windows exchanged but not yet delivered (queued), exchanges in flight on the prefetch thread, and their sum, "
        "from the node's `prefetched()` sampled every 2 ms; peak RSS growth over the run (from just before the first "
        "next(), after handing freed memory back to the system), overlap on vs off. Window and received sizes are "
        "packed bytes from the exchange's records.",
        "",
        "| W | window MB per rank | received MB per rank and window | max queued | max in flight | max queued + in flight | RSS growth on MB | RSS growth off MB | on - off, in windows | on - off, in received bytes per window |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in summary["memory"]:
        lines.append(f"| {m['window']} | {fmt(m['window_mb'], 1)} | {fmt(m['received_mb'], 1)} | {m['max_queued']} | "
                     f"{m['max_in_flight']} | {m['max_held']} | {fmt(m['rss_growth_on_mb'], 0)} | {fmt(m['rss_growth_off_mb'], 0)} | "
                     f"{fmt(m['extra_windows_rss'], 1)} | {fmt(m['extra_received_rss'], 1)} |")
    return "\n".join(lines)


def main() -> int:
    parser = common.parser(__doc__.split("\n")[0])
    common.add_training_options(parser, rounds=2)
    args = parser.parse_args()
    common.check_training_options(parser, args)
    return common.drive("exchange_memory", MARKER, args, rank_main, summarize, render)


if __name__ == "__main__":
    sys.exit(main())
