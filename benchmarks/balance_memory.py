"""Peak memory of `mimo-pipes balance` on one large window, across micro-batches.

Each size runs the real command in a fresh process (one JSON line on stdin: W micro-batches of B samples
over G slots, ``across_microbatches`` true) and reads its peak RSS from the kernel (``wait4``), with the
time it took. Costs: a third zero (text-only), a third at the largest image cost, a third uniform below it,
a fixed seed. The process runs under an address-space limit (``--limit-gib``) so that a regression fails
with the command's one-line error instead of swamping the machine.

    python benchmarks/balance_memory.py [--sizes 25,50,100] [--batch 10048] [--slots 64] [--limit-gib 4]
        [--shapes 1x1000000x2,2x500000x8,...]

``--sizes`` are window sizes W (micro-batches); 100 x 10,048 is one million samples. ``--shapes`` then
gives other windows as WxBxG (a W of 1 is one micro-batch, balanced alone), so that one shape's cost is
not taken for all: few slots with many samples each, many small micro-batches, many slots.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30


DEFAULT_SHAPES = "1x1000000x2,1x1000000x1000,2x500000x8,7x150000x6,1000x1000x8,10x100000x100"


def request_line(count: int, size: int, slots: int, seed: int) -> str:
    rng = random.Random(seed)
    heavy = 10**12
    rows = [[rng.choice((0, heavy, rng.randint(0, heavy))) for _ in range(size)] for _ in range(count)]
    if count == 1:
        return json.dumps({"costs": rows[0], "slots": slots}) + "\n"
    return json.dumps({"costs": rows, "slots": slots, "across_microbatches": True}) + "\n"


def measure(line: str, limit_bytes: int) -> dict:
    """Exit status, peak RSS (bytes), wall seconds, stderr and answer size of one `balance` process."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    with tempfile.TemporaryFile("w+") as source, tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        source.write(line)
        source.seek(0)
        started = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, "-m", "mimo_pipes.cli.main", "balance"],
            stdin=source, stdout=out, stderr=err, env=env, preexec_fn=limit, cwd=ROOT,
        )
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        err.seek(0)
        out.seek(0)
        return {
            "status": os.waitstatus_to_exitcode(status),
            "peak": usage.ru_maxrss * 1024,
            "wall": wall,
            "stderr": err.read().strip(),
            "answer_bytes": len(out.read()),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="25,50,100", help="window sizes W (micro-batches), comma-separated")
    parser.add_argument("--batch", type=int, default=10_048, help="samples per micro-batch B")
    parser.add_argument("--slots", type=int, default=64, help="slots G")
    parser.add_argument("--limit-gib", type=float, default=4.0, help="address-space limit of the process")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="other windows WxBxG, comma-separated ('' for none)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(f"machine: nproc {os.cpu_count()}, {platform.processor() or platform.machine()}, Python "
          f"{platform.python_version()}; date {time.strftime('%Y-%m-%d', time.gmtime())}")
    print(f"B = {args.batch}, G = {args.slots}, across micro-batches, address-space limit {args.limit_gib:g} GiB")
    print()
    print("| W | samples | request MB | peak RSS MB | bytes per sample | wall s | exit |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    failed = False
    for count in (int(text) for text in args.sizes.split(",")):
        line = request_line(count, args.batch, args.slots, args.seed)
        result = measure(line, int(args.limit_gib * GIB))
        samples = count * args.batch
        print(f"| {count} | {samples:,} | {len(line) / 1e6:.1f} | {result['peak'] / 1e6:.0f} | "
              f"{result['peak'] / samples:.0f} | {result['wall']:.1f} | {result['status']} |", flush=True)
        if result["status"]:
            failed = True
            print(f"  stderr: {result['stderr'][-300:]}")
    shapes = [tuple(int(part) for part in text.split("x")) for text in args.shapes.split(",") if text]
    if shapes:
        print()
        print("| W x B over G | samples | request MB | peak RSS MB | bytes per sample | wall s | exit |")
        print("|---|---:|---:|---:|---:|---:|---:|")
    for count, size, slots in shapes:
        line = request_line(count, size, slots, args.seed)
        result = measure(line, int(args.limit_gib * GIB))
        samples = count * size
        print(f"| {count} x {size:,} over {slots} | {samples:,} | {len(line) / 1e6:.1f} | {result['peak'] / 1e6:.0f} | "
              f"{result['peak'] / samples:.0f} | {result['wall']:.1f} | {result['status']} |", flush=True)
        if result["status"]:
            failed = True
            print(f"  stderr: {result['stderr'][-300:]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
