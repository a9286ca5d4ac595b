"""Per-sample processing with and without the pixel table (mimo_pipes/data/processing/fast_pixels.py).

The embedded data's first N rows, each through the embedded processor as a rank's processing runs it
(``SampleProcessor``), in rounds that alternate the two paths (the table, the image processor's own), so that
both see the same machine; CPU seconds (user + system, this process) per row, medians over the rounds, and a
check that both give the same fields, bit for bit. Writes its section of docs/benchmarks.md.

    python benchmarks/pixel_table.py                    # 96 rows, 5 rounds of each path
    python benchmarks/pixel_table.py --rows 24 --rounds 1 --no-docs   # a quick look
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _dist  # noqa: E402

MARKER = "pixel_table.py results"
SECTION = "## Per-sample processing (`benchmarks/pixel_table.py`)"


def cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def same_fields(a: dict, b: dict) -> bool:
    if set(a) != set(b):
        return False
    for key, value in a.items():
        other = b[key]
        if isinstance(value, torch.Tensor):
            if not (isinstance(other, torch.Tensor) and value.dtype == other.dtype and torch.equal(value, other)):
                return False
        elif isinstance(value, np.ndarray):
            if not np.array_equal(value, other):
                return False
        elif value != other:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=96, help="embedded rows processed per round (default 96)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each path (default 5)")
    parser.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks.md")
    args = parser.parse_args(argv)

    from mimo_pipes.data.embedded.builtin_dataset import default_dataset_path
    from mimo_pipes.data.embedded.builtin_processor import default_processor_path
    from mimo_pipes.data.processing.processor import load_processor
    from mimo_pipes.data.sources.saved_folder import open_dataset

    dataset = open_dataset(default_dataset_path())
    processor = load_processor(default_processor_path(), 2048)
    table = processor.family.pixel_table
    if table is None:
        print("the embedded processor did not take the pixel table", file=sys.stderr)
        return 1
    rows = [{**dataset[index], "sample_id": index} for index in range(args.rows)]
    images = sum(len(row.get("images") or []) for row in rows)
    paths = {"table": table, "processor": None}
    per_row: dict[str, list[float]] = {name: [] for name in paths}
    outputs: dict[str, list[dict]] = {}
    for name, value in paths.items():  # warm: first calls and the allocator's first pages
        processor.family.pixel_table = value
        outputs[name] = [processor(row) for row in rows]
    identical = all(same_fields(a, b) for a, b in zip(outputs["table"], outputs["processor"], strict=True))
    del outputs
    for _ in range(args.rounds):
        for name, value in paths.items():
            processor.family.pixel_table = value
            started = cpu_seconds()
            for row in rows:
                processor(row)
            per_row[name].append((cpu_seconds() - started) / len(rows) * 1000)
    processor.family.pixel_table = table
    median = {name: statistics.median(values) for name, values in per_row.items()}
    ratio = median["processor"] / median["table"]
    print(f"rows {args.rows} ({images} images), rounds {args.rounds}: table {median['table']:.1f} ms/row, "
          f"processor's own {median['processor']:.1f} ms/row, {ratio:.2f}x; identical fields: {identical}")
    if not identical:
        return 1
    if not args.no_docs:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or "?"
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), platform.processor())
        body = "\n".join([
            "Command (from the repository root, in the project's virtual environment):",
            "",
            f"    python benchmarks/pixel_table.py --rows {args.rows} --rounds {args.rounds}",
            "",
            f"Machine: `nproc` {os.cpu_count()}, CPU \"{cpu}\", Python {platform.python_version()}, torch {torch.__version__}, "
            f"library at commit {commit}. Date: {time.strftime('%a %b %d %H:%M:%S UTC %Y', time.gmtime())}.",
            "",
            f"The embedded data's first {args.rows} rows ({images} images) through `SampleProcessor`, as a rank processes "
            f"them; CPU milliseconds per row (user + system), medians of {args.rounds} rounds, the two paths alternating. "
            "Both give the same fields, bit for bit (checked on every row).",
            "",
            "| path | CPU ms per row | rounds (ms per row) |",
            "|---|---:|---|",
            *(f"| {'pixel table' if name == 'table' else 'image processor only'} | {median[name]:.1f} | "
              f"{', '.join(f'{v:.1f}' for v in per_row[name])} |" for name in paths),
            "",
            f"The image processor's own path costs {ratio:.2f}x the table's per row.",
        ])
        _dist.write_results(MARKER, body, section=SECTION)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
