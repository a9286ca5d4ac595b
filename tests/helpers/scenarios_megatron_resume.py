"""Scenario run on every rank of a Gloo pool: a graph restarted from a Megatron checkpoint's
``consumed_train_samples`` continues the stream of the uninterrupted run."""

from __future__ import annotations

from scenarios_exchange import PAD_VALUES, join_layout, make_config
from scenarios_resume import fingerprint

from mimo_pipes.megatron import microbatches_from_samples, samples_from_microbatches
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline


def restart_from_consumed_samples(components, *, microbatches_per_iteration, iterations, stop_after, micro_batch_size, window_size, seed):
    """Megatron's loop: each iteration takes ``microbatches_per_iteration`` micro-batches and adds its global
    batch to ``consumed_train_samples``. Stop after ``stop_after`` iterations, map the count, rebuild, and
    compare the rest with the uninterrupted stream."""
    joined = join_layout(components, timeout_s=60)
    if joined is None:
        return None
    topology, groups, layout = joined
    global_batch = micro_batch_size * microbatches_per_iteration
    config = make_config(components, micro_batch_size=micro_batch_size, window_size=window_size, global_batch_size=global_batch, seed=seed)
    config.validate(world_size=topology.world_size)

    def loader(consumed=0):
        return pipeline(SyntheticProcessedDataset(400, seed=seed), config, layout, map_fn=None, image_token_id=IMAGE_TOKEN_ID,
                        pad_values=PAD_VALUES, consumed_microbatches=consumed)

    def take(graph, count):
        try:
            return [fingerprint(next(graph)) for _ in range(count)]
        finally:
            graph.close()

    total = iterations * microbatches_per_iteration
    reference = take(loader(), total)
    consumed_train_samples = 0
    first = loader()
    for _ in range(stop_after):
        [next(first) for _ in range(microbatches_per_iteration)]
        consumed_train_samples += global_batch  # what Megatron's checkpoint keeps
    first.close()
    consumed = microbatches_from_samples(consumed_train_samples, micro_batch_size)
    restarted = loader(consumed)
    num_yielded_at_start = restarted.consumed_microbatches
    rest = take(restarted, total - consumed)
    return {
        "module": groups.position.module.name,
        "consumed": consumed,
        "num_yielded_at_start": num_yielded_at_start,
        "continues": rest == reference[consumed:],
        "back_to_samples": samples_from_microbatches(consumed, micro_batch_size) == consumed_train_samples,
        "steps": [step for step, _, _ in rest],
    }
