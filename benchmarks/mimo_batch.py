"""mimo_batch latency: a loader micro-batch turned into MimoModel.forward's keyword arguments, on the CPU.

``mimo_pipes.megatron.mimo_batch`` runs in a training loop's ``get_batch`` (the training thread), so its
time is data wait. This times it on micro-batches of the built-in processor over the embedded synthetic
dataset (real images, M-RoPE from input_ids and grids), padded to ``--seq-length`` and packed (THD).

    python benchmarks/mimo_batch.py [--rows 8] [--seq-length 4096] [--microbatches 16] [--repeats 50]
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _dist  # noqa: E402  (benchmarks/_dist.py)


def microbatches(rows: int, seq_length: int, count: int) -> list[dict]:
    from mimo_pipes.config import PipelineConfig
    from mimo_pipes.exchange import RankLayout
    from mimo_pipes_recipes import vlm_sft

    config = PipelineConfig(components=("language=tp=1,pp=1,dp=1,rank_offset=0",), micro_batch_size=rows, seq_length=seq_length,
                            embedded_samples=rows * count, num_workers=2)
    loader = vlm_sft.build(config, RankLayout(dp_rank=0, dp_size=1, grid_size=1))
    try:
        iterator = iter(loader)
        return [next(iterator) for _ in range(count)]
    finally:
        loader.close()


def timed(batches: list[dict], repeats: int) -> list[float]:
    from mimo_pipes.megatron import mimo_batch

    for batch in batches:
        mimo_batch(batch)  # warm-up
    cycle = itertools.cycle(batches)
    return _dist.time_calls(lambda: mimo_batch(next(cycle)), repeats * len(batches))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq-length", type=int, default=4096)
    parser.add_argument("--microbatches", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    import torch

    from mimo_pipes.samples.thd import pack_microbatch

    padded = microbatches(args.rows, args.seq_length, args.microbatches)
    images = statistics.mean(int(batch["image_grid_thw"].shape[0]) for batch in padded)
    tokens = statistics.mean(int(batch["attention_mask"].sum()) for batch in padded)
    print(f"Machine: nproc {os.cpu_count()}, {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"torch {torch.__version__}, load average {os.getloadavg()[0]:.2f}. Date: {time.strftime('%a %b %d %H:%M:%S UTC %Y', time.gmtime())}.")
    print(f"{args.microbatches} micro-batches of {args.rows} rows x {args.seq_length} tokens: {tokens:.0f} real tokens and "
          f"{images:.1f} images each on average; {args.repeats} timed rounds.\n")
    print("| micro-batch | median us | p90 us | p99 us |")
    print("|---|---:|---:|---:|")
    for name, batches in (("padded", padded), ("packed (THD)", [pack_microbatch(batch) for batch in padded])):
        times = sorted(t * 1e6 for t in timed(batches, args.repeats))
        print(f"| {name} | {statistics.median(times):.0f} | {times[int(0.9 * len(times))]:.0f} | {times[int(0.99 * len(times))]:.0f} |")


if __name__ == "__main__":
    main()
