"""The balance exchange with real torch.distributed: overlap, bandwidth and memory, side by side in one run.

The benchmark starts its own ranks (Gloo on the CPU by default; ``--backend nccl`` on GPUs, one per rank)
for one module of DP 2 (``language=dp=2``) or, with ``--ranks 4``, ``language=dp=2`` + ``images=dp=2``.
Samples are SyntheticProcessedDataset's: Qwen2-VL-sized pixel rows (``--patch-dim 1176``) with its
image-token mix, micro-batch 8 (4 samples per rank). Three measurements, in the same processes:

1. Overlap. Each rank's training thread loops ``next()`` on the graph recipes/vlm_sft.py's pipeline makes (map_fn=None),
   then simulates compute for ``--compute-ms`` (sleep: the thread waits as it would on a GPU) and then
   all-reduces one number over its DP group (the gradient all-reduce that keeps ranks in step). Three
   modes, interleaved round by round: reordering with overlap, without overlap, and no reordering. The
   share of the exchange that overlap hides is 1 - (on - none) / (off - none) of mean next() times.
2. Bandwidth. ``exchange_window`` on ready windows against a raw ``all_to_all_single`` of the same byte
   splits on the same group, alternating, with a per-phase profile of the exchange.
3. Memory. During the overlapped runs a sampler thread (every 2 ms) records how many windows are
   exchanged but not yet delivered (the prefetcher's result queue), how many exchanges are in flight,
   and the process RSS.

Results go to stdout, as JSON to ``--out DIR`` if given, and (Gloo runs) into the Exchange section of
docs/benchmarks.md unless ``--no-docs``.

    python benchmarks/exchange.py [--ranks 2|4] [--compute-ms 100] [--rounds 2] [--out DIR]
    torchrun --nproc-per-node 2 benchmarks/exchange.py --backend nccl --out DIR   # or spawned: without torchrun
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _dist  # noqa: E402  (benchmarks/_dist.py)

COMPONENTS = {
    2: ("language=tp=1,pp=1,dp=2,rank_offset=0",),
    4: ("language=tp=1,pp=1,dp=2,rank_offset=0", "images=tp=1,dp=2,rank_offset=2"),
}
MODES = ("on", "off", "none")  # overlap on, overlap off, no reordering
DELAYED = "on_delayed"  # diagnostic: overlap on, background exchanges held until collation is over
MODE_NAMES = {"on": "reorder, overlap on", "off": "reorder, overlap off", "none": "no reordering",
              DELAYED: "overlap on, delayed start"}


def modes(opts: dict) -> tuple[str, ...]:
    return MODES + ((DELAYED,) if opts["prefetch_delay_ms"] > 0 else ())
PAD_VALUES = {"input_ids": 0, "labels": -100}
MARKER = "exchange.py results"


# ----------------------------------------------------------------------------------------------------------
# Inside a rank
# ----------------------------------------------------------------------------------------------------------


class CachedDataset:
    """SyntheticProcessedDataset with every sample made once up front, so that reading costs the same
    (nearly nothing) in every mode and the modes differ by the exchange alone."""

    def __init__(self, base: Any) -> None:
        self.items = [base[index] for index in range(len(base))]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict:
        return self.items[index]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _release_free_memory() -> None:
    """Hand memory the allocator keeps after frees back to the system (glibc), so that a run's RSS growth
    is not hidden by memory an earlier run freed and the allocator kept."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _sample_bytes(sample: dict) -> int:
    import torch

    return sum(v.numel() * v.element_size() for v in sample.values() if isinstance(v, torch.Tensor))


def _window_bytes(window: Any) -> int:
    return sum(_sample_bytes(sample) for microbatch in window.microbatches for sample in microbatch)


class ExchangeProbe:
    """Wraps the exchange node's ``exchange_window``: durations, in-flight count, bytes of each window."""

    def __init__(self) -> None:
        import mimo_pipes.nodes.balance_exchange as node_module

        self.node_module = node_module
        self.original = node_module.exchange_window
        self.in_flight = 0
        self.started = 0
        self.records: list[tuple[float, int, bool]] = []  # (seconds, window bytes, on the main thread)
        self.received: list[int] = []  # bytes of the samples each exchange received from peers
        self.delay = 0.0  # diagnostic: hold background exchanges until this long after the consumer's take()
        self.last_take = 0.0
        node_module.exchange_window = self._exchange

    def _exchange(self, ctx: Any, window: Any, sequence: int, *rest: Any) -> Any:
        if self.delay and threading.current_thread() is not threading.main_thread():
            time.sleep(max(0.0, self.last_take + self.delay - time.perf_counter()))
        size = _window_bytes(window)
        self.started += 1
        self.in_flight += 1
        start = time.perf_counter()
        received = 0
        try:
            result = self.original(ctx, window, sequence, *rest)
            # Samples that arrived from a peer are new objects; kept ones are the window's own.
            local = {id(sample) for microbatch in window.microbatches for sample in microbatch}
            received = sum(_sample_bytes(s) for microbatch in result.microbatches for s in microbatch if id(s) not in local)
            return result
        finally:
            self.records.append((time.perf_counter() - start, size, threading.current_thread() is threading.main_thread()))
            self.received.append(received)
            self.in_flight -= 1

    def take(self) -> list[tuple[float, int, bool]]:
        records, self.records = self.records, []
        return records


class NextProbe:
    """Splits the training thread's next() into waiting for an exchanged window (the prefetcher's take, or
    the synchronous exchange) and collating micro-batches on the training thread (with overlap the
    exchange collates on its own thread); the rest is the other nodes."""

    def __init__(self, exchange_probe: ExchangeProbe) -> None:
        import mimo_pipes.collate as collate_module
        import mimo_pipes.nodes.balance_exchange as node_module

        self.wait = self.collate = 0.0
        collate, take = collate_module.Collator.microbatch, node_module._Prefetcher.take

        def timed_collate(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is not threading.main_thread():
                return collate(*args, **kwargs)
            start = time.perf_counter()
            try:
                return collate(*args, **kwargs)
            finally:
                self.collate += time.perf_counter() - start

        def timed_take(prefetcher: Any) -> Any:
            start = time.perf_counter()
            try:
                return take(prefetcher)
            finally:
                exchange_probe.last_take = time.perf_counter()
                self.wait += exchange_probe.last_take - start

        collate_module.Collator.microbatch = timed_collate
        node_module._Prefetcher.take = timed_take

    def reset(self) -> tuple[float, float]:
        values = (self.wait, self.collate)
        self.wait = self.collate = 0.0
        return values


class Sampler(threading.Thread):
    """Every ``period`` seconds: RSS, and for an overlapped exchange node its queued and in-flight windows."""

    def __init__(self, probe: ExchangeProbe, node: Any, period: float = 0.002) -> None:
        super().__init__(name="benchmark-sampler", daemon=True)
        self.probe, self.node, self.period = probe, node, period
        self.done = threading.Event()
        self.max_rss = 0
        self.max_queued = self.max_produced_ahead = self.max_in_flight = self.max_held = 0
        self.samples = 0

    def run(self) -> None:
        while not self.done.is_set():
            self.max_rss = max(self.max_rss, _rss_bytes())
            prefetcher = getattr(self.node, "_prefetcher", None) if self.node is not None else None
            queued = ahead = 0
            if prefetcher is not None:
                queued = len(prefetcher.results)
                ahead = prefetcher.produced - prefetcher.delivered
            in_flight = self.probe.in_flight if prefetcher is not None else 0
            self.max_queued = max(self.max_queued, queued)
            self.max_produced_ahead = max(self.max_produced_ahead, ahead)
            self.max_in_flight = max(self.max_in_flight, in_flight)
            self.max_held = max(self.max_held, queued + in_flight)
            self.samples += 1
            self.done.wait(self.period)

    def stop(self) -> None:
        self.done.set()
        self.join()


def _config(components: tuple[str, ...], opts: dict, mode: str, window: int) -> Any:
    from mimo_pipes.config import PipelineConfig, ReorderConfig

    return PipelineConfig(
        components=components,
        micro_batch_size=opts["micro_batch_size"],
        seq_length=opts["seq_length"],
        dataloader_type="cyclic",
        seed=opts["seed"],
        num_workers=1,
        reorder=ReorderConfig(
            scalable_dp=True,
            intra_microbatch_reorder=mode != "none",
            overlap_intra_microbatch_reorder=mode in ("on", DELAYED),
            reorder_window_size=window,
        ),
    )


def _compute(seconds: float, kind: str) -> None:
    if kind == "sleep":
        time.sleep(seconds)
    else:  # spin: a Python loop that holds the GIL except at the interpreter's switch interval
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass


def _training_run(env: dict, opts: dict, mode: str, window: int) -> dict:
    """One graph, ``steps`` micro-batches of next() + simulated compute + a DP all-reduce."""
    import torch
    import torch.distributed as dist

    from mimo_pipes.exchange import RankLayout
    from mimo_pipes.loader import graph_nodes
    from mimo_pipes.nodes.balance_exchange import BalanceExchange
    from mimo_pipes.testing import IMAGE_TOKEN_ID
    from mimo_pipes_recipes.vlm_sft import pipeline

    groups, topology, probe, next_probe = env["groups"], env["topology"], env["probe"], env["next_probe"]
    config = _config(env["components"], opts, mode, window)
    config.validate(world_size=topology.world_size)
    position = groups.position
    layout = RankLayout(position.dp_rank, position.dp_size, topology.grid_size, groups.exchange_group, env["device"])
    loader = pipeline(env["dataset"], config, layout, map_fn=None, image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES)
    node = next((n for n in graph_nodes(loader.root) if isinstance(n, BalanceExchange)), None)
    steps = -(-opts["steps"] // window) * window
    warmup = -(-opts["warmup"] // window) * window
    # The simulated trainer's all-reduce runs where a trainer's would: on the GPU under NCCL.
    one = torch.ones(1, device=env["trainer_device"]) if env["trainer_device"] is not None else torch.ones(1)
    probe.take()
    gc.collect()
    _release_free_memory()
    dist.barrier(group=groups.dp_group)
    rss_before = _rss_bytes()
    sampler = Sampler(probe, node)
    sampler.start()
    nexts, step_times, waits, collates, concurrents = [], [], [], [], []
    iterator = iter(loader)
    try:
        for step in range(steps):
            next_probe.reset()
            sync_before = sum(r[0] for r in probe.records if r[2])
            busy_before, started_before = probe.in_flight, probe.started
            start = time.perf_counter()
            next(iterator)
            got = time.perf_counter()
            # Did a background exchange run during this call (in flight at its start, or started during it)?
            concurrent = node is not None and node.overlap and (busy_before > 0 or probe.started != started_before)
            wait, collate = next_probe.reset()
            wait += sum(r[0] for r in probe.records if r[2]) - sync_before  # a synchronous exchange is a wait too
            _compute(opts["compute_ms"] / 1000.0, opts["compute"])
            dist.all_reduce(one, group=groups.dp_group)
            if step >= warmup:
                nexts.append(got - start)
                waits.append(wait)
                collates.append(collate)
                concurrents.append(concurrent)
                step_times.append(time.perf_counter() - start)
    finally:
        loader.close()
        sampler.stop()
    records = probe.take()
    received, probe.received = probe.received, []
    return {
        "mode": mode,
        "window": window,
        "next_s": nexts,
        "step_s": step_times,
        "wait_s": waits,
        "collate_s": collates,
        "concurrent": concurrents,
        "exchange_s": [r[0] for r in records],
        "exchange_on_main_thread": sum(1 for r in records if r[2]),
        "window_bytes": [r[1] for r in records],
        "received_bytes": received,
        "rss_before": rss_before,
        "rss_peak_growth": sampler.max_rss - rss_before,
        "max_queued": sampler.max_queued,
        "max_produced_ahead": sampler.max_produced_ahead,
        "max_in_flight": sampler.max_in_flight,
        "max_held": sampler.max_held,
        "sampler_samples": sampler.samples,
    }


class _TimedDist:
    """Stands in for torch.distributed inside mimo_pipes.exchange: times the all_to_all, keeps its splits."""

    def __init__(self, real: Any, timers: dict) -> None:
        self._real, self._timers = real, timers
        self.last_splits: tuple[list[int], list[int]] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):  # noqa: A002
        self.last_splits = (list(input_split_sizes), list(output_split_sizes))
        start = time.perf_counter()
        try:
            return self._real.all_to_all_single(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)
        finally:
            self._timers["all_to_all"] = self._timers.get("all_to_all", 0.0) + time.perf_counter() - start


def _timed(timers: dict, name: str, fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            timers[name] = timers.get(name, 0.0) + time.perf_counter() - start

    return wrapper


def _make_windows(env: dict, opts: dict, window: int, count: int) -> list:
    from mimo_pipes.nodes.canonical_shard_reader import CanonicalShardReader
    from mimo_pipes.nodes.cost_annotator import CostAnnotator
    from mimo_pipes.nodes.windower import Windower
    from mimo_pipes.testing import IMAGE_TOKEN_ID

    groups, topology = env["groups"], env["topology"]
    position = groups.position
    config = _config(env["components"], opts, "off", window)
    encoder_weight, language_weight = config.reorder.integer_cost_weights()
    node = CanonicalShardReader(
        env["dataset"],
        microbatch_size=opts["micro_batch_size"],
        dp_rank=position.dp_rank,
        dp_size=position.dp_size,
        grid_size=topology.grid_size,
        seed=opts["seed"] + 1,  # other windows than the training runs'
        dataloader_type="cyclic",
    )
    node = CostAnnotator(node, image_token_id=IMAGE_TOKEN_ID, encoder_weight=encoder_weight, language_weight=language_weight)
    node = Windower(node, samples_per_microbatch=opts["micro_batch_size"] // position.dp_size, window_size=window)
    node.reset()
    return [next(node) for _ in range(count)]


def _sync(device: Any) -> None:
    if device is not None:
        import torch

        torch.cuda.synchronize(device)


def _bandwidth(env: dict, opts: dict, window: int) -> dict:
    """exchange_window vs raw all_to_all_single of the same splits, alternating, on the exchange group."""
    import torch
    import torch.distributed as dist

    import mimo_pipes.exchange as exchange_module
    from mimo_pipes.exchange import ExchangeBuffers, ExchangeContext

    groups, topology, device = env["groups"], env["topology"], env["device"]
    # As the node runs it: byte buffers reused from window to window (results are dropped before the next).
    reused = ExchangeBuffers()
    position = groups.position
    windows = _make_windows(env, opts, window, opts["bandwidth_windows"])
    ctx = ExchangeContext(
        group=groups.exchange_group,
        dp_rank=position.dp_rank,
        dp_size=position.dp_size,
        grid_size=topology.grid_size,
        samples_per_rank=opts["micro_batch_size"] // position.dp_size,
        window_size=window,
        device=device,
    )
    timers: dict[str, float] = {}
    saved = {name: getattr(exchange_module, name) for name in ("dist", "_gather_header", "_plan", "_move", "unpack_samples", "local_costs_and_layouts")}
    proxy = _TimedDist(dist, timers)
    exchange_module.dist = proxy
    for name in ("_gather_header", "_plan", "_move", "unpack_samples", "local_costs_and_layouts"):
        setattr(exchange_module, name, _timed(timers, name, saved[name]))
    sequence = env["sequence"]
    exchange_s: list[float] = []
    raw_s: list[float] = []
    fresh_s: list[float] = []
    sent: list[int] = []
    splits: list[tuple[list[int], list[int]] | None] = []
    profile: dict[str, float] = {}
    try:
        for w in windows:  # untimed first pass: warms up and records each window's splits
            proxy.last_splits = None
            exchange_module.exchange_window(ctx, w, sequence, reused)
            sequence += 1
            splits.append(proxy.last_splits)
        buffers = []
        for split in splits:
            if split is None:
                buffers.append(None)
                continue
            send_splits, recv_splits = split
            host = torch.full((sum(send_splits),), 7, dtype=torch.uint8)
            send = host if device is None else host.to(device)
            buffers.append((host, send, torch.empty(sum(recv_splits), dtype=torch.uint8, device=device)))
        timers.clear()
        for rep in range(opts["bandwidth_reps"]):
            for index, w in enumerate(windows):
                order = ("exchange", "raw", "fresh")
                order = order[(rep + index) % 3:] + order[: (rep + index) % 3]
                for what in order:
                    dist.barrier(group=groups.dp_group)
                    _sync(device)
                    if what == "exchange":
                        start = time.perf_counter()
                        exchange_module.exchange_window(ctx, w, sequence, reused)
                        elapsed = time.perf_counter() - start
                        sequence += 1
                        exchange_s.append(elapsed)
                        sent.append(sum(splits[index][0]) if splits[index] else 0)
                    elif buffers[index] is None:
                        (raw_s if what == "raw" else fresh_s).append(0.0)
                    elif what == "raw":  # preallocated buffers: the collective alone
                        _, send, recv = buffers[index]
                        send_splits, recv_splits = splits[index]
                        start = time.perf_counter()
                        dist.all_to_all_single(recv, send, recv_splits, send_splits, group=groups.exchange_group)
                        _sync(device)
                        raw_s.append(time.perf_counter() - start)
                    else:  # fresh buffers, as any exchange that hands out new host tensors must use
                        host, _, _ = buffers[index]
                        send_splits, recv_splits = splits[index]
                        start = time.perf_counter()
                        staged = torch.empty_like(host).copy_(host)  # one copy into new memory (packing's floor)
                        if device is not None:
                            staged = staged.to(device)
                        recv = torch.empty(sum(recv_splits), dtype=torch.uint8, device=device)
                        dist.all_to_all_single(recv, staged, recv_splits, send_splits, group=groups.exchange_group)
                        recv = recv.cpu()
                        _sync(device)
                        fresh_s.append(time.perf_counter() - start)
                        del staged, recv
        profile = dict(timers)
    finally:
        for name, value in saved.items():
            setattr(exchange_module, name, value)
    env["sequence"] = sequence
    return {
        "window": window,
        "exchange_s": exchange_s,
        "raw_s": raw_s,
        "fresh_s": fresh_s,
        "sent_bytes": sent,
        "moves": [split is not None for split in splits],
        "window_bytes": [_window_bytes(w) for w in windows],
        "profile_s": profile,
        "timed_exchanges": len(exchange_s),
    }


def collation_contention(opts: dict, repeats: int = 40, rounds: int = 3) -> dict:
    """In this one process, before any rank starts: median time to collate 4 samples alone and next to a
    second thread doing, in a loop, (a) the exchange's packing and unpacking of 4 samples, (b) plain tensor
    copies into new memory, (c) the same copies into reused memory (no page faults), (d) pure Python (holds
    the GIL). Tells whether a concurrent exchange slows collation through the GIL or through the machine."""
    import torch

    from mimo_pipes.collate import collate_microbatch
    from mimo_pipes.exchange.wire_format import layout_sample, unpack_samples
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
            layouts = [layout_sample(sample) for sample in moved]
            buffer = torch.empty(sum(layout.size for layout in layouts), dtype=torch.uint8)
            offset = 0
            for layout in layouts:
                offset = layout.write_into(buffer, offset)
            unpack_samples(buffer, sizes=[layout.size for layout in layouts])

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
            collate_microbatch(batch, pad_length=opts["seq_length"], pad_values=PAD_VALUES)
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


def rank_main(rank: int, world_size: int, opts: dict) -> dict:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    from mimo_pipes.exchange.process_groups import build_rank_groups
    from mimo_pipes.testing import SyntheticProcessedDataset
    from mimo_pipes.topology import build_topology

    torch.set_num_threads(1)
    components = COMPONENTS[world_size]
    topology = build_topology(components)
    nccl = opts["backend"] == "nccl"
    nccl_exchange = nccl and opts["exchange_transport"] == "nccl"
    groups = build_rank_groups(topology, exchange_backend="nccl" if nccl_exchange else "gloo", timeout_s=opts["timeout_s"])
    device = torch.device("cuda", torch.cuda.current_device()) if nccl_exchange else None
    trainer_device = torch.device("cuda", torch.cuda.current_device()) if nccl else None
    base = SyntheticProcessedDataset(opts["dataset_size"], seed=opts["seed"], patch_dim=opts["patch_dim"])
    dataset = CachedDataset(base) if opts["dataset"] == "cached" else base
    env = {"groups": groups, "topology": topology, "components": components, "device": device, "dataset": dataset,
           "probe": ExchangeProbe(), "sequence": 0, "trainer_device": trainer_device}
    env["next_probe"] = NextProbe(env["probe"])
    say = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
    runs = []
    for round_index in range(opts["rounds"]):
        for window in opts["windows"]:
            all_modes = modes(opts)
            shift = round_index % len(all_modes)
            order = all_modes[shift:] + all_modes[:shift]  # rotate, so no mode always runs first
            for mode in order:
                started = time.perf_counter()
                env["probe"].delay = opts["prefetch_delay_ms"] / 1000.0 if mode == DELAYED else 0.0
                run = _training_run(env, opts, mode, window)
                run["round"] = round_index
                runs.append(run)
                say(f"  round {round_index + 1}/{opts['rounds']} W={window} {MODE_NAMES[mode]:<22} "
                    f"next() mean {1e3 * statistics.fmean(run['next_s']):6.2f} ms  ({time.perf_counter() - started:.1f} s)")
    bandwidth = []
    for window in opts["windows"]:
        started = time.perf_counter()
        result = _bandwidth(env, opts, window)
        bandwidth.append(result)
        say(f"  bandwidth W={window}: {result['timed_exchanges']} timed exchanges ({time.perf_counter() - started:.1f} s)")
    dist.barrier()
    return {"rank": rank, "module": groups.position.module.name, "dp_rank": groups.position.dp_rank, "runs": runs,
            "bandwidth": bandwidth}


# ----------------------------------------------------------------------------------------------------------
# Summary (in the collecting process)
# ----------------------------------------------------------------------------------------------------------


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def _hidden(on: float, off: float, none: float) -> float:
    """Share of the exchange time that overlap hides: 1 - (on - none) / (off - none)."""
    return 1 - (on - none) / (off - none) if off - none > 0 else float("nan")


def _window_sums(runs: list[dict], window: int) -> list[float]:
    """next() time summed over each window's W micro-batches (timed runs start at a window boundary)."""
    sums = []
    for run in runs:
        times = run["next_s"]
        sums += [sum(times[i : i + window]) for i in range(0, len(times) - window + 1, window)]
    return sums


def summarize(results: list[dict], opts: dict) -> dict:
    summary: dict[str, Any] = {"overlap": [], "bandwidth": [], "memory": []}
    for window in opts["windows"]:
        if opts["rounds"]:
            _summarize_overlap(summary, results, opts, window)
        _summarize_bandwidth(summary, results, window)
    return summary


def _summarize_overlap(summary: dict, results: list[dict], opts: dict, window: int) -> None:
    per_mode = {}
    for mode in modes(opts):
        runs = [run for r in results for run in r["runs"] if run["window"] == window and run["mode"] == mode]
        nexts = [x for run in runs for x in run["next_s"]]
        steps = [x for run in runs for x in run["step_s"]]
        exchanges = [x for run in runs for x in run["exchange_s"]]
        per_mode[mode] = {
            "next_mean_ms": 1e3 * _mean(nexts),
            "next_median_ms": 1e3 * statistics.median(nexts),
            "next_p90_ms": 1e3 * sorted(nexts)[int(0.9 * (len(nexts) - 1))],
            "window_median_ms": 1e3 * statistics.median(_window_sums(runs, window)) / window,
            "step_mean_ms": 1e3 * _mean(steps),
            "wait_mean_ms": 1e3 * _mean([x for run in runs for x in run["wait_s"]]),
            "collate_mean_ms": 1e3 * _mean([x for run in runs for x in run["collate_s"]]),
            "exchange_per_window_ms": 1e3 * _mean(exchanges) if exchanges else None,
            "exchange_per_microbatch_ms": 1e3 * _mean(exchanges) / window if exchanges else None,
            "exchanges_on_training_thread": sum(run["exchange_on_main_thread"] for run in runs),
            "exchanges": len(exchanges),
            "micro_batches_timed": len(nexts),
        }
        flags = [c for run in runs for c in run["concurrent"]]
        with_exchange = [x for x, c in zip(nexts, flags) if c]
        without = [x for x, c in zip(nexts, flags) if not c]
        per_mode[mode]["concurrent_share"] = len(with_exchange) / len(nexts) if nexts else 0.0
        per_mode[mode]["next_concurrent_median_ms"] = 1e3 * statistics.median(with_exchange) if with_exchange else None
        per_mode[mode]["next_alone_median_ms"] = 1e3 * statistics.median(without) if without else None
    entry: dict[str, Any] = {"window": window, "modes": per_mode}
    for overlapped in [m for m in ("on", DELAYED) if m in per_mode]:
        for statistic in ("next_mean_ms", "window_median_ms"):
            key = f"{overlapped}/{statistic}"
            entry[key] = _hidden(*(per_mode[m][statistic] for m in (overlapped, "off", "none")))
        # Per rank and round (means), to show the spread of the estimate.
        each = []
        for r in results:
            for round_index in range(opts["rounds"]):
                means = {run["mode"]: _mean(run["next_s"]) for run in r["runs"] if run["window"] == window and run["round"] == round_index}
                each.append(_hidden(means[overlapped], means["off"], means["none"]))
        each = [x for x in each if x == x]
        entry[f"{overlapped}/spread"] = (min(each, default=float("nan")), max(each, default=float("nan")))
    entry["exposed_mean_ms"] = per_mode["off"]["next_mean_ms"] - per_mode["none"]["next_mean_ms"]
    entry["exposed_median_ms"] = per_mode["off"]["window_median_ms"] - per_mode["none"]["window_median_ms"]
    summary["overlap"].append(entry)

    on_runs = [run for r in results for run in r["runs"] if run["window"] == window and run["mode"] == "on"]
    off_runs = [run for r in results for run in r["runs"] if run["window"] == window and run["mode"] == "off"]
    window_bytes = _mean([b for run in on_runs + off_runs for b in run["window_bytes"]])
    received = _mean([b for run in on_runs + off_runs for b in run["received_bytes"]])
    growth_on = max(run["rss_peak_growth"] for run in on_runs)
    growth_off = max(run["rss_peak_growth"] for run in off_runs)
    summary["memory"].append({
        "window": window,
        "window_mb": window_bytes / 1e6,
        "max_queued": max(run["max_queued"] for run in on_runs),
        "max_produced_ahead": max(run["max_produced_ahead"] for run in on_runs),
        "max_in_flight": max(run["max_in_flight"] for run in on_runs),
        "max_held": max(run["max_held"] for run in on_runs),
        "rss_growth_on_mb": growth_on / 1e6,
        "rss_growth_off_mb": growth_off / 1e6,
        "extra_windows_rss": (growth_on - growth_off) / window_bytes if window_bytes else float("nan"),
        "received_mb": received / 1e6,
        "extra_received_rss": (growth_on - growth_off) / received if received else float("nan"),
        "sampler_samples": sum(run["sampler_samples"] for run in on_runs),
    })


def _summarize_bandwidth(summary: dict, results: list[dict], window: int) -> None:
    bw = [b for r in results for b in r["bandwidth"] if b["window"] == window]
    count = len(bw[0]["exchange_s"])
    exchange_t = [max(b["exchange_s"][i] for b in bw) for i in range(count)]  # the slowest rank ends the collective
    raw_t = [max(b["raw_s"][i] for b in bw) for i in range(count)]
    fresh_t = [max(b["fresh_s"][i] for b in bw) for i in range(count)]
    moved = [sum(b["sent_bytes"][i] for b in bw) for i in range(count)]
    keep = [i for i in range(count) if moved[i] > 0]
    total_bytes = sum(moved[i] for i in keep)
    t_exchange = sum(exchange_t[i] for i in keep)
    t_raw = sum(raw_t[i] for i in keep)
    t_fresh = sum(fresh_t[i] for i in keep)
    profile: dict[str, float] = {}
    for b in bw:
        for name, seconds in b["profile_s"].items():
            profile[name] = profile.get(name, 0.0) + seconds / len(bw)
    per_exchange = {name: 1e3 * seconds / count for name, seconds in profile.items()}
    summary["bandwidth"].append({
        "window": window,
        "exchanges": count,
        "with_moves": len(keep),
        "windows_without_moves": sum(1 for moving in bw[0]["moves"] if not moving),
        "mean_bytes_moved_mb": total_bytes / len(keep) / 1e6 if keep else 0.0,
        "mean_window_mb_per_rank": _mean([x for b in bw for x in b["window_bytes"]]) / 1e6,
        "exchange_ms": 1e3 * t_exchange / len(keep) if keep else float("nan"),
        "raw_ms": 1e3 * t_raw / len(keep) if keep else float("nan"),
        "exchange_gbps": total_bytes / t_exchange / 1e9 if t_exchange else float("nan"),
        "raw_gbps": total_bytes / t_raw / 1e9 if t_raw else float("nan"),
        "ratio": t_raw / t_exchange if t_exchange else float("nan"),
        "fresh_ms": 1e3 * t_fresh / len(keep) if keep else float("nan"),
        "fresh_gbps": total_bytes / t_fresh / 1e9 if t_fresh else float("nan"),
        "ratio_fresh": t_fresh / t_exchange if t_exchange else float("nan"),
        "profile_ms_per_exchange": per_exchange,
    })


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(summary: dict, opts: dict, info: dict, command: str, seconds: float) -> str:
    world = opts["ranks"]
    topology = " + ".join(f"`{c}`" for c in COMPONENTS[world])
    lines = [
        "### Overlap, bandwidth and memory (`benchmarks/exchange.py`)",
        "",
        f"{world} ranks ({topology}), {'Gloo on the CPU' if opts['backend'] == 'gloo' else 'NCCL, one GPU per rank'}, one process per rank, 1 torch thread each; "
        f"SyntheticProcessedDataset ({opts['dataset_size']} samples, {'made once up front' if opts['dataset'] == 'cached' else 'made on every read'}), "
        f"patch_dim {opts['patch_dim']}, micro-batch {opts['micro_batch_size']} "
        f"({opts['micro_batch_size'] // 2} samples per rank), seq_length {opts['seq_length']}. Simulated compute per micro-batch: "
        f"{opts['compute']} {opts['compute_ms']:g} ms, then a one-number all-reduce over the DP group. "
        f"{opts['rounds']} rounds of the {len(modes(opts))} modes (order rotated per round), {opts['steps']} micro-batches per run, the first "
        f"{opts['warmup']} not timed. Whole run: {seconds:.0f} s.",
        *_dist.provenance_lines(command, info),
        "**Training-thread time in `next()` per micro-batch** (all ranks, all rounds; exchange = time inside "
        "`exchange_window`, on whichever thread ran it):",
        "",
        "| W | mode | next() mean ms | median ms | p90 ms | median over windows, ms per micro-batch | of which waiting for the exchange, mean ms | of which collating, mean ms | step mean ms | exchange ms per micro-batch |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for entry in summary["overlap"]:
        for mode in modes(opts):
            m = entry["modes"][mode]
            thread = "" if m["exchange_per_microbatch_ms"] is None else (" (training thread)" if m["exchanges_on_training_thread"] else " (background)")
            lines.append(f"| {entry['window']} | {MODE_NAMES[mode]} | {_fmt(m['next_mean_ms'])} | {_fmt(m['next_median_ms'])} | "
                         f"{_fmt(m['next_p90_ms'])} | {_fmt(m['window_median_ms'])} | {_fmt(m['wait_mean_ms'])} | {_fmt(m['collate_mean_ms'])} | "
                         f"{_fmt(m['step_mean_ms'], 1)} | {_fmt(m['exchange_per_microbatch_ms'])}{thread} |")
    lines += [
        "",
        "Share of the exchange hidden by overlap, hidden = 1 - (next_on - next_none) / (next_off - next_none), from "
        "the means, and from the medians over windows (next() summed over a window's W micro-batches, median over "
        "windows, / W: robust to the other work's scheduling spikes); spread = the mean-based figure per rank and round.",
        "",
        "| W | overlap | exposed without overlap (off - none), mean / median ms per micro-batch | hidden (means) | hidden (medians over windows) | spread per rank and round | target >= 95% |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for entry in summary["overlap"]:
        for overlapped in [m for m in ("on", DELAYED) if f"{m}/next_mean_ms" in entry]:
            by_mean, by_median = entry[f"{overlapped}/next_mean_ms"], entry[f"{overlapped}/window_median_ms"]
            low, high = entry[f"{overlapped}/spread"]
            verdict = "met" if min(by_mean, by_median) >= 0.95 else ("met by one estimate" if max(by_mean, by_median) >= 0.95 else "not met")
            name = MODE_NAMES[overlapped] + (f" ({opts['prefetch_delay_ms']:g} ms, diagnostic)" if overlapped == DELAYED else "")
            lines.append(f"| {entry['window']} | {name} | {_fmt(entry['exposed_mean_ms'])} / {_fmt(entry['exposed_median_ms'])} | "
                         f"{100 * by_mean:.1f}% | {100 * by_median:.1f}% | {100 * low:.0f}% .. {100 * high:.0f}% | {verdict} |")
    lines += [
        "",
        "Overlapped modes: next() calls during which a background exchange ran (in flight when the call began, or "
        "started during it) against calls that ran alone:",
        "",
        "| W | mode | calls with an exchange running | next() median ms, exchange running | next() median ms, alone |",
        "|---:|---|---:|---:|---:|",
    ]
    for entry in summary["overlap"]:
        for overlapped in [m for m in ("on", DELAYED) if m in entry["modes"]]:
            m = entry["modes"][overlapped]
            lines.append(f"| {entry['window']} | {MODE_NAMES[overlapped]} | {100 * m['concurrent_share']:.0f}% | "
                         f"{_fmt(m['next_concurrent_median_ms'])} | {_fmt(m['next_alone_median_ms'])} |")
    if summary.get("collation_contention_ms"):
        c = summary["collation_contention_ms"]
        lines += [
            "",
            "Is it the GIL? In the benchmark's own process before the ranks start (no ranks running): median time "
            "to collate 4 samples alone and next to a second thread that loops over the exchange's packing and "
            "unpacking of 4 samples, over plain copies of the same bytes into new or into reused memory (no Python, "
            "GIL released), or over pure Python (holds the GIL); median of 3 interleaved rounds of 40:",
            "",
            "| " + " | ".join(f"{name} ms" for name in c) + " |",
            "|" + "---:|" * len(c),
            "| " + " | ".join(f"{value:.2f}" for value in c.values()) + " |",
        ]
    lines += [
        "",
        f"**Bandwidth**: `exchange_window` against a raw `all_to_all_single` of the same byte splits on the same "
        f"group, {opts['bandwidth_windows']} windows x {opts['bandwidth_reps']} repetitions per W, the three "
        "interleaved; time of the slower rank; bytes = all ranks' sent bytes; windows where nothing moves are left "
        "out. raw: preallocated buffers, the collective alone. raw, fresh buffers: a new send buffer filled by one "
        "copy and a new receive buffer, as any exchange that hands out new tensors must do.",
        "",
        "| W | windows timed | MB moved per exchange | window MB per rank | exchange ms | raw ms | raw, fresh buffers ms | exchange GB/s | raw GB/s | raw, fresh GB/s | exchange / raw | exchange / raw, fresh |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b in summary["bandwidth"]:
        lines.append(f"| {b['window']} | {b['with_moves']} / {b['exchanges']} | {_fmt(b['mean_bytes_moved_mb'], 1)} | "
                     f"{_fmt(b['mean_window_mb_per_rank'], 1)} | {_fmt(b['exchange_ms'])} | {_fmt(b['raw_ms'])} | "
                     f"{_fmt(b['fresh_ms'])} | {_fmt(b['exchange_gbps'])} | {_fmt(b['raw_gbps'])} | {_fmt(b['fresh_gbps'])} | "
                     f"{100 * b['ratio']:.0f}% | {100 * b['ratio_fresh']:.0f}% |")
    lines += ["", "Where an exchange's time goes (ms per exchange, mean over ranks; the all_to_all includes waiting for the peer):", "",
              "| W | layouts + costs | cost all-gather | plan | pack (move - all_to_all - unpack) | all_to_all | unpack |",
              "|---:|---:|---:|---:|---:|---:|---:|"]
    for b in summary["bandwidth"]:
        p = b["profile_ms_per_exchange"]
        pack = p.get("_move", 0.0) - p.get("all_to_all", 0.0) - p.get("unpack_samples", 0.0)
        lines.append(f"| {b['window']} | {_fmt(p.get('local_costs_and_layouts'))} | {_fmt(p.get('_gather_header'))} | "
                     f"{_fmt(p.get('_plan'))} | {_fmt(pack)} | {_fmt(p.get('all_to_all'))} | {_fmt(p.get('unpack_samples'))} |")
    lines += [
        "",
        "**Memory with overlap**: windows exchanged but not yet delivered (the prefetcher's result queue; "
        "produced - delivered), exchanges in flight on the prefetch thread, and their sum, sampled every 2 ms; "
        "peak RSS growth over the run (from just before the first next(), after handing freed memory back to the "
        "system), overlap on vs off. A window's samples that stay on their rank are the dataset's own objects here "
        "(made once up front), so the new memory a held window pins is what it received from the peer.",
        "",
        "| W | window MB per rank | received MB per rank and window | max queued | max produced - delivered | max in flight | max queued + in flight | RSS growth on MB | RSS growth off MB | on - off, in windows | on - off, in received bytes per window |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in summary["memory"]:
        lines.append(f"| {m['window']} | {_fmt(m['window_mb'], 1)} | {_fmt(m['received_mb'], 1)} | {m['max_queued']} | "
                     f"{m['max_produced_ahead']} | {m['max_in_flight']} | {m['max_held']} | {_fmt(m['rss_growth_on_mb'], 0)} | "
                     f"{_fmt(m['rss_growth_off_mb'], 0)} | {_fmt(m['extra_windows_rss'], 1)} | {_fmt(m['extra_received_rss'], 1)} |")
    return "\n".join(lines)


def nccl_unavailable(ranks: int) -> str | None:
    import torch

    from mimo_pipes.exchange import ExchangeContext

    if "device" not in ExchangeContext.__dataclass_fields__:
        return "ExchangeContext has no device field: this version of mimo_pipes cannot run the exchange over NCCL"
    if not torch.cuda.is_available():
        return "no CUDA device"
    if os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "").strip() == "1":
        return ("CUDA_DEVICE_MAX_CONNECTIONS=1: an overlapped NCCL exchange next to the DP all-reduce can deadlock "
                "(the library refuses it too); unset it for this benchmark")
    needed = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])) if _dist.under_torchrun() else ranks
    if torch.cuda.device_count() < needed:
        return f"{torch.cuda.device_count()} CUDA device(s) for {needed} local ranks; NCCL needs one per rank"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--ranks", type=int, choices=(2, 4), default=2, help="2: language=dp=2; 4: language=dp=2 + images=dp=2")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="gloo: CPU; nccl: one GPU per rank")
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 4], help="window sizes W")
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--patch-dim", type=int, default=1176, help="pixel_values row width (1176: Qwen2-VL)")
    parser.add_argument("--dataset", choices=("cached", "live"), default="cached",
                        help="cached: samples made once up front (modes differ by the exchange alone); live: made on every read")
    parser.add_argument("--dataset-size", type=int, default=64)
    parser.add_argument("--compute-ms", type=float, default=150.0, help="simulated compute per micro-batch")
    parser.add_argument("--compute", choices=("sleep", "spin"), default="sleep",
                        help="sleep: the thread waits (as on a GPU); spin: a Python busy loop holding the GIL")
    parser.add_argument("--prefetch-delay-ms", type=float, default=0.0,
                        help="diagnostic: start each background exchange no sooner than this after the consumer took "
                        "the previous window (separates the exchange's own cost from its CPU contention with collation)")
    parser.add_argument("--steps", type=int, default=20, help="micro-batches per run (rounded up to a multiple of W)")
    parser.add_argument("--warmup", type=int, default=4, help="first micro-batches of each run not timed")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of all modes, order rotated per round (0: bandwidth only)")
    parser.add_argument("--bandwidth-windows", type=int, default=6)
    parser.add_argument("--bandwidth-reps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--exchange-transport", choices=("nccl", "gloo"), default="nccl",
                        help="with --backend nccl: the exchange group's backend (gloo: CPU bytes beside an NCCL trainer)")
    parser.add_argument("--out", help="directory for results.json")
    parser.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks.md")
    args = parser.parse_args()
    for window in args.windows:
        if window < 1 or -(-args.steps // window) <= -(-args.warmup // window):
            parser.error(f"--steps {args.steps} leaves no timed micro-batch after --warmup {args.warmup} at W={window}")
    opts = {key: value for key, value in vars(args).items()}
    collecting = not _dist.under_torchrun() or int(os.environ["RANK"]) == 0
    if args.backend == "nccl":
        reason = nccl_unavailable(args.ranks)
        if reason is not None:
            result = {"skipped": True, "backend": "nccl", "reason": reason}
            if collecting:
                print(json.dumps(result))
                if args.out:
                    os.makedirs(args.out, exist_ok=True)
                    with open(os.path.join(args.out, "exchange_nccl.json"), "w") as handle:
                        json.dump(result, handle, indent=1)
            return 0
    if _dist.under_torchrun() and int(os.environ["WORLD_SIZE"]) != args.ranks:
        parser.error(f"--ranks {args.ranks} but torchrun started {os.environ['WORLD_SIZE']} processes")
    info = _dist.machine()
    command = _dist.command_line()
    if collecting:
        print(f"{args.ranks} ranks, {args.backend}, windows {args.windows}, compute {args.compute} {args.compute_ms:g} ms, "
              f"{args.rounds} rounds x {args.steps} micro-batches per mode; nproc {info['nproc']}", flush=True)
    child_env = {"OMP_NUM_THREADS": "1"}
    contention = collation_contention(opts) if collecting and args.backend == "gloo" else None
    if contention:
        print("  collation (one process, median ms): " + ", ".join(f"{k} {v:.2f}" for k, v in contention.items()), flush=True)
    started = time.perf_counter()
    world_backend = "cpu:gloo,cuda:nccl" if args.backend == "nccl" else "gloo"
    results = _dist.run_ranks(rank_main, args.ranks, (opts,), backend=world_backend, timeout_s=args.timeout_s * 4, env=child_env)
    seconds = time.perf_counter() - started
    if results is None:  # a torchrun rank other than 0
        return 0
    summary = summarize(results, opts)
    summary["collation_contention_ms"] = contention
    payload = {"options": opts, "machine": info, "command": command, "seconds": seconds, "summary": summary}
    text = render(summary, opts, info, command, seconds)
    print()
    print(text)
    print()
    print(json.dumps(summary))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        name = "exchange_nccl.json" if args.backend == "nccl" else "exchange.json"
        with open(os.path.join(args.out, name), "w") as handle:
            json.dump({**payload, "raw": results}, handle, indent=1)
    if args.backend == "gloo" and not args.no_docs:
        _dist.write_results(MARKER, text)
        print(f"results written to {os.path.relpath(_dist.DOCS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
