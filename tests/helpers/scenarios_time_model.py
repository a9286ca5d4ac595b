"""Scenarios on a Gloo pool: module graphs balancing on a time model, with one or two levels."""

from __future__ import annotations

import dataclasses

from scenarios_exchange import PAD_VALUES, check_batch, join_layout, make_config, rank_result

from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline


def run_cost_model_graph(components, *, steps, micro_batch_size, seed, time_model=None, two_level=False, reorder=True,
                         window_size=1, across=False):
    """Every rank's micro-batches with their sample ids, costs, image tokens and real tokens."""
    joined = join_layout(components, timeout_s=60)
    if joined is None:
        return None
    topology, groups, layout = joined
    config = make_config(components, micro_batch_size=micro_batch_size, seed=seed, reorder=reorder, window_size=window_size,
                         across=across, global_batch_size=micro_batch_size * window_size)
    config.reorder = dataclasses.replace(config.reorder, reorder_cost_model=time_model, reorder_two_level=two_level)
    config.validate(world_size=topology.world_size)
    dataset = SyntheticProcessedDataset(4096, seed=seed)
    position = groups.position
    loader = pipeline(dataset, config, layout, map_fn=None, image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES)
    records = []
    try:
        for batch in loader:
            check_batch(batch, dataset)
            records.append({name: batch[name] for name in ("step", "sample_ids", "costs", "image_tokens", "real_tokens")})
            if len(records) == steps:
                break
    finally:
        loader.close()
    return rank_result(position, records)
