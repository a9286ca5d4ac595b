"""How fast `mimo-pipes run` answers: first line, a refused setting, every rank's first micro-batch, the
summary, and the exit after it, and the CPU time the whole job takes; spawned ranks and under torchrun.

    python benchmarks/startup.py [--repeats 3] [--steps 32]

Each phase is timed from outside, as a user sees it: lines are stamped as they arrive on the command's
stdout and stderr, and every rank's first consumed micro-batch is the first line of its
``--dump-assignments`` file. The embedded data is built once first (its cache is warm). Results (medians
over the repeats, with the load average) go to docs/benchmarks.md between the ``startup.py results``
markers.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import _dist

MARKER = "startup.py results"
SECTION = "## Start and stop (`benchmarks/startup.py`)"
MAIN = ["--scalable-dp", "--intra-microbatch-reorder"]
RANKS = 4
GOALS = {  # seconds, on an idle 2-core machine
    "first line": 2.0,
    "refused (--micro-batch-size 3)": 3.0,
    "every rank's first micro-batch": 15.0,
    "exit after the summary": 3.0,
    "whole job": 35.0,
}


def _stamp_lines(stream, stamps: list[tuple[float, str]], started: float) -> None:
    for line in iter(stream.readline, ""):
        stamps.append((time.monotonic() - started, line.rstrip("\n")))


def timed_run(args: list[str], torchrun: bool, steps: int) -> dict[str, float]:
    """One default job: seconds from start to each phase."""
    with tempfile.TemporaryDirectory() as folder:
        dumps = Path(folder) / "dumps"
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(RANKS), "-m"] if torchrun \
            else [sys.executable, "-m"]
        command = [*launcher, "mimo_pipes.cli.main", "run", *args, "--steps", str(steps), "--dump-assignments", str(dumps)]
        cpu_before = _children_cpu()
        started = time.monotonic()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        out: list[tuple[float, str]] = []
        err: list[tuple[float, str]] = []
        readers = [threading.Thread(target=_stamp_lines, args=(process.stdout, out, started), daemon=True),
                   threading.Thread(target=_stamp_lines, args=(process.stderr, err, started), daemon=True)]
        for reader in readers:
            reader.start()
        first_microbatch = None
        while process.poll() is None:
            files = list(dumps.glob("rank*.jsonl")) if dumps.is_dir() else []
            if first_microbatch is None and len(files) == RANKS and all(path.stat().st_size for path in files):
                first_microbatch = time.monotonic() - started
            time.sleep(0.01)
        exited = time.monotonic() - started
        cpu = _children_cpu() - cpu_before  # the command and every process under it (each reaped by its parent)
        for reader in readers:
            reader.join()
        if process.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} exited {process.returncode}:\n" + "\n".join(line for _, line in err[-20:]))
    lines = sorted(out + err)
    summary = next(t for t, line in out if line.startswith("module "))
    phases = {"first line": lines[0][0], "every rank's first micro-batch": first_microbatch, "summary": summary,
              "exit after the summary": exited - summary, "whole job": exited, "CPU of every process (CPU-s)": cpu}
    for label, prefix in (("ranks started", "starting "), ("all ranks joined", "all ")):
        phases[label] = next((t for t, line in err if line.startswith(prefix)), float("nan"))
    return phases


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def refused() -> float:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "mimo_pipes.cli.main", "run", "--micro-batch-size", "3"], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each kind; medians are reported (default 3)")
    parser.add_argument("--steps", type=int, default=32, help="micro-batches of each job (default 32: the README's job)")
    parser.add_argument("--no-write", action="store_true", help="print the table only; leave docs/benchmarks.md as it is")
    args = parser.parse_args(argv)
    info = _dist.machine()
    timed_run(MAIN, False, 2)  # builds the embedded data and processor once: every measured run finds them cached
    rows: dict[str, dict[str, list[float]]] = {"spawned": {}, "torchrun": {}}
    refusals = []
    for _ in range(args.repeats):
        refusals.append(refused())
        for kind in rows:
            for phase, seconds in timed_run(MAIN, kind == "torchrun", args.steps).items():
                rows[kind].setdefault(phase, []).append(seconds)
    load_after = round(os.getloadavg()[0], 2)
    phases = ["first line", "ranks started", "all ranks joined", "every rank's first micro-batch", "summary", "exit after the summary", "whole job",
              "CPU of every process (CPU-s)"]
    lines = [
        "### `mimo-pipes run` from start to exit",
        *_dist.provenance_lines(_dist.command_line(), info),
        f"The README's job (`mimo-pipes run --scalable-dp --intra-microbatch-reorder`, {RANKS} ranks, {args.steps} micro-batches, "
        f"embedded data cached), medians of {args.repeats} runs; seconds from the command's start, and the CPU time of the command "
        f"and every process it started (user + system, the launcher, its rank server and ranks; torchrun's agent and workers). 1-minute load average "
        f"{info['load_1min_at_start']} at the start, {load_after} at the end. A refused setting "
        f"(`--micro-batch-size 3`): {statistics.median(refusals):.2f} s (goal {GOALS['refused (--micro-batch-size 3)']:.0f} s).",
        "",
        "| phase | spawned ranks | under torchrun | goal |",
        "|---|---|---|---|",
    ]
    for phase in phases:
        cells = []
        for kind in rows:
            values = [v for v in rows[kind].get(phase, []) if v == v]
            cells.append(f"{statistics.median(values):.1f}" if values else "-")
        goal = f"{GOALS[phase]:.0f}" if phase in GOALS else ""
        lines.append(f"| {phase} | {cells[0]} | {cells[1]} | {goal} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        _dist.write_results(MARKER, text, section=SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())
