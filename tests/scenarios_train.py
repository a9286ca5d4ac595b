"""Training scenarios on every rank of the Gloo pool: the tiny MIMO trainer's losses per iteration."""

from __future__ import annotations

from scenarios_exchange import make_config

from mimo_pipes.cli.train_rank import train_rank
from mimo_pipes.config import PipelineConfig, TrainOptions

SEQ_LENGTH = 1536  # the embedded data's longest sample fits; shorter than the default keeps the CPU test light


def train_config(components, *, reorder: bool, window: int = 1, across: bool = False, microbatch_size: int = 4,
                 global_batch_size: int = 8, seed: int = 0) -> PipelineConfig:
    return make_config(components, microbatch_size=microbatch_size, reorder=reorder, window_size=window, across=across,
                       global_batch_size=global_batch_size, seed=seed, seq_length=SEQ_LENGTH)


def train_and_resume(components, variants: dict[str, dict], *, iterations: int, resume: str, checkpoint_dir: str):
    """``mimo-pipes train``'s per-rank body for ``iterations`` per variant from the same seeds. Variant
    ``resume`` also stops after its first iteration saving a checkpoint (model, optimizer, loader) to disk,
    and a second job resumes from it to the same end. Ranks outside the layout only join the creation of
    process groups (and get None)."""
    outcome: dict = {"runs": {}}
    for name, settings in variants.items():
        config = train_config(components, **settings)
        steps = iterations * config.microbatches_per_global_batch
        result = train_rank(config, TrainOptions(steps=steps, progress=False))
        if result is None:
            return None
        outcome["runs"][name] = _summary(result, outcome)
    config = train_config(components, **variants[resume])
    steps, first = iterations * config.microbatches_per_global_batch, config.microbatches_per_global_batch
    train_rank(config, TrainOptions(steps=steps, stop_after=first, save_state=checkpoint_dir, progress=False))
    outcome["resumed"] = _summary(train_rank(config, TrainOptions(steps=steps, resume=checkpoint_dir, progress=False)), outcome)
    return outcome


def _summary(result, outcome: dict) -> dict:
    """This rank's iterations of a job."""
    outcome.update(module=result.mine[0].module, dp_rank=result.mine[0].dp_rank)
    return {
        "losses": [step.loss for step in result.mine],
        "iterations": [step.iteration for step in result.mine],
        "microbatches": [record["sample_ids"] for step in result.mine for record in step.records],
        "metrics": result.metrics,  # the last window's, running totals included
    }
