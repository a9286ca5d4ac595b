"""Scenarios of the two Megatron recipes trained on the CPU (``--device cpu``) from the same settings, seed and
data, megatron-core's CUDA assumptions stood in for (:mod:`megatron_on_cpu`): the colocated recipe on a pool of one
rank, the non-colocated one on a pool of exactly ``images dp + language dp`` ranks (megatron-core's optimizers
gather over the whole world)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.distributed as dist
from megatron_on_cpu import megatron_on_cpu

from mimo_pipes.megatron.device import TrainingDevice
from mimo_pipes_recipes import megatron_mimo_grids as grids
from mimo_pipes_recipes import megatron_mimo_train as colocated

TINY = ["--lm-layers", "1", "--lm-hidden", "64", "--lm-heads", "4", "--vision-depth", "1", "--vision-width", "32", "--vision-heads", "2",
        "--micro-batch-size", "4", "--microbatches", "2", "--embedded-samples", "64", "--num-workers", "1",
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


def settings(reorder: str, iterations: int, extra: list[str] | None = None) -> list[str]:
    return [*TINY, "--iterations", str(iterations), "--reorder", reorder, *(extra or [])]


def colocated_run(*, reorder: str, iterations: int, extra: list[str] | None = None) -> dict:
    """The colocated recipe on a world of one rank: per iteration ``(loss, {module: gradient norm})`` and the
    sample ids of each micro-batch."""
    args = colocated.parse_args(settings(reorder, iterations, extra))
    with megatron_scenario():
        records = colocated.train_run(args, reorder, colocated.join(TrainingDevice(args.device)), log=lambda line: None)
    return {"training": [(record.loss, record.module_grad_norms) for record in records], "samples": [record.sample_ids for record in records]}


def grids_run(*, images_dp: int, language_dp: int, reorder: str, iterations: int, extra: list[str] | None = None) -> list | None:
    """The non-colocated recipe on a world of ``images_dp + language_dp`` ranks; rank 0 returns per iteration
    ``(loss, {module: gradient norm})`` (every rank has them), the others None."""
    args = grids.parse_args([*settings(reorder, iterations, extra), "--images-dp", str(images_dp), "--language-dp", str(language_dp)])
    problem = grids.world_problem(args, dist.get_world_size())
    assert problem is None, problem
    with megatron_scenario():
        runs = grids.train_run(args, grids.join(args), reorder)
    return [(record["loss"], record["module_grad_norms"]) for record in runs] if dist.get_rank() == 0 else None
