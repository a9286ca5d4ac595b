"""Training scenarios on every rank of the Gloo pool: the tiny MIMO trainer's losses per iteration."""

from __future__ import annotations

import torch.distributed as dist
from scenarios_exchange import make_config

from mimo_pipes.cli.job import load_checkpoint, resume_settings, save_checkpoint
from mimo_pipes.config import PipelineConfig, TrainOptions
from mimo_pipes.exchange.process_groups import build_rank_groups
from mimo_pipes.topology import build_topology
from mimo_pipes_recipes.tiny_mimo_train import Trainer

SEQ_LENGTH = 1536  # the embedded data's longest sample fits; shorter than the default keeps the CPU test light


def train_config(components, *, reorder: bool, window: int = 1, across: bool = False, microbatch_size: int = 4,
                 global_batch_size: int = 8, seed: int = 0) -> PipelineConfig:
    return make_config(components, microbatch_size=microbatch_size, reorder=reorder, window_size=window, across=across,
                       global_batch_size=global_batch_size, seed=seed, seq_length=SEQ_LENGTH)


def train_and_resume(components, variants: dict[str, dict], *, iterations: int, resume: str, checkpoint_dir: str):
    """Train ``iterations`` per variant from the same seeds. Variant ``resume`` saves a checkpoint to disk after
    its first iteration and trains on; then a rebuilt trainer restores the checkpoint and trains the same
    iterations again. Ranks outside the layout only join the creation of process groups."""
    topology = build_topology(components)
    groups = build_rank_groups(topology, timeout_s=120)
    layout_group = dist.new_group(list(range(topology.world_size)))
    if groups is None:
        return None
    options = TrainOptions()
    outcome = {"module": groups.position.module.name, "dp_rank": groups.position.dp_rank, "runs": {}}
    for name, settings in variants.items():
        config = train_config(components, **settings)
        trainer = Trainer(config, options, groups, topology)
        results = [trainer.step()]
        if name == resume:
            settings = resume_settings(config, options)
            save_checkpoint(checkpoint_dir, dist.get_rank(), trainer.state_dict(), settings, trainer.loader.num_yielded, layout_group)
        results += [trainer.step() for _ in range(iterations - 1)]
        trainer.close()
        outcome["runs"][name] = _summary(results, trainer)
    restored = Trainer(train_config(components, **variants[resume]), options, groups, topology)
    restored.load_state_dict(load_checkpoint(checkpoint_dir, dist.get_rank()))
    outcome["resumed"] = _summary([restored.step() for _ in range(iterations - 1)], restored)
    restored.close()
    return outcome


def _summary(results, trainer) -> dict:
    return {
        "losses": [result.loss for result in results],
        "iterations": [result.iteration for result in results],
        "microbatches": [record["sample_ids"] for result in results for record in result.records],
        "metrics": trainer.loader.exchange_metrics(),  # the last window's, running totals included
    }
