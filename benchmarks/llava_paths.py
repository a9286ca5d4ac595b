"""`mimo-pipes check` and `mimo-pipes analyze` on LLaVA rows whose images are small PNG and JPEG files given by path.

Writes ``--rows`` rows as a LLaVA annotation list (``llava.json``: ``image`` a file name, ``conversations``
with an ``<image>`` marker; one to three exchanges), each with its own image file under ``images/`` (24 to
512 px a side, PNG and JPEG alternately), then times the command as a user runs it, from a cold cache (the
processor is built before the clock starts), and prints the markdown for docs/benchmarks.md: wall time,
CPU time of the command and its worker processes, rows per second.

    python benchmarks/llava_paths.py check --rows 20000
    python benchmarks/llava_paths.py check --rows 20000 --decode
    python benchmarks/llava_paths.py analyze --rows 50000
    python benchmarks/llava_paths.py check --rows 2000 --data /tmp/llava   # reuse the generated rows
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _dist  # noqa: E402  (benchmarks/_dist.py)

WORDS = "the a picture shows small large red blue green card page chart line box text sign left right top bottom".split()


def generate(folder: Path, rows: int) -> Path:
    """``folder/llava.json`` and ``folder/images/`` (kept when they already hold ``rows`` rows)."""
    import numpy as np
    from PIL import Image, ImageDraw

    annotations = folder / "llava.json"
    if annotations.is_file() and len(json.loads(annotations.read_text())) == rows:
        return annotations
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    out = []
    for k in range(rows):
        width, height = (int(side) for side in rng.integers(24, 513, 2))
        image = Image.new("RGB", (width, height), tuple(int(c) for c in rng.integers(0, 256, 3)))
        ImageDraw.Draw(image).rectangle([width // 4, height // 4, width // 2, height // 2], fill=(20, 20, 20))
        name = f"{k:06d}.{'png' if k % 2 else 'jpg'}"
        image.save(folder / "images" / name)
        turns = []
        for turn in range(int(rng.integers(1, 4))):
            question = " ".join(rng.choice(WORDS, int(rng.integers(4, 20))))
            turns += [{"from": "human", "value": ("<image>\n" if turn == 0 else "") + question + "?"},
                      {"from": "gpt", "value": " ".join(rng.choice(WORDS, int(rng.integers(5, 60)))) + "."}]
        out.append({"id": f"row-{k}", "image": name, "conversations": turns})
    annotations.write_text(json.dumps(out))
    return annotations


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _copy_processor(cache: Path) -> None:
    """The built-in processor (built once in the usual cache, not timed) copied into the cold cache ``cache``."""
    import shutil

    from mimo_pipes.data.cache import cache_root
    from mimo_pipes.data.embedded.builtin_processor import default_processor_path

    built = default_processor_path()
    shutil.copytree(built, cache / built.relative_to(cache_root()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("check", "analyze"))
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--data", default=None, help="folder for the generated rows (default: a temporary one)")
    parser.add_argument("--decode", action="store_true", help="check --decode: every image decoded in full")
    args = parser.parse_args()
    info = _dist.machine()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.data) if args.data else Path(scratch) / "data"
        started = time.perf_counter()
        annotations = generate(folder, args.rows)
        generated = time.perf_counter() - started
        env = dict(os.environ, MIMO_PIPES_CACHE=str(Path(scratch) / "cache"))  # cold: no counts, no dataset cache
        _copy_processor(Path(scratch) / "cache")
        argv = ["--dataset", str(annotations), "--image-folder", str(folder / "images"), "--quiet"]
        if args.command == "analyze":
            argv += ["--out", str(Path(scratch) / "analysis")]
        elif args.decode:
            argv.append("--decode")
        load = os.getloadavg()[0]
        cpu, started = _children_cpu(), time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "mimo_pipes.cli.main", args.command, *argv], env=env, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - started, _children_cpu() - cpu
    if result.returncode not in (0, 1):
        sys.exit(f"mimo-pipes {args.command} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    summary = [line for line in result.stdout.splitlines() if line.startswith(("bad:", "costs:"))]
    print(f"### `mimo-pipes {args.command}` on {args.rows} LLaVA rows by path")
    print("\n".join(_dist.provenance_lines(_dist.command_line(), info)))
    print(f"Generating the rows and image files: {generated:.0f} s (not timed below). 1-minute load average when the command started: {load:.1f}.")
    print()
    print("| rows | wall s | CPU s (command and its workers) | rows / s |")
    print("|---|---|---|---|")
    print(f"| {args.rows} | {wall:.1f} | {cpu:.1f} | {args.rows / wall:.0f} |")
    print()
    print("Its report: " + "; ".join(f"`{line}`" for line in summary))


if __name__ == "__main__":
    main()
