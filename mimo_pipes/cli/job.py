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

from mimo_pipes.cli.metrics_log import attach_metrics
from mimo_pipes.cli.report import SUMMARY_ONLY_KEYS, format_packing_summary, format_summary, summarize, summarize_packing
from mimo_pipes.config import JobOptions, PipelineConfig, TrainOptions, exact_weight, flag, resolve_exchange_transport
from mimo_pipes.errors import ConfigError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.exchange.process_groups import build_rank_groups
from mimo_pipes.loader import graph_nodes
from mimo_pipes.nodes import SequencePacker
from mimo_pipes.topology import COMPONENT_FLAG, RankPosition
from mimo_pipes.validity import MISSING, show_setting

STATE_FORMAT = 2  # 2: meta.json holds every setting that shapes the stream; node states say what they are valid for
# Settings of PipelineConfig (and the configs inside it) that do not change the stream or the saved state,
# so a resumed run may change them. Every other field, present or added later, must match.
RESUME_EXEMPT = {
    "num_workers": "processing threads; the mapper keeps the order",
    "exchange_transport": "how the bytes travel, not which",
    "exchange_timeout_s": "how long a rank waits for a silent peer",
    "overlap_intra_microbatch_reorder": "which thread runs the exchange; the state is the same either way",
}
# Options of `run` and `train` (JobOptions, TrainOptions) that do not change what a resumed run computes:
# how far it goes, where it writes, what it prints. Every other option (the recipe; train's learning rate
# and vision tower; any option added later) is saved with the state and must match on resume.
OPTION_EXEMPT = {
    "steps": "how far to run: a resumed run goes further",
    "stop_after": "where this run stops and saves",
    "save_state": "where this run saves",
    "resume": "where this run resumes from",
    "dump_assignments": "a record of what the ranks consumed",
    "progress": "the progress bar and metrics lines",
    "tensorboard": "where the exchange metrics are written (their totals travel in the state)",
    "log_interval": "how often a metrics line is printed",
}
# Fields whose flag is not the field name with dashes.
FLAGS = {
    "components": COMPONENT_FLAG,
    "exchange_timeout_s": "--exchange-timeout",
    "overlap_intra_microbatch_reorder": "--no-overlap-intra-microbatch-reorder",
    "progress": "--quiet",
}


def state_path(directory: str, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.json"


def resume_settings(config: PipelineConfig, options: JobOptions) -> dict[str, Any]:
    """Every setting a resumed run must share with the saved one, by field name, JSON-plain: all fields of
    the config and of the configs inside it except :data:`RESUME_EXEMPT` (what shapes the stream), and all
    options except :data:`OPTION_EXEMPT` (the recipe, and for ``train`` what shapes the losses)."""
    settings: dict[str, Any] = {}

    def add(holder: Any) -> None:
        for item in dataclasses.fields(holder):
            value = getattr(holder, item.name)
            if dataclasses.is_dataclass(value):
                add(value)
            elif item.name not in RESUME_EXEMPT:
                settings[item.name] = value

    add(config)
    for name in ("reorder_encoder_cost_weight", "reorder_language_cost_weight"):  # 1, 1.0 and "1" are one weight
        settings[name] = str(exact_weight(settings[name], flag(name)))
    if config.dataset is not None:
        settings["embedded_samples"] = None  # the embedded data is not used
    for item in dataclasses.fields(options):
        if item.name not in OPTION_EXEMPT:
            settings[item.name] = getattr(options, item.name)
    if isinstance(options, TrainOptions):
        from mimo_pipes.encoders import vision_tower_identity

        settings["vision_tower"] = vision_tower_identity(options.vision_tower)  # a folder's config, not only its path
    return json.loads(json.dumps(settings))


def setting_flag(name: str) -> str:
    return FLAGS.get(name, flag(name))


def check_resume_dir(directory: str, config: PipelineConfig, world_size: int, options: JobOptions) -> int:
    """Validate a saved state before any rank starts (every launcher and torchrun rank runs it, so a mismatch
    ends every rank with exit 2 before any collective); returns the consumed micro-batch count."""
    meta_path = Path(directory) / "meta.json"
    if not meta_path.is_file():
        raise ConfigError("--resume", f"{directory} holds no saved state (meta.json missing)")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != STATE_FORMAT:
        raise ConfigError(
            "--resume", f"{directory}: state format {meta.get('format')} is not {STATE_FORMAT} (saved by another mimo-pipes version); start the run again"
        )
    saved, current = meta["settings"], resume_settings(config, options)
    for name in [*current, *(name for name in saved if name not in current)]:
        before, now = saved.get(name, MISSING), current.get(name, MISSING)
        if before != now:
            raise ConfigError("--resume", f"{directory} was saved with {setting_flag(name)} {_show(before)}, this run has {_show(now)}")
    missing = [rank for rank in range(world_size) if not state_path(directory, rank).is_file()]
    if missing:
        raise ConfigError("--resume", f"{directory} has no state for rank {missing[0]}")
    return int(meta["consumed_microbatches"])


def _show(value: Any) -> str:
    return show_setting(value, missing="no value (an unknown setting)", none="unset (the default)")


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
    packer = next((node for node in graph_nodes(loader.root) if isinstance(node, SequencePacker)), None)
    stop = options.stop_after if options.stop_after is not None else options.steps
    metrics_log = attach_metrics(loader, position, options)
    dump = _open_dump(options, rank, append=bool(options.resume))
    records: list[dict[str, Any]] = []
    progress = _progress(rank == 0 and options.progress, total=options.steps, initial=start)
    try:
        for batch in loader:
            record = consumed_record(batch, position)
            if dump is not None:
                dump.write(json.dumps({k: v for k, v in record.items() if k not in SUMMARY_ONLY_KEYS}) + "\n")
            replaced = [row for rows in batch.get("replaced_rows") or [] for row in rows]  # --skip-bad-samples
            records.append({**record, "replaced_rows": replaced})
            if packer is not None:
                records[-1]["packing"] = packer.last_metrics
            if progress is not None:
                progress.update(1)
            if loader.num_yielded >= stop:
                break
        end = loader.num_yielded  # below stop when the data ended first
        if options.save_state and options.stop_after is not None:
            _save_state(options.save_state, rank, loader.state_dict(), resume_settings(config, options), end)
        if metrics_log is not None:
            metrics_log.finish(loader.exchange_metrics())
    finally:
        if progress is not None:
            progress.close()
        if dump is not None:
            dump.close()
        loader.close()
        if metrics_log is not None:
            metrics_log.close()
    everything: list[tuple[list[dict[str, Any]], int] | None] = [None] * world_size
    dist.all_gather_object(everything, (records, end))
    if rank == 0:
        summaries = summarize((r for per_rank, _ in everything for r in per_rank), topology.grid_size)
        end = min(rank_end for _, rank_end in everything)
        print(_headline(config, topology, start, end), flush=True)
        if end < stop:
            print(f"the data ended after {end} micro-batches, before the {stop} asked for "
                  f"({'--stop-after' if options.stop_after is not None else '--steps'})", flush=True)
        print(format_summary(summaries), flush=True)
        packing = summarize_packing(r for per_rank, _ in everything for r in per_rank)
        if packing:
            print(format_packing_summary(packing), flush=True)
        skipped = _skipped_rows(everything, topology.modules[0].name)
        if config.skip_bad_samples:
            print(f"skipped {len(skipped)} bad dataset row(s) (--skip-bad-samples), each replaced by the next good row "
                  f"of its slot{': rows ' + ', '.join(map(str, skipped[:20])) if skipped else ''}", flush=True)
        if options.save_state and options.stop_after is not None:
            print(f"saved state after {end} micro-batches to {options.save_state}", flush=True)


def consumed_record(batch: dict[str, Any], position: RankPosition) -> dict[str, Any]:
    """What the run summary keeps of one consumed micro-batch of the rank at ``position``: the
    ``--dump-assignments`` line plus :data:`~mimo_pipes.cli.report.SUMMARY_ONLY_KEYS`."""
    return {
        "module": position.module.name,
        "dp_rank": position.dp_rank,
        "dp_size": position.dp_size,
        "step": batch["step"],
        "sample_ids": batch["sample_ids"],
        "image_tokens": batch["image_tokens"],
        "real_tokens": batch["real_tokens"],
        "slots": batch["slots"],
        "read_steps": batch["read_steps"],
        "tp_rank": position.tp_rank,
        "pp_rank": position.pp_rank,
    }


def _skipped_rows(everything: list, module: str) -> list[int]:
    """The dataset rows one module skipped (every module skips the same ones)."""
    return sorted(row for per_rank, _ in everything for r in per_rank if r["module"] == module for row in r.get("replaced_rows", []))


def _headline(config: PipelineConfig, topology, start: int, end: int) -> str:
    """``end``: the count of micro-batches consumed when the run stopped (start..end-1 were this run's)."""
    reorder = config.reorder
    if reorder.intra_microbatch_reorder:
        mode = (
            f"reorder on (window {reorder.reorder_window_size}"
            f"{', across micro-batches' if reorder.reorder_across_microbatches else ''}, "
            f"overlap {'on' if reorder.overlap_intra_microbatch_reorder else 'off'})"
        )
    else:
        mode = "reorder off (enable with --scalable-dp --intra-microbatch-reorder)"
    if config.pack_sequences_in_batch:
        mode += f", sequence packing on (THD, pad multiple {config.pack_pad_multiple})"
    modules = " + ".join(f"{m.name} dp={m.dp}" for m in topology.modules)
    return (
        f"mimo-pipes run: {modules}, canonical grid {topology.grid_size}, micro-batch {config.micro_batch_size}, "
        f"{f'micro-batches {start}..{end - 1}' if end > start else 'no micro-batches'}, {mode}"
    )


def _open_dump(options: JobOptions, rank: int, append: bool):
    if options.dump_assignments is None:
        return None
    os.makedirs(options.dump_assignments, exist_ok=True)
    return open(Path(options.dump_assignments) / f"rank{rank}.jsonl", "a" if append else "w", buffering=1)


def _progress(enabled: bool, total: int, initial: int, desc: str = "micro-batches", unit: str = "mb"):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)


def _save_state(
    directory: str, rank: int, state: dict, settings: dict[str, Any], consumed: int, group: dist.ProcessGroup | None = None
) -> None:
    """Every rank of ``group`` (default: the world) writes its state; its first rank then writes meta.json."""
    os.makedirs(directory, exist_ok=True)
    state_path(directory, rank).write_text(json.dumps({"format": STATE_FORMAT, "loader": state}))
    dist.barrier(group=group)
    if rank == min(dist.get_process_group_ranks(group or dist.group.WORLD)):
        meta = {
            "format": STATE_FORMAT,
            "consumed_microbatches": consumed,
            "world_size": dist.get_world_size(group),
            "settings": settings,
        }
        (Path(directory) / "meta.json").write_text(json.dumps(meta, indent=1))


# --- `mimo-pipes train`: the same ranks and groups, a recipe's Trainer instead of a bare loader ----------


def checkpoint_path(directory: str, rank: int) -> Path:
    """Model and optimizer state of one rank; the loader's state sits beside it in ``rank{r}.json``."""
    return Path(directory) / f"rank{rank}.pt"


def save_checkpoint(
    directory: str, rank: int, state: dict[str, Any], settings: dict[str, Any], consumed: int, group: dist.ProcessGroup | None = None
) -> None:
    """A trainer's state: model and optimizer in ``rank{r}.pt``, the loader as ``run --save-state`` saves it.
    Collective over ``group`` (default: the world; a barrier before ``meta.json``)."""
    os.makedirs(directory, exist_ok=True)
    torch.save({"model": state["model"], "optimizer": state["optimizer"]}, checkpoint_path(directory, rank))
    _save_state(directory, rank, state["loader"], settings, consumed, group)


def load_checkpoint(directory: str, rank: int) -> dict[str, Any]:
    state = torch.load(checkpoint_path(directory, rank), weights_only=True)
    state["loader"] = json.loads(state_path(directory, rank).read_text())["loader"]
    return state


def train_in_process_group(rank: int, world_size: int, config: PipelineConfig, options: TrainOptions) -> None:
    # The tiny trainer's models live on the CPU: Gloo even where GPUs are visible.
    timeout = datetime.timedelta(seconds=config.exchange_timeout_s)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timeout)
    train_rank(config, options)
    dist.destroy_process_group()


def train_rank(config: PipelineConfig, options: TrainOptions) -> None:
    """Body of one training rank: iterations of the recipe's Trainer, checkpoint, summary on rank 0."""
    from mimo_pipes.cli.train_report import format_training

    rank, world_size = dist.get_rank(), dist.get_world_size()
    topology = config.validate(world_size=world_size)
    groups = build_rank_groups(topology, exchange_backend="gloo", timeout_s=config.exchange_timeout_s)
    assert groups is not None
    trainer = importlib.import_module(options.recipe).Trainer(config, options, groups, topology)
    if options.resume:
        trainer.load_state_dict(load_checkpoint(options.resume, rank))
    per_iteration = config.microbatches_per_global_batch
    start = trainer.iteration
    stop = (options.stop_after if options.stop_after is not None else options.steps) // per_iteration
    metrics_log = attach_metrics(trainer.loader, groups.position, options)  # --tensorboard, --log-interval as for run
    dump = _open_dump(options, rank, append=bool(options.resume))
    results = []
    progress = _progress(rank == 0 and options.progress, options.steps // per_iteration, start, "iterations", "it")
    try:
        while trainer.iteration < stop:
            result = trainer.step()
            results.append(result)
            if dump is not None:
                for record in result.records:
                    dump.write(json.dumps({k: v for k, v in record.items() if k not in SUMMARY_ONLY_KEYS}) + "\n")
            if progress is not None:
                progress.update(1)
        if options.save_state and options.stop_after is not None:
            save_checkpoint(
                options.save_state, rank, trainer.state_dict(), resume_settings(config, options), trainer.loader.num_yielded
            )
        if metrics_log is not None:
            metrics_log.finish(trainer.loader.exchange_metrics())
    finally:
        if progress is not None:
            progress.close()
        if dump is not None:
            dump.close()
        trainer.close()
        if metrics_log is not None:
            metrics_log.close()
    everything: list[list | None] = [None] * world_size
    dist.all_gather_object(everything, results)
    if rank == 0:
        flat = [result for per_rank in everything for result in per_rank or []]
        records = [{**r, "tp_rank": 0, "pp_rank": 0} for result in flat for r in result.records]
        print(_headline(config, topology, start * per_iteration, stop * per_iteration).replace("mimo-pipes run", "mimo-pipes train"), flush=True)
        print(format_training(flat), flush=True)
        print(format_summary(summarize(records, topology.grid_size)), flush=True)
        if options.save_state and options.stop_after is not None:
            print(f"saved model, optimizer and loader state after iteration {stop} to {options.save_state}", flush=True)
