"""Scenarios run on every rank of a Gloo pool of exactly ``images dp + language dp`` ranks: both Megatron recipes
trained on the CPU (``--device cpu``) from the same settings, seed and data, megatron-core's CUDA assumptions
stood in for (:mod:`megatron_on_cpu`). The colocated recipe trains on rank 0 alone (its one-rank grid), then the
non-colocated one on every rank; rank 0 returns both runs' per-iteration losses and per-module gradient norms."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.distributed as dist
from megatron_on_cpu import megatron_on_cpu

from mimo_pipes.megatron.device import TrainingDevice
from mimo_pipes_recipes import megatron_mimo_grids as grids
from mimo_pipes_recipes import megatron_mimo_train as colocated

TINY = ["--lm-layers", "1", "--lm-hidden", "64", "--lm-heads", "4", "--vision-depth", "1", "--vision-width", "32", "--vision-heads", "2",
        "--micro-batch-size", "4", "--microbatches", "2", "--seq-length", "512", "--embedded-samples", "64", "--num-workers", "1",
        "--device", "cpu"]
"""Cheap model sizes: a one-layer language model of width 64 and a one-block vision tower of width 32."""


@contextlib.contextmanager
def megatron_scenario() -> Iterator[None]:
    """megatron-core on the CPU while inside; its global state (model-parallel groups, the bridge's cached groups)
    torn down after, so the pool's next scenario starts clean."""
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel.bridge_communicator import BridgeCommunicator

    try:
        with megatron_on_cpu():
            yield
    finally:
        BridgeCommunicator.destroy_broadcast_pgs()
        BridgeCommunicator.destroy_bridge_pgs()
        parallel_state.destroy_model_parallel()


def both_recipes(*, images_dp: int, language_dp: int, reorder: str, iterations: int, extra: list[str] | None = None) -> dict | None:
    """The colocated recipe on rank 0, then the non-colocated one on ``images_dp + language_dp`` ranks (the whole
    pool), ``iterations`` each; rank 0 returns ``{"colocated": [...], "grids": [...]}``, each a list of
    ``(loss, {module: gradient norm})`` per iteration, and the sample ids the colocated run trained on."""
    argv = [*TINY, "--iterations", str(iterations), "--reorder", reorder, *(extra or [])]
    with megatron_scenario():
        own = colocated.parse_args(argv)
        pgs = colocated.join(TrainingDevice(own.device))  # every rank: its grid is made collectively
        alone = colocated.train_run(own, reorder, pgs, log=lambda line: None) if dist.get_rank() == 0 else None
        dist.barrier()
        args = grids.parse_args([*argv, "--images-dp", str(images_dp), "--language-dp", str(language_dp)])
        problem = grids.world_problem(args, dist.get_world_size())
        assert problem is None, problem
        runs = grids.train_run(args, grids.join(args), reorder)
    if dist.get_rank() != 0:
        return None
    return {
        "colocated": [(record.loss, record.module_grad_norms) for record in alone],
        "grids": [(record["loss"], record["module_grad_norms"]) for record in runs],
        "samples": [record.sample_ids for record in alone],
    }
