"""Scenarios run on every rank of a Gloo pool: the exchange's records and metrics as an observer sees them."""

from __future__ import annotations

import json

from scenarios_exchange import PAD_VALUES, join_layout, make_config

from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline

RECORD_FIELDS = ("sequence", "first_step", "dp_rank", "bytes_sent", "bytes_received", "samples_sent", "samples_received",
                 "on_training_thread", "wait_seconds", "exchange_seconds", "seconds")


def run_observed(components, *, steps, micro_batch_size, **config_kwargs):
    """Consume ``steps`` micro-batches with an observer on the exchange; return its records and the batches."""
    joined = join_layout(components, exchange_backend="gloo", timeout_s=60.0)
    if joined is None:
        return None
    topology, groups, layout = joined
    config = make_config(components, micro_batch_size=micro_batch_size, **config_kwargs)
    position = groups.position
    loader = build(config, layout)
    records = []
    loader.exchange_node().add_observer(records.append)
    batches = []
    try:
        for batch in loader:
            batches.append({"step": batch["step"], "image_tokens": batch["image_tokens"], "costs": batch["costs"]})
            if len(batches) == steps:
                break
    finally:
        loader.close()
    return {
        "module": position.module.name,
        "dp_rank": position.dp_rank,
        "dp_size": position.dp_size,
        "records": [{**{name: getattr(r, name) for name in RECORD_FIELDS}, "metrics": r.metrics} for r in records],
        "batches": batches,
    }


def cumulative_after_resume(components, *, steps, stop_at, micro_batch_size, **config_kwargs):
    """The last window's metrics of a run to ``steps``, and of runs stopped after each count in ``stop_at``,
    saved (through JSON, as a checkpoint holds it), restored into a new graph and continued to ``steps``."""
    joined = join_layout(components, exchange_backend="gloo", timeout_s=60.0)
    if joined is None:
        return None
    topology, groups, layout = joined
    config = make_config(components, micro_batch_size=micro_batch_size, **config_kwargs)
    position = groups.position

    def consume(until, state=None):
        loader = build(config, layout)
        if state is not None:
            loader.load_state_dict(state)
        try:
            if loader.consumed_microbatches < until:
                for _ in loader:
                    if loader.consumed_microbatches >= until:
                        break
            return loader.exchange_metrics(), json.loads(json.dumps(loader.state_dict()))
        finally:
            loader.close()

    resumed = {}
    for stop in stop_at:
        _, state = consume(stop)
        resumed[stop] = consume(steps, state)[0]
    return {"module": position.module.name, "dp_rank": position.dp_rank, "full": consume(steps)[0], "resumed": resumed}


def build(config, layout):
    """The graph ``mimo-pipes run`` builds (its default recipe), over the embedded test data."""
    return pipeline(SyntheticProcessedDataset(512, seed=3), config, layout, map_fn=None, image_token_id=IMAGE_TOKEN_ID,
                    pad_values=PAD_VALUES)
