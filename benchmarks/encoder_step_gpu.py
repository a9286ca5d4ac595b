"""Vision-tower step time per DP rank, fed by the library's real loaders: the straggler reordering removes.

One vision module of DP d (2 and 4): d Gloo ranks on the CPU each run the library's graph
(``mimo_pipes_recipes.vlm_sft.build``: embedded data, the real processor, the balance exchange when
reordering is on) and put every micro-batch (pixel_values, image_grid_thw, sample ids) on a queue. This
process runs a Qwen2-VL-style tower (``qwen2-vl-675m``, bf16, sdpa; random weights time like trained
ones) on one device, rank after rank: forward and backward of each rank's micro-batch, timed with CUDA
events (warm-up steps excluded). A step's vision time on d real GPUs is its slowest rank's time, so the
sum over steps of the slowest rank is the vision critical path; reordering should lower it.

Matrix: dp {2, 4} x micro-batch {8, 16} x {off, on window 1, on window 4, on window 4 across micro-batches}.
Every mode of a (dp, micro-batch) pair reads the same global micro-batches (checked).

    python3 benchmarks/encoder_step_gpu.py --device cuda --out DIR      # the whole matrix, one H200
    python3 benchmarks/encoder_step_gpu.py --device cpu --smoke --out DIR   # tiny tower, two steps (tests)

Writes DIR/encoder_step.json (every step, every rank) and DIR/encoder_step.md (the table).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import _dist  # noqa: E402  (benchmarks/_dist.py)


def _recipes_importable() -> None:
    """``recipes/`` installs as ``mimo_pipes_recipes``; from a plain checkout (no ``pip install``) map it here.
    Runs at import, so the spawned loader ranks get it too."""
    import importlib.util

    if importlib.util.find_spec("mimo_pipes_recipes") is None:
        init = os.path.join(ROOT, "recipes", "__init__.py")
        spec = importlib.util.spec_from_file_location("mimo_pipes_recipes", init, submodule_search_locations=[os.path.dirname(init)])
        module = importlib.util.module_from_spec(spec)
        sys.modules["mimo_pipes_recipes"] = module
        spec.loader.exec_module(module)


_recipes_importable()


@dataclass(frozen=True)
class Mode:
    name: str
    reorder: bool
    window: int = 1
    across: bool = False


MODES = (
    Mode("off", False),
    Mode("on, window 1", True),
    Mode("on, window 4", True, 4),
    Mode("on, window 4, across", True, 4, True),
)
GOALS = {(2, 8): 12.0, (4, 16): 25.0}  # % drop of the slowest-rank time with per-micro-batch reordering


@dataclass(frozen=True)
class Case:
    dp: int
    micro_batch: int
    mode: Mode


# ---------------------------------------------------------------------------------------------------------
# Loader ranks: Gloo processes on the CPU, one per DP rank of the largest dp; smaller dps use a subgroup.


def _loader_rank(rank: int, world: int, port: int, dps: list[int], tasks: Any, batches: Any, args: dict) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # Long timeout: dp-4 ranks build their next loader (and wait in its exchange) while dp-2 cases still run.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=3600))
    groups = {dp: dist.new_group(list(range(dp))) for dp in dps}  # collective: every rank, same order
    try:
        _serve_cases(rank, groups, tasks, batches, args)
    except BaseException as error:
        # The main process waits on this rank's micro-batches: tell it, or it waits out its timeout.
        batches.put((-1, -1, rank, f"loader rank {rank}: {type(error).__name__}: {error}"))
        raise
    dist.destroy_process_group()


def _serve_cases(rank: int, groups: dict, tasks: Any, batches: Any, args: dict) -> None:
    """Build each case's loader (this rank's part of it) and send its micro-batches, until told to stop."""
    from mimo_pipes.data.embedded.builtin_processor import default_processor_path
    from mimo_pipes.data.processing.processor import load_processor
    from mimo_pipes.exchange import RankLayout
    from mimo_pipes_recipes import vlm_sft

    rows = GeneratedRows(args["embedded_samples"])
    processor = load_processor(default_processor_path(), args["seq_length"])
    while (task := tasks.get()) is not None:
        index, case, steps = task
        if rank >= case.dp:
            continue
        loader = vlm_sft.pipeline(rows, _config(case, args), RankLayout(rank, case.dp, case.dp, groups[case.dp]), map_fn=processor,
                                  image_token_id=processor.image_token_id,
                                  pad_values={"input_ids": processor.pad_token_id, "labels": -100})
        try:
            loader.end_at(steps)  # nothing read past the case's last window
            for step in range(steps):
                batches.put((index, step, rank, _payload(next(loader), args["bf16"])))
        finally:
            loader.close()


def _payload(batch: dict, bf16: bool) -> dict:
    """One rank's micro-batch as plain arrays; a micro-batch of text-only samples has no pixels (None)."""
    has_pixels = "pixel_values" in batch
    return {
        "pixel_values": to_wire(batch["pixel_values"], bf16) if has_pixels else None,
        "image_grid_thw": batch["image_grid_thw"].numpy() if has_pixels else None,
        "sample_ids": list(batch["sample_ids"]),
        "image_tokens": list(batch["image_tokens"]),
    }


class GeneratedRows:
    """The embedded dataset's rows (``mimo_pipes.data.embedded.synthetic``, seed 0), generated on first access and kept:
    the same rows ``mimo-pipes run`` reads from its saved copy, without needing ``datasets`` on the GPU host."""

    def __init__(self, size: int, seed: int = 0) -> None:
        from mimo_pipes.data.embedded.synthetic import sample_kinds

        self.kinds = sample_kinds(size, seed)
        self.seed = seed
        self.rows: dict[int, dict] = {}

    def __len__(self) -> int:
        return len(self.kinds)

    def __getitem__(self, index: int) -> dict:
        from mimo_pipes.data.embedded.synthetic import make_row

        if index not in self.rows:
            self.rows[index] = make_row(index, self.kinds[index], self.seed)
        return dict(self.rows[index])


def to_wire(pixel_values: Any, bf16: bool) -> Any:
    """Plain numpy bytes through the pipe (no shared-memory tensors: /dev/shm is small in many containers),
    already in the tower's dtype (bf16 travels as int16 bits), so the pipe carries half the bytes."""
    import torch

    return pixel_values.to(torch.bfloat16).view(torch.int16).numpy() if bf16 else pixel_values.numpy()


def from_wire(array: Any, bf16: bool) -> Any:
    import torch

    tensor = torch.from_numpy(array)
    return tensor.view(torch.bfloat16) if bf16 else tensor


def _config(case: Case, args: dict):
    from mimo_pipes.config import PipelineConfig, ReorderConfig

    mode = case.mode
    return PipelineConfig(
        components=(f"language=dp={case.dp}",),
        micro_batch_size=case.micro_batch,
        global_batch_size=case.micro_batch * 4,
        seq_length=args["seq_length"],
        seed=args["seed"],
        embedded_samples=args["embedded_samples"],
        num_workers=args["num_workers"],
        reorder=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=mode.reorder, reorder_window_size=mode.window,
                              reorder_across_microbatches=mode.across),
    )


# ---------------------------------------------------------------------------------------------------------
# The device side: one tower, every rank's micro-batch in turn.


class Timer:
    """Device time of a block: CUDA events on a GPU, the wall clock on the CPU."""

    def __init__(self, device: str) -> None:
        import torch

        self.cuda = device.startswith("cuda")
        self.torch = torch

    def start(self) -> Any:
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, begun: Any) -> Any:
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            return (begun, event)
        return time.perf_counter() - begun

    def milliseconds(self, measured: Any) -> float:
        if self.cuda:
            measured[1].synchronize()
            return measured[0].elapsed_time(measured[1])
        return measured * 1000.0


def fwd_bwd(tower: Any, payload: dict, device: str) -> Any:
    """Forward and backward of one rank's micro-batch; inputs are on the device before the timer starts."""
    from mimo_pipes.demo_model.encoders import encode

    if payload["pixel_values"].shape[0] == 0:
        return None
    output = encode(tower, payload["pixel_values"], payload["image_grid_thw"])
    output.float().square().mean().backward()
    return output


WARM_UP_GRIDS = ([[1, 32, 32]], [[1, 64, 64]], [[4, 16, 16]], [[1, 96, 96]], [[2, 40, 60]])


def warm_up(tower: Any, device: str, grids_list: tuple = WARM_UP_GRIDS) -> None:
    """A few forwards and backwards of several image shapes before anything is timed (allocator growth,
    kernel selection), so the first case is not charged for them."""
    import torch

    from mimo_pipes.demo_model.encoders import patch_dim

    dtype = next(tower.parameters()).dtype
    for grids in grids_list:
        grid = torch.tensor(grids)
        pixels = torch.randn(int(grid.prod(dim=1).sum()), patch_dim(tower.config), dtype=dtype, device=device)
        for _ in range(2):
            fwd_bwd(tower, {"pixel_values": pixels, "image_grid_thw": grid}, device)
            tower.zero_grad(set_to_none=True)
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_case(tower: Any, timer: Timer, device: str, case_index: int, case: Case, steps: int, warmup: int,
             pending: dict, batches: Any) -> dict[str, Any]:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    # Every micro-batch of the case first, then the timing: the loader ranks sit idle while the device
    # works, so their CPU load cannot slow the kernel launches being timed.
    collected = [_collect(case_index, step, case.dp, pending, batches) for step in range(steps)]
    per_step = []
    for step, payloads in enumerate(collected):
        times = []
        for rank in range(case.dp):
            payload = payloads[rank]
            dtype = next(tower.parameters()).dtype
            if payload["pixel_values"] is None:  # text-only samples: nothing for the tower (fwd_bwd skips it)
                on_device = {"pixel_values": torch.zeros(0, 0), "image_grid_thw": torch.zeros(0, 3, dtype=torch.int64)}
            else:
                on_device = {
                    "pixel_values": from_wire(payload["pixel_values"], dtype == torch.bfloat16).to(device, dtype=dtype),
                    "image_grid_thw": torch.from_numpy(payload["image_grid_thw"]),
                }
            begun = timer.start()
            fwd_bwd(tower, on_device, device)
            times.append(timer.stop(begun))
            tower.zero_grad(set_to_none=True)
        per_step.append({
            "step": step,
            "rank_ms": [timer.milliseconds(t) for t in times],
            "sample_ids": [payloads[r]["sample_ids"] for r in range(case.dp)],
            "image_tokens": [sum(payloads[r]["image_tokens"]) for r in range(case.dp)],
        })
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None
    timed = per_step[warmup:]
    slowest = [max(s["rank_ms"]) for s in timed]
    mean = [sum(s["rank_ms"]) / len(s["rank_ms"]) for s in timed]
    return {
        "dp": case.dp,
        "micro_batch": case.micro_batch,
        "mode": case.mode.name,
        "steps_timed": len(timed),
        "rank_sum_ms": [sum(s["rank_ms"][r] for s in timed) for r in range(case.dp)],
        "slowest_sum_ms": sum(slowest),
        "mean_sum_ms": sum(mean),
        "slowest_over_mean": sum(slowest) / sum(mean) if sum(mean) else float("nan"),
        "peak_gib": peak,
        "steps": per_step,
    }


def _collect(case_index: int, step: int, dp: int, pending: dict, batches: Any) -> dict[int, dict]:
    """This step's micro-batch of every rank; items of later steps wait in ``pending``."""
    while sum(1 for r in range(dp) if (case_index, step, r) in pending) < dp:
        index, got_step, rank, payload = batches.get(timeout=600)
        if got_step < 0:
            raise RuntimeError(payload)
        pending[(index, got_step, rank)] = payload
    return {r: pending.pop((case_index, step, r)) for r in range(dp)}


# ---------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (one GPU) or cpu (default cuda)")
    parser.add_argument("--out", required=True, help="folder for encoder_step.json and encoder_step.md")
    parser.add_argument("--smoke", action="store_true", help="tiny fp32 tower, dp 2, micro-batch 2, two steps: checks the script runs")
    parser.add_argument("--tower", default=None, help="vision tower preset or config folder (default qwen2-vl-675m; tiny with --smoke)")
    parser.add_argument("--dp", type=int, nargs="+", default=None, help="vision DP sizes (default 2 4)")
    parser.add_argument("--micro-batch", type=int, nargs="+", default=None, help="global micro-batch sizes (default 8 16)")
    parser.add_argument("--steps", type=int, default=None, help="timed micro-batches per configuration (default 32)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed micro-batches before them (default 2)")
    parser.add_argument("--attn", default="sdpa", help="attention implementation of the tower (default sdpa)")
    parser.add_argument("--seq-length", type=int, default=2048, help="processor --seq-length (default 2048)")
    parser.add_argument("--embedded-samples", type=int, default=512, help="size of the embedded dataset (default 512)")
    parser.add_argument("--num-workers", type=int, default=3, help="processing threads per loader rank (default 3)")
    parser.add_argument("--seed", type=int, default=1234, help="data seed (default 1234)")
    parser.add_argument("--passes", type=int, default=1,
                        help="run the whole matrix this many times and report the last pass, whose images the "
                             "tower has all seen before (default 1)")
    args = parser.parse_args(argv)

    smoke = args.smoke
    tower_name = args.tower or ("tiny" if smoke else "qwen2-vl-675m")
    dps = args.dp or ([2] if smoke else [2, 4])
    micro_batches = args.micro_batch or ([2] if smoke else [8, 16])
    steps = args.steps if args.steps is not None else (2 if smoke else 32)
    warmup = args.warmup if args.warmup is not None else (0 if smoke else 2)
    for dp in dps:
        for mb in micro_batches:
            if mb % dp:
                parser.error(f"--micro-batch {mb} is not divisible by --dp {dp}")
    os.makedirs(args.out, exist_ok=True)
    started = time.monotonic()


    import torch

    from mimo_pipes.data.embedded.builtin_processor import default_processor_path
    from mimo_pipes.demo_model.encoders import build_vision_tower
    from mimo_pipes.samples.worker_start import worker_context

    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    loader_args = {"seq_length": args.seq_length, "seed": args.seed, "embedded_samples": args.embedded_samples,
                   "num_workers": args.num_workers, "bf16": dtype == torch.bfloat16}
    default_processor_path()  # build the embedded processor once, before the loader ranks load it
    tower = build_vision_tower(tower_name, dtype=dtype, device=args.device, attn_implementation=args.attn)
    tower.train()
    timer = Timer(args.device)

    cases = [Case(dp, mb, mode) for dp in dps for mb in micro_batches for mode in MODES] * max(args.passes, 1)
    # The loader ranks are forked from the library's worker server (torch and the processor's modules imported
    # once, not in every rank); each rank still sets its own one thread and process group.
    context = worker_context()
    tasks = [context.Queue() for _ in range(max(dps))]
    batches = context.Queue(maxsize=4 * max(dps))
    port = _dist._free_port()
    ranks = [context.Process(target=_loader_rank, args=(r, max(dps), port, dps, tasks[r], batches, loader_args), daemon=True)
             for r in range(max(dps))]
    for process in ranks:
        process.start()
    warm_up(tower, args.device, WARM_UP_GRIDS[:1] if smoke else WARM_UP_GRIDS)  # a smoke times nothing that matters

    results: list[dict[str, Any]] = []
    pending: dict = {}
    try:
        for index, case in enumerate(cases):
            for queue in tasks:  # one case at a time: nothing loads while the device is timed
                queue.put((index, case, warmup + steps))
            result = run_case(tower, timer, args.device, index, case, warmup + steps, warmup, pending, batches)
            results.append(result)
            print(f"[{time.monotonic() - started:6.0f}s] dp {case.dp} mb {case.micro_batch} {case.mode.name:<22} "
                  f"slowest {result['slowest_sum_ms']:9.1f} ms  mean {result['mean_sum_ms']:9.1f} ms", file=sys.stderr, flush=True)
    finally:
        # Only now: a loader rank that exits takes the shared memory of batches not yet received with it.
        for queue in tasks:
            queue.put(None)
        for process in ranks:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()

    results = results[len(results) - len(results) // max(args.passes, 1):]  # the last pass
    check_same_samples(results)
    report = {
        "machine": _dist.machine(),
        "command": "python3 benchmarks/encoder_step_gpu.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "tower": tower_name,
        "attn": args.attn,
        "dtype": str(dtype),
        "steps": steps,
        "warmup": warmup,
        "passes": max(args.passes, 1),
        "modes": [asdict(mode) for mode in MODES],
        "wall_s": time.monotonic() - started,
        "results": results,
    }
    with open(os.path.join(args.out, "encoder_step.json"), "w") as handle:
        json.dump(report, handle, indent=1)
    table = markdown(report)
    with open(os.path.join(args.out, "encoder_step.md"), "w") as handle:
        handle.write(table + "\n")
    print(table)
    return 0


def check_same_samples(results: list[dict[str, Any]]) -> None:
    """Every mode of a (dp, micro-batch) pair must have read the same global micro-batches (windows of 4
    across micro-batches: the same window), or the comparison would be meaningless."""
    def batches(result: dict, per: int) -> list[set]:
        steps = result["steps"]
        return [set().union(*(set(ids) for s in steps[i : i + per] for ids in s["sample_ids"])) for i in range(0, len(steps) - per + 1, per)]

    by_pair: dict[tuple[int, int], list[dict]] = {}
    for result in results:
        by_pair.setdefault((result["dp"], result["micro_batch"]), []).append(result)
    for pair, group in by_pair.items():
        reference = group[0]
        for result in group[1:]:
            per = 4 if "across" in result["mode"] else 1
            if batches(result, per) != batches(reference, per):
                raise AssertionError(f"dp {pair[0]} mb {pair[1]}: mode {result['mode']!r} read other samples than {reference['mode']!r}")


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"Vision tower `{report['tower']}` ({report['dtype']}, {report['attn']}) on {report['device']}, forward + backward per "
        f"micro-batch, {report['steps']} timed micro-batches per row after {report['warmup']} warm-up; "
        f"whole matrix {report['wall_s']:.0f} s.",
        "",
        "| dp | micro-batch | mode | slowest rank, sum (ms) | mean rank, sum (ms) | slowest / mean | per-rank sums (ms) | "
        "slowest vs off | peak GiB |",
        "|---:|---:|---|---:|---:|---:|---|---:|---:|",
    ]
    off: dict[tuple[int, int], float] = {}
    verdicts = []
    for r in report["results"]:
        pair = (r["dp"], r["micro_batch"])
        if r["mode"] == "off":
            off[pair] = r["slowest_sum_ms"]
        drop = 100.0 * (1 - r["slowest_sum_ms"] / off[pair]) if pair in off and off[pair] else float("nan")
        ranks = ", ".join(f"{v:.0f}" for v in r["rank_sum_ms"])
        peak = f"{r['peak_gib']:.1f}" if r["peak_gib"] is not None else "-"
        change = "-" if r["mode"] == "off" else f"{-drop:+.1f}%"
        lines.append(f"| {r['dp']} | {r['micro_batch']} | {r['mode']} | {r['slowest_sum_ms']:.0f} | {r['mean_sum_ms']:.0f} | "
                     f"{r['slowest_over_mean']:.3f} | {ranks} | {change} | {peak} |")
        if r["mode"] == "on, window 1" and pair in GOALS:
            verdicts.append(f"dp {pair[0]}, micro-batch {pair[1]}: slowest-rank time {drop:.1f}% lower with per-micro-batch "
                            f"reordering (goal >= {GOALS[pair]:.0f}%: {'met' if drop >= GOALS[pair] else 'NOT met'})")
    return "\n".join(lines + [""] + verdicts)


if __name__ == "__main__":
    sys.exit(main())
