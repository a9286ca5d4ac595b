"""Scenarios on a Gloo pool: the records `mimo-pipes run` keeps for its summary, from a module graph."""

from __future__ import annotations

from scenarios_exchange import PAD_VALUES, join_layout, make_config

from mimo_pipes.cli.rank.assignment_dump import consumed_record
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline


def run_summary_records(components, *, steps, micro_batch_size, seed, reorder, window_size=1, across=False):
    """This rank's records of ``steps`` consumed micro-batches, as `run` collects them (None off the layout)."""
    joined = join_layout(components, timeout_s=60)
    if joined is None:
        return None
    topology, groups, layout = joined
    config = make_config(components, micro_batch_size=micro_batch_size, seed=seed, reorder=reorder, window_size=window_size,
                         across=across, global_batch_size=micro_batch_size * window_size)
    config.validate(world_size=topology.world_size)
    position = groups.position
    loader = pipeline(SyntheticProcessedDataset(4096, seed=seed), config, layout, map_fn=None, image_token_id=IMAGE_TOKEN_ID,
                      pad_values=PAD_VALUES)
    records = []
    try:
        for batch in loader:
            records.append(consumed_record(batch, position))
            if len(records) == steps:
                break
    finally:
        loader.close()
    return records
