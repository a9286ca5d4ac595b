"""What the exchange benchmarks share: the ranks' set-up, the simulated training loop, the command line and
the driver that starts the ranks, summarizes and writes the docs. Each ``exchange_*.py`` script is one job.

The ranks run one module of DP 2 (``language=dp=2``) or, with ``--ranks 4``, ``language=dp=2`` +
``images=dp=2``, on SyntheticProcessedDataset samples (Qwen2-VL-sized pixel rows, ``--patch-dim 1176``),
micro-batch 8 (4 samples per rank). Everything they learn about an exchange comes from the exchange's
timing hook (:mod:`mimo_pipes.observe.observer`) and public node methods: nothing of the library is patched.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import _dist

from mimo_pipes.samples.collate import Collator

COMPONENTS = {
    2: ("language=tp=1,pp=1,dp=2,rank_offset=0",),
    4: ("language=tp=1,pp=1,dp=2,rank_offset=0", "images=tp=1,dp=2,rank_offset=2"),
}
PAD_VALUES = {"input_ids": 0, "labels": -100}


class CachedDataset:
    """SyntheticProcessedDataset with every sample made once up front, so that reading costs the same
    (nearly nothing) in every mode and the modes differ by the exchange alone."""

    def __init__(self, base: Any) -> None:
        self.items = [base[index] for index in range(len(base))]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict:
        return self.items[index]


@dataclass(frozen=True)
class TimedCollator(Collator):
    """A Collator that adds up its time (put in the graph's WindowCollator)."""

    spent: list[float] = field(default_factory=lambda: [0.0])

    def microbatch(self, samples: Any, step: int) -> dict[str, Any]:
        start = time.perf_counter()
        try:
            return super().microbatch(samples, step)
        finally:
            self.spent[0] += time.perf_counter() - start


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def release_free_memory() -> None:
    """Hand memory the allocator keeps after frees back to the system (glibc), so that a run's RSS growth
    is not hidden by memory an earlier run freed and the allocator kept."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def pipeline_config(components: tuple[str, ...], opts: dict, reorder: bool, overlap: bool, window: int) -> Any:
    from mimo_pipes.config import PipelineConfig, ReorderConfig

    return PipelineConfig(
        components=components,
        micro_batch_size=opts["micro_batch_size"],
        seq_length=opts["seq_length"],
        dataloader_type="cyclic",
        seed=opts["seed"],
        num_workers=1,
        reorder=ReorderConfig(
            scalable_dp=True, intra_microbatch_reorder=reorder, overlap_intra_microbatch_reorder=overlap,
            reorder_window_size=window,
        ),
    )


def rank_env(world_size: int, opts: dict) -> dict:
    """Process groups, devices and the cached dataset of this rank."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from mimo_pipes.exchange.process_groups import build_rank_groups
    from mimo_pipes.parallel.topology import build_topology
    from mimo_pipes.testing import SyntheticProcessedDataset

    torch.set_num_threads(1)
    components = COMPONENTS[world_size]
    topology = build_topology(components)
    nccl = opts["backend"] == "nccl"
    nccl_exchange = nccl and opts["exchange_transport"] == "nccl"
    groups = build_rank_groups(topology, exchange_backend="nccl" if nccl_exchange else "gloo", timeout_s=opts["timeout_s"])
    base = SyntheticProcessedDataset(opts["dataset_size"], seed=opts["seed"], patch_dim=opts["patch_dim"])
    return {
        "groups": groups, "topology": topology, "components": components,
        "device": torch.device("cuda", torch.cuda.current_device()) if nccl_exchange else None,
        "trainer_device": torch.device("cuda", torch.cuda.current_device()) if nccl else None,
        "dataset": CachedDataset(base) if opts["dataset"] == "cached" else base,
        "sequence": 0,
    }


def build_loader(env: dict, opts: dict, reorder: bool, overlap: bool, window: int) -> Any:
    from mimo_pipes.exchange import RankLayout
    from mimo_pipes.testing import IMAGE_TOKEN_ID
    from mimo_pipes_recipes.vlm_sft import pipeline

    groups, topology = env["groups"], env["topology"]
    config = pipeline_config(env["components"], opts, reorder, overlap, window)
    config.validate(world_size=topology.world_size)
    position = groups.position
    layout = RankLayout(position.dp_rank, position.dp_size, topology.grid_size, groups.exchange_group, env["device"])
    return pipeline(env["dataset"], config, layout, map_fn=None, image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES)


def compute(seconds: float, kind: str) -> None:
    if kind == "sleep":
        time.sleep(seconds)
    else:  # spin: a Python loop that holds the GIL except at the interpreter's switch interval
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass


def training_run(env: dict, opts: dict, loader: Any, window: int, *, observe: bool = True,
                 during: Callable[[], None] | None = None) -> dict:
    """``steps`` micro-batches of next() + simulated compute + a one-number all-reduce over the DP group.

    Per timed micro-batch: next() time, step time, and (``observe``) the training thread's wait for the
    exchange, from the exchange's records, and its collation, from the window collator's timed collator
    (none when the collator works ahead on its own thread). ``during`` runs once before the first next()
    (a sampler's start)."""
    import torch
    import torch.distributed as dist

    groups = env["groups"]
    from mimo_pipes.graph.traversal import graph_nodes
    from mimo_pipes.nodes import WindowCollator

    node = loader.exchange_node()
    records: list[Any] = []
    timed = None
    if observe and node is not None:
        node.add_observer(records.append)
    collating = next(n for n in graph_nodes(loader.root) if isinstance(n, WindowCollator))
    if observe and not collating.ahead:  # collation on the training thread: timed there
        timed = TimedCollator(collating.collator.pad_length, collating.collator.pad_values, collating.collator.vision_fields)
        collating.collator = timed
    steps = -(-opts["steps"] // window) * window
    warmup = -(-opts["warmup"] // window) * window
    # The simulated trainer's all-reduce runs where a trainer's would: on the GPU under NCCL.
    one = torch.ones(1, device=env["trainer_device"]) if env["trainer_device"] is not None else torch.ones(1)
    gc.collect()
    release_free_memory()
    dist.barrier(group=groups.dp_group)
    rss_before = rss_bytes()
    if during is not None:
        during()
    calls, step_times, waits, collates = [], [], [], []
    iterator = iter(loader)
    try:
        for step in range(steps):
            seen, collated = len(records), timed.spent[0] if timed is not None else 0.0
            start = time.perf_counter()
            next(iterator)
            got = time.perf_counter()
            wait = sum(record.wait_seconds for record in records[seen:])  # the window handed on in this call, if any
            collate = timed.spent[0] - collated if timed is not None else 0.0
            compute(opts["compute_ms"] / 1000.0, opts["compute"])
            dist.all_reduce(one, group=groups.dp_group)
            if step >= warmup:
                calls.append((start, got))
                waits.append(wait)
                collates.append(collate)
                step_times.append(time.perf_counter() - start)
    finally:
        loader.close()
    background = [(r.started_at, r.started_at + r.exchange_seconds) for r in records if not r.on_training_thread]
    return {
        "window": window,
        "next_s": [got - start for start, got in calls],
        "step_s": step_times,
        "wait_s": waits,
        "collate_s": collates,
        # Did a background exchange run during the call?
        "concurrent": [any(b < got and e > start for b, e in background) for start, got in calls],
        "exchange_s": [r.exchange_seconds for r in records],
        "exchange_on_main_thread": sum(1 for r in records if r.on_training_thread),
        "sent_bytes": [r.bytes_sent for r in records],
        "received_bytes": [r.bytes_received for r in records],
        "window_bytes": [sum(row[k] for row in r.encoded_bytes for k in own_positions(r)) for r in records],
        "rss_before": rss_before,
    }


def own_positions(record: Any) -> range:
    """Canonical positions this rank held before the exchange."""
    per_rank = record.micro_batch_size // record.dp_size
    return range(record.dp_rank * per_rank, (record.dp_rank + 1) * per_rank)


def rotated(items: tuple[str, ...], round_index: int) -> tuple[str, ...]:
    shift = round_index % len(items)
    return items[shift:] + items[:shift]  # so that no mode always runs first


def schedule(opts: dict, modes: tuple[str, ...]) -> Iterator[tuple[int, int, str]]:
    """(round, window, mode) of every run in order: each round runs every window in every mode, the modes
    rotated per round."""
    for round_index in range(opts["rounds"]):
        for window in opts["windows"]:
            for mode in rotated(modes, round_index):
                yield round_index, window, mode


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def setup_line(opts: dict, extra: str = "") -> str:
    world = opts["ranks"]
    topology = " + ".join(f"`{c}`" for c in COMPONENTS[world])
    return (
        f"{world} ranks ({topology}), {'Gloo on the CPU' if opts['backend'] == 'gloo' else 'NCCL, one GPU per rank'}, one "
        f"process per rank, 1 torch thread each; SyntheticProcessedDataset ({opts['dataset_size']} samples, "
        f"{'made once up front' if opts['dataset'] == 'cached' else 'made on every read'}), patch_dim {opts['patch_dim']}, "
        f"micro-batch {opts['micro_batch_size']} ({opts['micro_batch_size'] // 2} samples per rank), seq_length "
        f"{opts['seq_length']}.{extra}"
    )


def parser(description: str) -> argparse.ArgumentParser:
    """The options every exchange benchmark takes; a part adds its own."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--ranks", type=int, choices=(2, 4), default=2, help="2: language=dp=2; 4: language=dp=2 + images=dp=2")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="gloo: CPU; nccl: one GPU per rank")
    p.add_argument("--windows", type=int, nargs="+", default=[1, 4], help="window sizes W")
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--seq-length", type=int, default=2048)
    p.add_argument("--patch-dim", type=int, default=1176, help="pixel_values row width (1176: Qwen2-VL)")
    p.add_argument("--dataset", choices=("cached", "live"), default="cached",
                   help="cached: samples made once up front (modes differ by the exchange alone); live: made on every read")
    p.add_argument("--dataset-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--exchange-transport", choices=("nccl", "gloo"), default="nccl",
                   help="with --backend nccl: the exchange group's backend (gloo: CPU bytes beside an NCCL trainer)")
    p.add_argument("--out", help="directory for the results JSON")
    p.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks.md")
    return p


def add_training_options(p: argparse.ArgumentParser, rounds: int) -> None:
    """Options of the parts that run the simulated training loop."""
    p.add_argument("--compute-ms", type=float, default=150.0, help="simulated compute per micro-batch")
    p.add_argument("--compute", choices=("sleep", "spin"), default="sleep",
                   help="sleep: the thread waits (as on a GPU); spin: a Python busy loop holding the GIL")
    p.add_argument("--steps", type=int, default=20, help="micro-batches per run (rounded up to a multiple of W)")
    p.add_argument("--warmup", type=int, default=4, help="first micro-batches of each run not timed")
    p.add_argument("--rounds", type=int, default=rounds, help="rounds of all modes, order rotated per round")


def check_training_options(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    for window in args.windows:
        if window < 1 or -(-args.steps // window) <= -(-args.warmup // window):
            p.error(f"--steps {args.steps} leaves no timed micro-batch after --warmup {args.warmup} at W={window}")


def nccl_unavailable(ranks: int) -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    if os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "").strip() == "1":
        return ("CUDA_DEVICE_MAX_CONNECTIONS=1: an overlapped NCCL exchange next to the DP all-reduce can deadlock "
                "(the library refuses it too); unset it for this benchmark")
    needed = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])) if _dist.under_torchrun() else ranks
    if torch.cuda.device_count() < needed:
        return f"{torch.cuda.device_count()} CUDA device(s) for {needed} local ranks; NCCL needs one per rank"
    return None


def drive(name: str, marker: str, args: argparse.Namespace, rank_main: Callable[..., dict],
          summarize: Callable[[list[dict], dict], dict], render: Callable[..., str]) -> int:
    """Start the ranks (or join torchrun's), summarize in the collecting process, print, save JSON to
    ``--out`` and (Gloo) write the docs block ``marker``."""
    opts = dict(vars(args))
    collecting = not _dist.under_torchrun() or int(os.environ["RANK"]) == 0
    json_name = f"{name}_nccl.json" if args.backend == "nccl" else f"{name}.json"
    if args.backend == "nccl":
        reason = nccl_unavailable(args.ranks)
        if reason is not None:
            result = {"skipped": True, "backend": "nccl", "reason": reason}
            if collecting:
                print(json.dumps(result))
                if args.out:
                    os.makedirs(args.out, exist_ok=True)
                    with open(os.path.join(args.out, json_name), "w") as handle:
                        json.dump(result, handle, indent=1)
            return 0
    if _dist.under_torchrun() and int(os.environ["WORLD_SIZE"]) != args.ranks:
        raise SystemExit(f"--ranks {args.ranks} but torchrun started {os.environ['WORLD_SIZE']} processes")
    info = _dist.machine()
    command = _dist.command_line()
    if collecting:
        print(f"{name}: {args.ranks} ranks, {args.backend}, windows {args.windows}; nproc {info['nproc']}", flush=True)
    started = time.perf_counter()
    world_backend = "cpu:gloo,cuda:nccl" if args.backend == "nccl" else "gloo"
    results = _dist.run_ranks(rank_main, args.ranks, (opts,), backend=world_backend, timeout_s=args.timeout_s * 4,
                              env={"OMP_NUM_THREADS": "1"})
    seconds = time.perf_counter() - started
    if results is None:  # a torchrun rank other than 0
        return 0
    summary = summarize(results, opts)
    text = render(summary, opts, info, command, seconds)
    print()
    print(text)
    print()
    print(json.dumps(summary))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        payload = {"options": opts, "machine": info, "command": command, "seconds": seconds, "summary": summary, "raw": results}
        with open(os.path.join(args.out, json_name), "w") as handle:
            json.dump(payload, handle, indent=1)
    if args.backend == "gloo" and not args.no_docs:
        _dist.write_results(marker, text)
        print(f"results written to {os.path.relpath(_dist.DOCS)}")
    return 0


def say(rank: int) -> Callable[..., None]:
    return (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)


if __name__ == "__main__":
    sys.exit("a helper module: run one of benchmarks/exchange_*.py")
