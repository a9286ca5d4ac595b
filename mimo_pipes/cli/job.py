"""The per-rank body of ``mimo-pipes run``: groups, graph, consume, dump, checkpoint, summary."""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from mimo_pipes.cli.report import format_summary, summarize
from mimo_pipes.config import JobOptions, PipelineConfig, resolve_exchange_transport
from mimo_pipes.errors import ConfigError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.exchange.process_groups import build_rank_groups

STATE_FORMAT = 1
# Settings that must match between a saved state and the run that resumes it.
RESUME_FIELDS = ("components", "micro_batch_size", "global_batch_size", "seed", "dataloader_type", "dataset", "reorder",
                 "image_folder", "skip_bad_samples")


def state_path(directory: str, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.json"


def resume_fingerprint(config: PipelineConfig) -> dict[str, Any]:
    values = dataclasses.asdict(config)
    return {name: values[name] if name != "components" else list(values[name]) for name in RESUME_FIELDS}


def check_resume_dir(directory: str, config: PipelineConfig, world_size: int) -> int:
    """Validate a saved state before any rank starts; returns the consumed micro-batch count."""
    meta_path = Path(directory) / "meta.json"
    if not meta_path.is_file():
        raise ConfigError("--resume", f"{directory} holds no saved state (meta.json missing)")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != STATE_FORMAT:
        raise ConfigError("--resume", f"{directory}: state format {meta.get('format')} is not {STATE_FORMAT}")
    saved = meta["fingerprint"]
    current = json.loads(json.dumps(resume_fingerprint(config)))
    for name in RESUME_FIELDS:
        if saved.get(name) != current[name]:
            raise ConfigError("--resume", f"{directory} was saved with {name}={saved.get(name)!r}, this run has {current[name]!r}")
    missing = [rank for rank in range(world_size) if not state_path(directory, rank).is_file()]
    if missing:
        raise ConfigError("--resume", f"{directory} has no state for rank {missing[0]}")
    return int(meta["consumed_microbatches"])


def world_backend(world_size: int) -> str:
    """NCCL when every local rank can have a GPU of its own, else Gloo on the CPU."""
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= local_ranks else "gloo"


def init_distributed(rank: int, world_size: int, timeout_s: float) -> str:
    backend = world_backend(world_size)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    return backend


def run_in_process_group(rank: int, world_size: int, config: PipelineConfig, options: JobOptions) -> None:
    """One rank of the job, from joining the process group to leaving it."""
    init_distributed(rank, world_size, config.exchange_timeout_s)
    run_rank(config, options)
    dist.destroy_process_group()


def run_rank(config: PipelineConfig, options: JobOptions) -> None:
    """Body of one rank; the process group is already initialised."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    topology = config.validate(world_size=world_size)
    transport = resolve_exchange_transport(
        config.exchange_transport,
        dist.get_backend(),
        config.reorder.overlap_intra_microbatch_reorder,
        os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
    )
    groups = build_rank_groups(topology, exchange_backend=transport, timeout_s=config.exchange_timeout_s)
    assert groups is not None
    position = groups.position
    device = torch.device("cuda", torch.cuda.current_device()) if transport == "nccl" else None
    layout = RankLayout(position.dp_rank, position.dp_size, topology.grid_size, groups.exchange_group, device)
    recipe = importlib.import_module(options.recipe)
    loader = recipe.build(config, layout)
    if options.resume:
        loader.load_state_dict(json.loads(state_path(options.resume, rank).read_text())["loader"])
    start = loader.num_yielded
    stop = options.stop_after if options.stop_after is not None else options.steps
    dump = _open_dump(options, rank, append=bool(options.resume))
    records: list[dict[str, Any]] = []
    progress = _progress(rank == 0 and options.progress, total=options.steps, initial=start)
    try:
        for batch in loader:
            record = {
                "module": position.module.name,
                "dp_rank": position.dp_rank,
                "dp_size": position.dp_size,
                "step": batch["step"],
                "sample_ids": batch["sample_ids"],
                "image_tokens": batch["image_tokens"],
                "real_tokens": batch["real_tokens"],
            }
            if dump is not None:
                dump.write(json.dumps(record) + "\n")
            replaced = [row for rows in batch.get("replaced_rows") or [] for row in rows]  # --skip-bad-samples
            records.append({**record, "slots": batch["slots"], "tp_rank": position.tp_rank, "pp_rank": position.pp_rank,
                            "replaced_rows": replaced})
            if progress is not None:
                progress.update(1)
            if loader.num_yielded >= stop:
                break
        if options.save_state and options.stop_after is not None:
            _save_state(options.save_state, rank, loader.state_dict(), config, loader.num_yielded)
    finally:
        if progress is not None:
            progress.close()
        if dump is not None:
            dump.close()
        loader.close()
    everything: list[list[dict[str, Any]] | None] = [None] * world_size
    dist.all_gather_object(everything, records)
    if rank == 0:
        summaries = summarize((r for per_rank in everything for r in per_rank or []), topology.grid_size)
        print(_headline(config, topology, start, stop), flush=True)
        print(format_summary(summaries), flush=True)
        skipped = _skipped_rows(everything, topology.modules[0].name)
        if config.skip_bad_samples:
            print(f"skipped {len(skipped)} bad dataset row(s) (--skip-bad-samples), each replaced by the next good row "
                  f"of its slot{': rows ' + ', '.join(map(str, skipped[:20])) if skipped else ''}", flush=True)
        if options.save_state and options.stop_after is not None:
            print(f"saved state after {stop} micro-batches to {options.save_state}", flush=True)


def _skipped_rows(everything: list, module: str) -> list[int]:
    """The dataset rows one module skipped (every module skips the same ones)."""
    return sorted(row for per_rank in everything for r in per_rank or [] if r["module"] == module for row in r.get("replaced_rows", []))


def _headline(config: PipelineConfig, topology, start: int, stop: int) -> str:
    reorder = config.reorder
    if reorder.intra_microbatch_reorder:
        mode = (
            f"reorder on (window {reorder.reorder_window_size}"
            f"{', across micro-batches' if reorder.reorder_across_microbatches else ''}, "
            f"overlap {'on' if reorder.overlap_intra_microbatch_reorder else 'off'})"
        )
    else:
        mode = "reorder off (enable with --scalable-dp --intra-microbatch-reorder)"
    modules = " + ".join(f"{m.name} dp={m.dp}" for m in topology.modules)
    return (
        f"mimo-pipes run: {modules}, canonical grid {topology.grid_size}, micro-batch {config.micro_batch_size}, "
        f"micro-batches {start}..{stop - 1}, {mode}"
    )


def _open_dump(options: JobOptions, rank: int, append: bool):
    if options.dump_assignments is None:
        return None
    os.makedirs(options.dump_assignments, exist_ok=True)
    return open(Path(options.dump_assignments) / f"rank{rank}.jsonl", "a" if append else "w", buffering=1)


def _progress(enabled: bool, total: int, initial: int):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc="micro-batches", unit="mb", file=sys.stderr, dynamic_ncols=True)


def _save_state(directory: str, rank: int, state: dict, config: PipelineConfig, consumed: int) -> None:
    os.makedirs(directory, exist_ok=True)
    state_path(directory, rank).write_text(json.dumps({"format": STATE_FORMAT, "loader": state}))
    dist.barrier()
    if rank == 0:
        meta = {
            "format": STATE_FORMAT,
            "consumed_microbatches": consumed,
            "world_size": dist.get_world_size(),
            "fingerprint": resume_fingerprint(config),
        }
        (Path(directory) / "meta.json").write_text(json.dumps(meta, indent=1))
