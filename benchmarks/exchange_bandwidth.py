"""The exchange's throughput against a raw all_to_all_single of the same byte splits, with a per-phase profile.

On ready windows (reader, cost annotator, windower as the graph builds them), each rank alternates
``exchange_window`` (reusing its byte buffers, as the node does) with a raw ``all_to_all_single`` of the
same splits on the same group, on preallocated buffers and on fresh ones. The splits and the phase times
come from the exchange's own record (``exchange_window(..., record=...)``, mimo_pipes.observe.observer).

    python benchmarks/exchange_bandwidth.py [--ranks 2|4] [--windows 1 4] [--out DIR]
    torchrun --nproc-per-node 2 benchmarks/exchange_bandwidth.py --backend nccl --out DIR   # or spawned: without torchrun
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _dist  # noqa: E402  (benchmarks/_dist.py)
import _exchange as common  # noqa: E402  (benchmarks/_exchange.py)

MARKER = "exchange_bandwidth.py results"


def make_windows(env: dict, opts: dict, window: int, count: int) -> list:
    from mimo_pipes.nodes import CanonicalShardReader, CostAnnotator, Windower
    from mimo_pipes.testing import IMAGE_TOKEN_ID, tail_settings

    position, topology = env["groups"].position, env["topology"]
    config = common.pipeline_config(env["components"], opts, True, False, window)
    encoder_weight, language_weight = config.reorder.integer_cost_weights()
    node = CanonicalShardReader(env["dataset"], micro_batch_size=opts["micro_batch_size"], dp_rank=position.dp_rank,
                                dp_size=position.dp_size, grid_size=topology.grid_size,
                                seed=opts["seed"] + 1,  # other windows than the training runs'
                                dataloader_type="cyclic")
    settings = tail_settings(samples_per_rank=opts["micro_batch_size"] // position.dp_size, dp_size=position.dp_size,
                             window_size=window, reorder=True, image_token_id=IMAGE_TOKEN_ID,
                             encoder_weight=encoder_weight, language_weight=language_weight)
    node = CostAnnotator(node, settings=settings)
    node = Windower(node, settings=settings)
    node.reset()
    return [next(node) for _ in range(count)]


def _sync(device: Any) -> None:
    if device is not None:
        import torch

        torch.cuda.synchronize(device)


def splits_of(record: Any) -> tuple[list[int], list[int]] | None:
    """(send, receive) byte splits per peer of the window's all_to_all, from its record (None: nothing moved)."""
    from mimo_pipes.exchange.plan import plan_exchange

    if not record.bytes_sent and not record.bytes_received:
        return None
    plan = plan_exchange(record.assignment, record.dp_rank, record.dp_size, record.grid_size, record.micro_batch_size)
    sizes = [size for row in record.encoded_bytes for size in row]
    if not plan.any_moves:
        return None
    return plan.send_split_bytes(sizes), plan.recv_split_bytes(sizes)


def bandwidth(env: dict, opts: dict, window: int) -> dict:
    import torch
    import torch.distributed as dist

    from mimo_pipes.exchange import ExchangeBuffers, ExchangeContext, exchange_window
    from mimo_pipes.observe.observer import ExchangeRecord

    groups, topology, device = env["groups"], env["topology"], env["device"]
    position = groups.position
    reused = ExchangeBuffers()  # as the node runs it: results are dropped before the next exchange
    windows = make_windows(env, opts, window, opts["bandwidth_windows"])
    ctx = ExchangeContext(group=groups.exchange_group, dp_rank=position.dp_rank, dp_size=position.dp_size,
                          grid_size=topology.grid_size, samples_per_rank=opts["micro_batch_size"] // position.dp_size,
                          window_size=window, device=device)
    sequence = env["sequence"]

    def exchange(w: Any) -> Any:
        nonlocal sequence
        record = ExchangeRecord(sequence, w.first_step, ctx.dp_rank, ctx.dp_size, ctx.grid_size, ctx.across_microbatches)
        exchange_window(ctx, w, sequence, reused, record=record)
        sequence += 1
        return record

    splits = [splits_of(exchange(w)) for w in windows]  # untimed first pass: warms up, learns each window's splits
    buffers = []
    for split in splits:
        if split is None:
            buffers.append(None)
            continue
        host = torch.full((sum(split[0]),), 7, dtype=torch.uint8)
        buffers.append((host, host if device is None else host.to(device), torch.empty(sum(split[1]), dtype=torch.uint8, device=device)))
    exchange_s, raw_s, fresh_s, sent, window_bytes = [], [], [], [], []
    profile: dict[str, float] = {}
    for rep in range(opts["bandwidth_reps"]):
        for index, w in enumerate(windows):
            order = ("exchange", "raw", "fresh")
            order = order[(rep + index) % 3:] + order[: (rep + index) % 3]
            for what in order:
                dist.barrier(group=groups.dp_group)
                _sync(device)
                if what == "exchange":
                    start = time.perf_counter()
                    record = exchange(w)
                    exchange_s.append(time.perf_counter() - start)
                    sent.append(record.bytes_sent)
                    window_bytes.append(sum(row[k] for row in record.encoded_bytes for k in common.own_positions(record)))
                    for phase, seconds in record.seconds.items():
                        profile[phase] = profile.get(phase, 0.0) + seconds
                elif buffers[index] is None:
                    (raw_s if what == "raw" else fresh_s).append(0.0)
                elif what == "raw":  # preallocated buffers: the collective alone
                    _, send, recv = buffers[index]
                    start = time.perf_counter()
                    dist.all_to_all_single(recv, send, splits[index][1], splits[index][0], group=groups.exchange_group)
                    _sync(device)
                    raw_s.append(time.perf_counter() - start)
                else:  # fresh buffers, as any exchange that hands out new host tensors must use
                    host = buffers[index][0]
                    start = time.perf_counter()
                    staged = torch.empty_like(host).copy_(host)  # one copy into new memory (packing's floor)
                    if device is not None:
                        staged = staged.to(device)
                    recv = torch.empty(sum(splits[index][1]), dtype=torch.uint8, device=device)
                    dist.all_to_all_single(recv, staged, splits[index][1], splits[index][0], group=groups.exchange_group)
                    recv = recv.cpu()
                    _sync(device)
                    fresh_s.append(time.perf_counter() - start)
                    del staged, recv
    env["sequence"] = sequence
    return {"window": window, "exchange_s": exchange_s, "raw_s": raw_s, "fresh_s": fresh_s, "sent_bytes": sent,
            "moves": [split is not None for split in splits], "window_bytes": window_bytes, "profile_s": profile,
            "timed_exchanges": len(exchange_s)}


def rank_main(rank: int, world_size: int, opts: dict) -> dict:
    import torch.distributed as dist

    env = common.rank_env(world_size, opts)
    say = common.say(rank)
    results = []
    for window in opts["windows"]:
        started = time.perf_counter()
        results.append(bandwidth(env, opts, window))
        say(f"  bandwidth W={window}: {results[-1]['timed_exchanges']} timed exchanges ({time.perf_counter() - started:.1f} s)")
    dist.barrier()
    return {"rank": rank, "bandwidth": results}


def summarize(results: list[dict], opts: dict) -> dict:
    summary = []
    for window in opts["windows"]:
        bw = [b for r in results for b in r["bandwidth"] if b["window"] == window]
        count = len(bw[0]["exchange_s"])
        slowest = {key: [max(b[key][i] for b in bw) for i in range(count)] for key in ("exchange_s", "raw_s", "fresh_s")}
        moved = [sum(b["sent_bytes"][i] for b in bw) for i in range(count)]
        keep = [i for i in range(count) if moved[i] > 0]
        total = sum(moved[i] for i in keep)
        t = {key: sum(values[i] for i in keep) for key, values in slowest.items()}
        profile: dict[str, float] = {}
        for b in bw:
            for name, seconds in b["profile_s"].items():
                profile[name] = profile.get(name, 0.0) + seconds / len(bw)
        per_ms = (lambda seconds: 1e3 * seconds / len(keep)) if keep else (lambda seconds: float("nan"))
        summary.append({
            "window": window, "exchanges": count, "with_moves": len(keep),
            "mean_bytes_moved_mb": total / len(keep) / 1e6 if keep else 0.0,
            "mean_window_mb_per_rank": common.mean([x for b in bw for x in b["window_bytes"]]) / 1e6,
            "exchange_ms": per_ms(t["exchange_s"]), "raw_ms": per_ms(t["raw_s"]), "fresh_ms": per_ms(t["fresh_s"]),
            "exchange_gbps": total / t["exchange_s"] / 1e9 if t["exchange_s"] else float("nan"),
            "raw_gbps": total / t["raw_s"] / 1e9 if t["raw_s"] else float("nan"),
            "fresh_gbps": total / t["fresh_s"] / 1e9 if t["fresh_s"] else float("nan"),
            "ratio": t["raw_s"] / t["exchange_s"] if t["exchange_s"] else float("nan"),
            "ratio_fresh": t["fresh_s"] / t["exchange_s"] if t["exchange_s"] else float("nan"),
            "profile_ms_per_exchange": {name: 1e3 * seconds / count for name, seconds in profile.items()},
        })
    return {"bandwidth": summary}


def render(summary: dict, opts: dict, info: dict, command: str, seconds: float) -> str:
    fmt = common.fmt
    lines = [
        "### Bandwidth (`benchmarks/exchange_bandwidth.py`)",
        "",
        common.setup_line(opts, f" {opts['bandwidth_windows']} windows x {opts['bandwidth_reps']} repetitions per W. "
                          f"Whole run: {seconds:.0f} s."),
        *_dist.provenance_lines(command, info),
        "`exchange_window` against a raw `all_to_all_single` of the same byte splits on the same group, the three "
        "interleaved; time of the slower rank; bytes = all ranks' sent bytes; windows where nothing moves are left "
        "out. raw: preallocated buffers, the collective alone. raw, fresh buffers: a new send buffer filled by one "
        "copy and a new receive buffer, as any exchange that hands out new tensors must do.",
        "",
        "| W | windows timed | MB moved per exchange | window MB per rank | exchange ms | raw ms | raw, fresh buffers ms | exchange GB/s | raw GB/s | raw, fresh GB/s | exchange / raw | exchange / raw, fresh |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b in summary["bandwidth"]:
        lines.append(f"| {b['window']} | {b['with_moves']} / {b['exchanges']} | {fmt(b['mean_bytes_moved_mb'], 1)} | "
                     f"{fmt(b['mean_window_mb_per_rank'], 1)} | {fmt(b['exchange_ms'])} | {fmt(b['raw_ms'])} | "
                     f"{fmt(b['fresh_ms'])} | {fmt(b['exchange_gbps'])} | {fmt(b['raw_gbps'])} | {fmt(b['fresh_gbps'])} | "
                     f"{100 * b['ratio']:.0f}% | {100 * b['ratio_fresh']:.0f}% |")
    lines += ["", "Where an exchange's time goes (ms per exchange, mean over ranks, from the records' phase times; the "
              "all_to_all includes waiting for the peer; unpack includes putting the samples in canonical order):", "",
              "| W | layouts + costs | cost all-gather | plan | pack | all_to_all | unpack |",
              "|---:|---:|---:|---:|---:|---:|---:|"]
    for b in summary["bandwidth"]:
        p = b["profile_ms_per_exchange"]
        lines.append(f"| {b['window']} | " + " | ".join(fmt(p.get(phase)) for phase in ("layout", "gather", "plan", "pack", "all_to_all", "unpack")) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = common.parser(__doc__.split("\n")[0])
    parser.add_argument("--bandwidth-windows", type=int, default=6)
    parser.add_argument("--bandwidth-reps", type=int, default=5)
    args = parser.parse_args()
    return common.drive("exchange_bandwidth", MARKER, args, rank_main, summarize, render)


if __name__ == "__main__":
    sys.exit(main())
