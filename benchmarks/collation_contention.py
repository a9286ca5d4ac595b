"""Is it the GIL? Collating 4 samples alone and next to a thread that does the exchange's work, plain copies
(new or reused memory: no Python, GIL released) or pure Python (holds the GIL). One process, no ranks.

Tells whether a concurrent exchange slows collation through the GIL or through the machine.

    python benchmarks/collation_contention.py [--repeats 40] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _dist  # noqa: E402  (benchmarks/_dist.py)
import _exchange as common  # noqa: E402  (benchmarks/_exchange.py)

MARKER = "collation_contention.py results"


def collation_contention(opts: dict, repeats: int = 40, rounds: int = 3) -> dict:
    """In this one process, before any rank starts: median time to collate 4 samples alone and next to a
    second thread doing, in a loop, (a) the exchange's packing and unpacking of 4 samples, (b) plain tensor
    copies into new memory, (c) the same copies into reused memory (no page faults), (d) pure Python (holds
    the GIL). Tells whether a concurrent exchange slows collation through the GIL or through the machine."""
    import torch

    from mimo_pipes.exchange.wire_format import decode_samples, sample_encoding
    from mimo_pipes.samples.collate import collate_microbatch
    from mimo_pipes.testing import SyntheticProcessedDataset

    torch.set_num_threads(1)
    dataset = SyntheticProcessedDataset(16, seed=opts["seed"], patch_dim=opts["patch_dim"])
    meta = {"step": 0, "slot": 0, "image_tokens": 0, "real_tokens": 0, "cost": 0}
    samples = [dict(dataset[i], sample_id=i, **meta) for i in range(16)]
    moved = samples[8:12]
    source = torch.cat([sample["pixel_values"].reshape(-1) for sample in moved])  # the same bytes as packing moves
    reused = torch.empty_like(source)
    stop = threading.Event()

    def exchange_work() -> None:
        while not stop.is_set():
            layouts = [sample_encoding(sample) for sample in moved]
            buffer = torch.empty(sum(layout.size for layout in layouts), dtype=torch.uint8)
            offset = 0
            for layout in layouts:
                offset = layout.write_into(buffer, offset)
            decode_samples(buffer, sizes=[layout.size for layout in layouts])

    def copies_new() -> None:
        while not stop.is_set():
            torch.empty_like(source).copy_(source)

    def copies_reused() -> None:
        while not stop.is_set():
            reused.copy_(source)

    def python_work() -> None:
        while not stop.is_set():
            total = 0
            for i in range(20000):
                total += i

    def collate_ms(background: Any) -> float:
        stop.clear()
        thread = threading.Thread(target=background, daemon=True) if background else None
        if thread:
            thread.start()
        times = []
        for k in range(repeats):
            batch = samples[(k % 2) * 4 : (k % 2) * 4 + 4]
            start = time.perf_counter()
            collate_microbatch(batch, pad_length=opts["seq_length"], pad_values=common.PAD_VALUES)
            times.append(time.perf_counter() - start)
        stop.set()
        if thread:
            thread.join()
        return statistics.median(times)

    variants = (("alone", None), ("exchange work", exchange_work), ("copies, new memory", copies_new),
                ("copies, reused memory", copies_reused), ("pure Python", python_work))
    results: dict[str, list[float]] = {name: [] for name, _ in variants}
    for _ in range(rounds):
        for name, background in variants:
            results[name].append(collate_ms(background))
    return {name: 1e3 * statistics.median(values) for name, values in results.items()}


def render(timings: dict[str, float], opts: dict, info: dict, command: str) -> str:
    return "\n".join([
        "### Is it the GIL? (`benchmarks/collation_contention.py`)",
        *_dist.provenance_lines(command, info),
        f"Median time to collate 4 samples (patch_dim {opts['patch_dim']}, seq_length {opts['seq_length']}) alone and "
        "next to a second thread that loops over the exchange's packing and unpacking of 4 samples, over plain copies "
        "of the same bytes into new or into reused memory (no Python, GIL released), or over pure Python (holds the "
        f"GIL); median of {opts['rounds']} interleaved rounds of {opts['repeats']}:",
        "",
        "| " + " | ".join(f"{name} ms" for name in timings) + " |",
        "|" + "---:|" * len(timings),
        "| " + " | ".join(f"{value:.2f}" for value in timings.values()) + " |",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--patch-dim", type=int, default=1176)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", help="directory for the results JSON")
    parser.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks.md")
    args = parser.parse_args()
    opts = dict(vars(args))
    info, command = _dist.machine(), _dist.command_line()
    timings = collation_contention(opts, repeats=args.repeats, rounds=args.rounds)
    text = render(timings, opts, info, command)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "collation_contention.json"), "w") as handle:
            json.dump({"options": opts, "machine": info, "command": command, "collate_ms": timings}, handle, indent=1)
    if not args.no_docs:
        _dist.write_results(MARKER, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
