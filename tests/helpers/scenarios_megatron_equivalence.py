"""Scenarios of the two Megatron recipes trained on the CPU (``--device cpu``) from the same settings, seed and
data, megatron-core's CUDA assumptions stood in for (:mod:`megatron_on_cpu`): the colocated recipe on a pool of one
rank, the non-colocated one on a pool of exactly ``images dp + language tp x pp x dp`` ranks (megatron-core's
optimizers gather over the whole world). With language tensor or pipeline parallelism both start from one set of
full weights (:mod:`megatron_weights`): megatron-core seeds each tensor-parallel rank and pipeline stage apart."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch
import torch.distributed as dist
from megatron_on_cpu import _swapped, megatron_on_cpu
from megatron_weights import full_weights, load_part, unwrapped
from small_processor import small_processor_path

from mimo_pipes.megatron.device import TrainingDevice
from mimo_pipes_recipes import megatron_mimo_grids as grids
from mimo_pipes_recipes import megatron_mimo_train as colocated

TINY = ["--lm-layers", "1", "--lm-hidden", "64", "--lm-heads", "4", "--vision-depth", "1", "--vision-width", "32", "--vision-heads", "2",
        "--micro-batch-size", "4", "--microbatches", "2", "--embedded-samples", "64", "--num-workers", "1",
        "--seq-length", "1024", "--device", "cpu"]
"""Cheap model sizes: a one-layer language model of width 64 and a one-block vision tower of width 32; the embedded
samples read through the processor with a smaller pixel budget (:func:`smaller_images`), their longest of these 64
some 630 tokens, so rows are padded to 1024 tokens, not the default 2048: the recipes' equivalence does not depend on
image or row size, and the attention of both towers (quadratic in patches and in tokens) is most of a step."""


@contextlib.contextmanager
def smaller_images() -> Iterator[None]:
    """Both recipes' pipeline settings (the non-colocated recipe's and Bridge's start from the colocated recipe's)
    with the embedded processor of at most 320 image tokens an image (:mod:`small_processor`) while inside."""
    made = colocated.pipeline_config

    def smaller(*args, **kwargs):
        return dataclasses.replace(made(*args, **kwargs), processor=small_processor_path())

    with _swapped(colocated, "pipeline_config", smaller):
        yield


@contextlib.contextmanager
def megatron_scenario() -> Iterator[None]:
    """megatron-core on the CPU while inside; its global state (model-parallel groups, the bridge's cached groups)
    torn down after, so the pool's next scenario starts clean."""
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel.bridge_communicator import BridgeCommunicator

    try:
        with megatron_on_cpu(), smaller_images():
            yield
    finally:
        BridgeCommunicator.destroy_broadcast_pgs()
        BridgeCommunicator.destroy_bridge_pgs()
        parallel_state.destroy_model_parallel()


def settings(reorder: str, iterations: int, extra: list[str] | None = None) -> list[str]:
    return [*TINY, "--iterations", str(iterations), "--reorder", reorder, *(extra or [])]


def colocated_run(*, reorder: str, iterations: int, extra: list[str] | None = None, save_weights: str | None = None) -> dict:
    """The colocated recipe on a world of one rank: per iteration ``(loss, {module: gradient norm})`` and the
    sample ids of each micro-batch; with ``save_weights``, its model's full weights as built saved there first."""
    args = colocated.parse_args(settings(reorder, iterations, extra))
    with megatron_scenario(), saving_weights(save_weights):
        records = colocated.train_run(args, reorder, colocated.join(TrainingDevice(args.device)), log=lambda line: None)
    return {"training": [(record.loss, record.module_grad_norms) for record in records], "samples": [record.sample_ids for record in records]}


@contextlib.contextmanager
def saving_weights(path: str | None) -> Iterator[None]:
    """The colocated recipe's model, as built (seeded, before any step), saved whole to ``path`` (none: not saved)."""
    if path is None:
        yield
        return
    build = colocated.build_model

    def built(*args, **kwargs):
        model, optimizer = build(*args, **kwargs)
        torch.save(full_weights(model), path)
        return model, optimizer

    with _swapped(colocated, "build_model", built):
        yield


@contextlib.contextmanager
def loading_weights(path: str | None) -> Iterator[None]:
    """The non-colocated recipe's model, as built, given its rank's part of the full weights at ``path`` (none:
    as seeded)."""
    if path is None:
        yield
        return
    weights = torch.load(path)
    build = grids.build_model

    def built(args, place, *rest):
        model, language, optimizer = build(args, place, *rest)
        prefix = "language_model." if place.is_language else f"modality_submodules.{colocated.MODALITY}."
        loaded = load_part(unwrapped(place.module_of(model)), weights, prefix=prefix, tp_rank=place.pgs.tp.rank(), tp_size=place.pgs.tp.size())
        assert loaded > 0
        return model, language, optimizer

    with _swapped(grids, "build_model", built):
        yield


@contextlib.contextmanager
def recording_samples(taken: list[list[int]]) -> Iterator[None]:
    """Each micro-batch's sample ids, in the order this rank's loader makes them, appended to ``taken``."""
    made = grids.mimo_batch

    def recorded(batch, settings):
        taken.append([int(sample) for sample in batch["sample_ids"]])
        return made(batch, settings)

    with _swapped(grids, "mimo_batch", recorded):
        yield


def global_micro_batches(parts: list[tuple[int, list[list[int]]]], microbatches: int) -> list[list[list[int]]]:
    """Per iteration, each global micro-batch's sample ids: the language replicas' micro-batches (``parts``: their
    DP rank and micro-batches) concatenated in DP order."""
    ordered = [batches for _, batches in sorted(parts)]
    merged = [[sample for batches in ordered for sample in batches[index]] for index in range(len(ordered[0]))]
    return [merged[start:start + microbatches] for start in range(0, len(merged), microbatches)]


def grids_run(*, images_dp: int, language_dp: int, reorder: str, iterations: int, extra: list[str] | None = None, language_tp: int = 1,
              language_pp: int = 1, weights: str | None = None) -> dict | None:
    """The non-colocated recipe on a world of ``images_dp + language_tp x language_pp x language_dp`` ranks (from
    the full weights at ``weights``, if given); rank 0 returns per iteration ``(loss, {module: gradient norm})``
    (every rank has them) and the sample ids of each global micro-batch (from the language replicas), the others
    None."""
    args = grids.parse_args([*settings(reorder, iterations, extra), "--images-dp", str(images_dp), "--language-dp", str(language_dp),
                             "--language-tp", str(language_tp), "--language-pp", str(language_pp)])
    problem = grids.world_problem(args, dist.get_world_size())
    assert problem is None, problem
    taken: list[list[int]] = []
    with megatron_scenario(), loading_weights(weights), recording_samples(taken):
        place = grids.join(args)
        runs = grids.train_run(args, place, reorder)
        reads = place.is_language and place.pgs.tp.rank() == 0 and place.pgs.pp.rank() == 0
        mine = (place.pgs.dp.rank(), taken[:len(runs) * args.microbatches]) if reads else None  # not what the loader read ahead
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    if dist.get_rank() != 0:
        return None
    return {"training": [(record["loss"], record["module_grad_norms"]) for record in runs],
            "samples": global_micro_batches([part for part in parts if part is not None], args.microbatches)}
