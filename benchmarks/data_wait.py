"""Data wait of a Megatron-style training loop: the share of each iteration the training thread waits for data.

The loop is the one docs/megatron.md shows a user: ``vlm_sft.build`` on one rank, ``loader.prepare_with`` making
``MimoModel``'s keyword arguments (``mimo_batch``) on the loader's read-ahead thread, an iterator over the loader,
and a ``get_batch`` that takes the next one; the model step is a fixed length (a sleep, as a GPU step leaves the
CPU thread waiting; ``--busy``: a busy CPU loop) after each micro-batch. Side by side in one run: read-ahead off
(``read_ahead=0``, ``mimo_batch`` in ``get_batch``), on (the default) with ``mimo_batch`` in ``get_batch`` on the
training thread, and on with ``prepare_with`` (the documented loop), each with the processing workers asked for
(``default``: ``num_workers`` left unset, as many as the rank's cores allow). The data wait is the time
``get_batch`` takes, summed over the iterations after the warm-up, over their wall time.

    python benchmarks/data_wait.py [--iteration-ms 60] [--microbatches 2] [--micro-batch-size 4] [--iterations 40]
                                   [--workers default,2] [--short] [--json PATH]

Prints a markdown table (rows: read-ahead; columns: workers); ``--json`` also keeps each iteration's wait, the
waits split by whether the micro-batch was already made when asked for (``ready``, ``not_ready``: counts and ms), and
the time spent inside the loader's ``__next__`` (``inside_next_ms``): the rest of a ready micro-batch's wait is the
hand-off to the training thread. ``--thread-cpu`` instead takes the documented loop's
loader alone as fast as it goes (``--iterations`` micro-batches, no model step) and prints, per worker count, one
JSON line: samples/s and each thread's CPU milliseconds per sample (a thread's figure bounds the rate at
1000 / ms; CPU time, so a machine shared with other work still measures it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from _code_before import restore_code_before  # benchmarks/_code_before.py

MODES = ("off", "on, mimo_batch in get_batch", "on + prepare_with(mimo_batch) (docs/megatron.md)")
DEFAULT = "default"  # --workers: num_workers left unset


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iteration-ms", type=float, default=60.0, help="model time of one iteration (all its micro-batches)")
    parser.add_argument("--microbatches", type=int, default=2, help="micro-batches per iteration")
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--iterations", type=int, default=None,
                        help="measured iterations per setting (after the warm-up; default 40; --serial-cpu: micro-batches, default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="iterations left out at the start (the graph's start-up)")
    parser.add_argument("--workers", default="default,2",
                        help="comma-separated processing workers (num_workers); 'default': left unset (the rank's cores)")
    parser.add_argument("--read-ahead", type=int, default=None, help="micro-batches read ahead when on (default: the library's)")
    parser.add_argument("--processing", choices=("auto", "thread", "process"), default="auto",
                        help="per-sample processing on threads or worker processes (vlm_sft.build's processing; auto, the "
                             "library's default: processes from 2 workers)")
    parser.add_argument("--counting-threads", type=int, default=None,
                        help="rows counted before the exchange on this many threads of the rank's process (the code before; default: the library's)")
    parser.add_argument("--busy", action="store_true", help="the model step is a busy CPU loop (default: a sleep)")
    parser.add_argument("--short", action="store_true", help="a quick run: 8 measured iterations, 2 of warm-up")
    parser.add_argument("--serial-cpu", action="store_true",
                        help="instead: the CPU a micro-batch costs the thread that makes it (read-ahead off, the workers "
                             "given time to run ahead): the graph's next, mimo_batch, the loader's state")
    parser.add_argument("--thread-cpu", action="store_true",
                        help="instead: the loader alone (documented loop, no model step) as fast as it goes: samples/s and "
                             "each thread's CPU milliseconds per sample (this process's threads, by name)")
    parser.add_argument("--documented-only", action="store_true",
                        help="only the documented loop (read-ahead on, prepare_with(mimo_batch)), not the other two rows")
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="Python's thread switch interval in ms for the run (sys.setswitchinterval; Python's default 5)")
    parser.add_argument("--windows-ahead", type=int, default=None,
                        help="RowProcessor's windows ahead, fixed (default: the library's, rows enough for every worker; "
                             "1: as before they followed the workers)")
    parser.add_argument("--row-reads", action="store_true",
                        help="the reader reads a row at a time and every state is deep-copied at every level, as before")
    parser.add_argument("--copied-out", action="store_true",
                        help="each row's pixels laid out in an array of their own and copied into the micro-batch's buffer, as before")
    parser.add_argument("--trimmed", action="store_true",
                        help="the C allocator at glibc's defaults (freed blocks given back to the kernel), as before")
    parser.add_argument("--fresh-buffers", action="store_true",
                        help="every micro-batch's pixel buffer made fresh and unmapped where it is dropped, as before the pool")
    parser.add_argument("--copied-pixels", action="store_true",
                        help="each resized image's pixels copied out of PIL (np.asarray), as before they were viewed")
    parser.add_argument("--held-encode", action="store_true", help="text tokenized holding the GIL (encode), as before")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.switch_interval is not None and args.switch_interval <= 0:
        parser.error(f"--switch-interval: must be > 0 ms, got {args.switch_interval}")
    if args.iterations is None:
        args.iterations = 30 if args.serial_cpu else 40
    if args.short:
        args.iterations, args.warmup = 8, 2
    try:
        args.worker_counts = [None if w.strip() == DEFAULT else int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        parser.error(f"--workers: positive counts or '{DEFAULT}', got {args.workers!r}")
    for name in ("iterations", "microbatches", "micro_batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    if not args.worker_counts or min((w for w in args.worker_counts if w is not None), default=1) < 1:
        parser.error(f"--workers: positive counts, got {args.workers!r}")
    return args


def count_on_threads(threads: int) -> None:
    """Rows counted before the exchange on ``threads`` threads of the rank's process, as before 2026-12-07 (then on
    as many threads as workers; since, on worker processes under ``processing="process"``, one per 8 workers):
    the recipe's first mapper gets the plain counting function on threads."""
    from torchdata.nodes import ParallelMapper

    from mimo_pipes.observe.warning_tally import WarningsRecorded
    from mimo_pipes_recipes import vlm_sft

    def mapper(source: Any, map_fn: Any, *, num_workers: int, method: str, **settings: Any) -> Any:
        function = map_fn.function if isinstance(map_fn, WarningsRecorded) else map_fn
        return ParallelMapper(source, function, num_workers=threads, method="thread", **settings)

    vlm_sft.ParallelMapper = mapper
    vlm_sft.start_workers_from = lambda node, context: None
    vlm_sft.replayed = lambda item: item


def model_step(seconds: float, busy: bool) -> None:
    """The model's forward and backward of one micro-batch: a fixed length."""
    if not busy:
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def measure(args: argparse.Namespace, mode: str, workers: int | None) -> dict[str, Any]:
    """One setting: the loop of docs/megatron.md over ``warmup + iterations`` iterations."""
    from mimo_pipes.config import DEFAULT_READ_AHEAD, PipelineConfig
    from mimo_pipes.config.workers import processing_workers
    from mimo_pipes.exchange import RankLayout
    from mimo_pipes.megatron import mimo_batch
    from mimo_pipes_recipes import vlm_sft

    read_ahead = 0 if mode == "off" else (args.read_ahead if args.read_ahead is not None else DEFAULT_READ_AHEAD)
    total = args.warmup + args.iterations
    config = PipelineConfig(components=("language=tp=1,pp=1,dp=1,rank_offset=0",), micro_batch_size=args.micro_batch_size,
                            seq_length=args.seq_length, num_workers=workers, read_ahead=read_ahead,
                            embedded_samples=max(512, args.micro_batch_size * args.microbatches * total))
    loader = vlm_sft.build(config, RankLayout(dp_rank=0, dp_size=1, grid_size=1), processing=args.processing)
    get_batch: Callable[[Any], Any] = lambda iterator: mimo_batch(next(iterator))  # noqa: E731 - mimo_batch on the training thread
    if mode == MODES[2]:
        loader.prepare_with(mimo_batch)  # docs/megatron.md's loop: made on the read-ahead thread, get_batch only takes it
        get_batch = next
    step_s = args.iteration_ms / 1e3 / args.microbatches
    waits, walls, ready_waits, unready_waits = [], [], [], []
    # The time spent inside the loader's __next__ (from its first line to its return), apart from the time the call
    # takes as the training thread sees it: the difference is spent before its first line runs.
    inside: list[float] = []
    loader_type, loader_next = type(loader), type(loader).__next__

    def timed_next(self: Any) -> Any:
        began = time.perf_counter()
        try:
            return loader_next(self)
        finally:
            inside.append(time.perf_counter() - began)

    loader_type.__next__ = timed_next
    try:
        data_iterator = iter(loader)
        for iteration in range(total):
            began, waited = time.perf_counter(), 0.0
            for _ in range(args.microbatches):
                # Whether the micro-batch was made already when asked for (read-ahead on): a wait then is the hand-off
                # to this thread (the interpreter lock taken back from the loader's threads), not the data.
                ready = loader._reader is not None and bool(loader._reader._made)
                asked = time.perf_counter()
                get_batch(data_iterator)
                wait = time.perf_counter() - asked
                waited += wait
                if iteration >= args.warmup:
                    (ready_waits if ready else unready_waits).append(wait)
                model_step(step_s, args.busy)
            walls.append(time.perf_counter() - began)
            waits.append(waited)
    finally:
        loader_type.__next__ = loader_next
        loader.close()
    waits, walls = waits[args.warmup:], walls[args.warmup:]
    inside = inside[args.warmup * args.microbatches:]
    return {"mode": mode, "workers": DEFAULT if workers is None else workers, "resolved_workers": processing_workers(workers), "read_ahead": read_ahead, "wait_percent": 100.0 * sum(waits) / sum(walls),
            "median_wait_ms": statistics.median(waits) * 1e3, "median_iteration_ms": statistics.median(walls) * 1e3,
            # the wait split by whether the micro-batch was made when asked for (read-ahead on): counts and total ms
            "ready": [len(ready_waits), round(sum(ready_waits) * 1e3, 2)], "not_ready": [len(unready_waits), round(sum(unready_waits) * 1e3, 2)],
            # the measured micro-batches' time inside the loader's __next__, total and median, in ms
            "inside_next_ms": round(sum(inside) * 1e3, 2), "inside_next_median_ms": round(statistics.median(inside) * 1e3, 3) if inside else None,
            # every measured iteration's wait: whether the loop waits a little each time or a lot now and then
            "waits_ms": [round(w * 1e3, 3) for w in waits]}


def table(results: list[dict[str, Any]], worker_counts: list[int | None]) -> str:
    keys = [DEFAULT if w is None else w for w in worker_counts]
    by = {(r["mode"], r["workers"]): r for r in results}
    modes = [mode for mode in MODES if (mode, keys[0]) in by]
    heads = [f"{by[modes[0], k]['resolved_workers']} workers{' (default)' if k == DEFAULT else ''}" for k in keys]
    lines = ["| read-ahead | " + " | ".join(f"{h}: wait % (median ms / iteration)" for h in heads) + " |",
             "|---|" + "---:|" * len(keys)]
    for mode in modes:
        cells = [f"{by[mode, k]['wait_percent']:.1f}% ({by[mode, k]['median_wait_ms']:.1f} / {by[mode, k]['median_iteration_ms']:.1f})"
                 for k in keys]
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            model = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{os.cpu_count()} cores ({model}), Python {platform.python_version()}"


def serial_cpu(args: argparse.Namespace, workers: int | None, microbatches: int = 30) -> dict[str, Any]:
    """CPU milliseconds per micro-batch of the thread that makes it (``time.thread_time``), each part apart, with
    the workers 0.15 s ahead before every micro-batch so that nothing is waited for; ``drop``: the micro-batch let
    go on that thread. With read-ahead off the collator still holds the window's micro-batches until the last is
    handed out, so their memory goes later, inside a ``next`` (a fresh buffer's unmap is counted there)."""
    import copy

    from mimo_pipes.config import PipelineConfig
    from mimo_pipes.config.workers import processing_workers
    from mimo_pipes.exchange import RankLayout
    from mimo_pipes.megatron import mimo_batch
    from mimo_pipes_recipes import vlm_sft

    config = PipelineConfig(components=("language=tp=1,pp=1,dp=1,rank_offset=0",), micro_batch_size=args.micro_batch_size,
                            seq_length=args.seq_length, num_workers=workers, read_ahead=0, embedded_samples=512)
    loader = vlm_sft.build(config, RankLayout(dp_rank=0, dp_size=1, grid_size=1), processing=args.processing)
    parts = {"next": 0.0, "mimo_batch": 0.0, "state_dict": 0.0, "drop": 0.0}
    try:
        iterator = iter(loader)
        for _ in range(args.warmup):
            next(iterator)
        for _ in range(microbatches):
            time.sleep(0.15)
            began = time.thread_time()
            batch = next(iterator)
            made = time.thread_time()
            prepared_batch = mimo_batch(batch)
            prepared = time.thread_time()
            copy.deepcopy(loader.state_dict())
            saved = time.thread_time()
            del batch, prepared_batch  # the micro-batch dropped, as a loop drops it once its step has run
            parts["next"] += made - began
            parts["mimo_batch"] += prepared - made
            parts["state_dict"] += saved - prepared
            parts["drop"] += time.thread_time() - saved
    finally:
        loader.close()
    return {"workers": processing_workers(workers), **{k: 1e3 * v / microbatches for k, v in parts.items()}}


def threads_cpu_s() -> dict[int, tuple[str, float]]:
    """This process's threads: id -> (name, CPU seconds, user + system), named by ``threading`` where Python made
    them ("native" otherwise: torch's and the libraries' own threads)."""
    import threading

    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        out[int(tid)] = (names.get(int(tid), "native"), (int(fields[11]) + int(fields[12])) / tick)
    return out


def thread_group(name: str) -> str:
    """A thread's name without its number: the pool's threads together (``mimo-pipes-process_3`` -> ``_N``)."""
    import re

    return re.sub(r"-\d+ \(", "-N (", re.sub(r"_\d+$", "_N", name))


def thread_cpu(args: argparse.Namespace, workers: int | None, microbatches: int = 60) -> dict[str, Any]:
    """The documented loop's loader alone, taken as fast as it goes: samples per second (wall) and each thread
    group's CPU milliseconds per sample. A single thread's figure bounds the rate at 1000 / ms samples/s."""
    import collections

    from mimo_pipes.config import DEFAULT_READ_AHEAD, PipelineConfig
    from mimo_pipes.config.workers import processing_workers
    from mimo_pipes.exchange import RankLayout
    from mimo_pipes.megatron import mimo_batch
    from mimo_pipes_recipes import vlm_sft

    read_ahead = args.read_ahead if args.read_ahead is not None else DEFAULT_READ_AHEAD
    config = PipelineConfig(components=("language=tp=1,pp=1,dp=1,rank_offset=0",), micro_batch_size=args.micro_batch_size,
                            seq_length=args.seq_length, num_workers=workers, read_ahead=read_ahead,
                            embedded_samples=max(512, args.micro_batch_size * (microbatches + args.warmup)))
    loader = vlm_sft.build(config, RankLayout(dp_rank=0, dp_size=1, grid_size=1), processing=args.processing)
    loader.prepare_with(mimo_batch)
    try:
        iterator = iter(loader)
        for _ in range(args.warmup):
            next(iterator)
        before, began, cpu_began = threads_cpu_s(), time.perf_counter(), time.process_time()
        for _ in range(microbatches):
            next(iterator)
        after, wall, cpu = threads_cpu_s(), time.perf_counter() - began, time.process_time() - cpu_began
    finally:
        loader.close()
    samples = microbatches * args.micro_batch_size
    groups: dict[str, list[float]] = collections.defaultdict(list)
    for tid, (name, seconds) in after.items():
        groups[thread_group(name)].append(seconds - before.get(tid, (name, 0.0))[1])
    per_thread = {name: {"threads": len(cpus), "ms_per_sample": 1e3 * sum(cpus) / samples,
                         "busiest_thread_ms_per_sample": 1e3 * max(cpus) / samples}
                  for name, cpus in sorted(groups.items(), key=lambda item: -sum(item[1]))}
    return {"workers": processing_workers(workers), "processing": args.processing, "samples": samples,
            "samples_per_s": samples / wall, "process_cpu_ms_per_sample": 1e3 * cpu / samples, "threads": per_thread}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    restore_code_before(windows_ahead=args.windows_ahead, copied_pixels=args.copied_pixels, held_encode=args.held_encode,
                        fresh_buffers=args.fresh_buffers, row_reads=args.row_reads, copied_out=args.copied_out, trimmed=args.trimmed)
    if args.counting_threads is not None:
        count_on_threads(args.counting_threads)
    if args.thread_cpu:
        for workers in args.worker_counts:
            print(json.dumps(thread_cpu(args, workers, microbatches=args.iterations)))
        return 0
    if args.serial_cpu:
        for workers in args.worker_counts:
            print(json.dumps(serial_cpu(args, workers, microbatches=args.iterations)))
        return 0
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval / 1e3)
    results = []
    for workers in args.worker_counts:
        for mode in MODES[2:] if args.documented_only else MODES:
            results.append(measure(args, mode, workers))
            print(f"  {mode}, {results[-1]['resolved_workers']} workers: {results[-1]['wait_percent']:.1f}% wait", file=sys.stderr, flush=True)
    step = "busy CPU loop" if args.busy else "sleep"
    print(f"Data wait of a Megatron-style loop: {args.microbatches} micro-batches of {args.micro_batch_size} per iteration, "
          f"model step {args.iteration_ms:.0f} ms per iteration ({step}), {args.iterations} iterations after {args.warmup} of "
          f"warm-up; {machine()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    print(table(results, args.worker_counts))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"settings": {k: v for k, v in vars(args).items()}, "machine": machine(), "results": results}, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
