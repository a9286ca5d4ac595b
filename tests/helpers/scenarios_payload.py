"""Scenarios run on every rank of a Gloo pool: the recipe's graph over real rows under both payloads."""

from __future__ import annotations

import dataclasses
import json
import time

from scenarios_exchange import join_layout
from scenarios_resume import fingerprint

from mimo_pipes.config import PipelineConfig, ReorderConfig
from mimo_pipes.observe.metrics import MovedPerWindow
from mimo_pipes_recipes import vlm_sft


def config_for(components, payload: str, *, window: int = 1, dataset: str | None = None, steps_data: int = 48,
               dataloader_type: str = "cyclic", micro_batch_size: int = 4, workers: int = 2) -> PipelineConfig:
    return PipelineConfig(
        components=tuple(components), micro_batch_size=micro_batch_size, seq_length=2048, embedded_samples=steps_data, dataset=dataset,
        num_workers=workers, exchange_payload=payload, dataloader_type=dataloader_type, seed=3,
        reorder=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_window_size=window),
    )


def _joined(components):
    joined = join_layout(components, timeout_s=60)
    if joined is None:
        return None
    topology, groups, layout = joined
    return groups.position, dataclasses.replace(layout, module=groups.position.module.name)


def payload_streams(components, *, steps: int, window: int, stop_at: int, micro_batch_size: int = 4, workers: int = 2) -> dict | None:
    """Under each payload: every micro-batch's fingerprint, what the exchange moved, and the stream after a
    state saved at ``stop_at`` (through JSON) is restored into a new graph; ``workers`` processing workers (under
    ``rows`` they decide how many windows RowProcessor holds ahead)."""
    joined = _joined(components)
    if joined is None:
        return None
    position, layout = joined
    out: dict = {"module": position.module.name, "dp_rank": position.dp_rank}
    for payload in ("rows", "samples"):
        config = config_for(components, payload, window=window, micro_batch_size=micro_batch_size, workers=workers)
        loader = vlm_sft.build(config, layout)
        loader.end_at(steps)
        moved = MovedPerWindow()
        loader.exchange_node().add_observer(moved)
        prints, state = [], None
        for step in range(steps):
            if step == stop_at:
                state = json.loads(json.dumps(loader.state_dict()))
            prints.append(fingerprint(next(loader)))
        loader.close()
        restored = vlm_sft.build(config, layout)
        restored.load_state_dict(state)
        restored.end_at(steps)
        resumed = [fingerprint(next(restored)) for _ in range(steps - stop_at)]
        restored.close()
        out[payload] = {"prints": prints, "moved": moved.totals(steps), "resumed": resumed}
    return out


def consume_rows(components, dataset: str, *, steps: int, workers: int = 2) -> dict | None:
    """The rows graph over ``dataset`` for ``steps`` micro-batches with ``workers`` processing workers (raises what
    the graph raises)."""
    joined = _joined(components)
    if joined is None:
        return None
    position, layout = joined
    loader = vlm_sft.build(config_for(components, "rows", dataset=dataset, dataloader_type="single", workers=workers), layout)
    loader.end_at(steps)
    try:
        ids = [next(loader)["sample_ids"] for _ in range(steps)]
    finally:
        loader.close()
    return {"module": position.module.name, "dp_rank": position.dp_rank, "sample_ids": ids}


def consume_rows_failing_late(components, dataset: str, *, steps: int, bad: int, delay_s: float = 2.0) -> dict | None:
    """As :func:`consume_rows` (2 workers), with the row ``bad`` failing only after ``delay_s``: its rank's exchange
    thread has agreed on the end by then while its RowProcessor has not read it (the failure reaches the exchange
    through abort, after the end)."""
    from mimo_pipes.data.processing.module_processor import ModuleProcessor
    from mimo_pipes.samples.sample import SAMPLE_ID

    original = ModuleProcessor.__call__

    def slow_when_bad(self, row):
        if row.get(SAMPLE_ID) == bad:
            time.sleep(delay_s)
        return original(self, row)

    ModuleProcessor.__call__ = slow_when_bad  # this pool process only, put back below
    try:
        return consume_rows(components, dataset, steps=steps)
    finally:
        ModuleProcessor.__call__ = original
