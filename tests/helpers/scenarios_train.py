"""Training scenarios on every rank of the Gloo pool: the tiny MIMO trainer's losses per iteration."""

from __future__ import annotations

import dataclasses

from scenarios_exchange import make_config
from small_processor import small_processor_path

from mimo_pipes.cli.rank.train_rank import train_rank
from mimo_pipes.config import PipelineConfig
from mimo_pipes.config.job_options import TrainOptions

SEQ_LENGTH = 1536  # the embedded data's longest sample fits; shorter than the default keeps the CPU test light


def train_config(components, *, reorder: bool, window: int = 1, across: bool = False, micro_batch_size: int = 4,
                 global_batch_size: int = 8, seed: int = 0) -> PipelineConfig:
    """The embedded data through the embedded processor with a smaller pixel budget (:mod:`small_processor`): what
    these jobs check (losses under reordering, resume and another layout) does not depend on image size."""
    config = make_config(components, micro_batch_size=micro_batch_size, reorder=reorder, window_size=window, across=across,
                         global_batch_size=global_batch_size, seed=seed, seq_length=SEQ_LENGTH)
    return dataclasses.replace(config, processor=small_processor_path())


def train_and_resume(components, variants: dict[str, dict], *, iterations: int, resume: str, checkpoint_dir: str):
    """``mimo-pipes train``'s per-rank body for ``iterations`` per variant from the same seeds. Variant
    ``resume`` also stops after its first iteration saving a checkpoint (model, optimizer, loader) to disk,
    and a second job resumes from it to the same end. Ranks outside the layout only join the creation of
    process groups (and get None): they take part in every job's, or the pool's ranks would disagree on the
    groups made after (each process numbers the groups it creates)."""
    outcome: dict = {"runs": {}}
    for name, settings in variants.items():
        config = train_config(components, **settings)
        steps = iterations * config.microbatches_per_global_batch
        result = train_rank(config, TrainOptions(steps=steps, progress=False))
        if result is not None:
            outcome["runs"][name] = _summary(result, outcome)
    config = train_config(components, **variants[resume])
    steps, first = iterations * config.microbatches_per_global_batch, config.microbatches_per_global_batch
    train_rank(config, TrainOptions(steps=steps, stop_after=first, save_state=checkpoint_dir, progress=False))
    resumed = train_rank(config, TrainOptions(steps=steps, resume=checkpoint_dir, progress=False))
    if resumed is None:
        return None
    outcome["resumed"] = _summary(resumed, outcome)
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


def train_jobs(jobs: list[dict], *, window: int = 2, across: bool = True) -> list[dict | None] | None:
    """``mimo-pipes train``'s per-rank body for each job in turn (every pool rank takes part in each one's
    groups): ``components``, ``iterations`` (how far, from the start of training), and optionally
    ``stop_after`` (iterations, then save to ``save``) and ``resume`` (a checkpoint folder). Returns, per job,
    this rank's module, DP rank and per-iteration losses and samples (None for a job this rank is not in)."""
    outcomes: list[dict | None] = []
    for job in jobs:
        config = train_config(job["components"], reorder=True, window=window, across=across)
        per_iteration = config.microbatches_per_global_batch
        stop_after = job.get("stop_after")
        options = TrainOptions(steps=job["iterations"] * per_iteration, progress=False, resume=job.get("resume"),
                               save_state=job.get("save"), stop_after=None if stop_after is None else stop_after * per_iteration)
        result = train_rank(config, options)
        if result is None:
            outcomes.append(None)
            continue
        step = result.mine[0]
        outcomes.append({
            "module": step.module, "dp_rank": step.dp_rank,
            "iterations": [s.iteration for s in result.mine], "losses": [s.loss for s in result.mine],
            "samples": [sorted(i for record in s.records for i in record["sample_ids"]) for s in result.mine],
        })
    return outcomes
