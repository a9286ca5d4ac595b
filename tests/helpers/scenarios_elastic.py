"""Elastic resume on every rank of the Gloo pool: states saved by one layout, restored by graphs of others.

Every pool rank runs the whole scenario: the saving layout's ranks consume the stream and save states at
each point; the states of each module's first rank reach every rank (one all-gather); then each resuming
layout's ranks restore them and consume to the end. What every rank consumed comes back, by layout."""

from __future__ import annotations

import json
import time

import torch.distributed as dist
from scenarios_exchange import PAD_VALUES, join_layout, make_config

from mimo_pipes.data.bad_rows.skipping import SkipBadRows
from mimo_pipes.errors import SampleError
from mimo_pipes.exchange.world import gather_from_every_rank
from mimo_pipes.samples.sample import SAMPLE_ID
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline

DATASET_SIZE = 96


class FailOn:
    """A per-sample step that cannot process some rows (as a processor fails on a corrupt image)."""

    def __init__(self, bad: list[int]) -> None:
        self.bad = set(bad)

    def __call__(self, row: dict) -> dict:
        if row[SAMPLE_ID] in self.bad:
            raise SampleError(row[SAMPLE_ID], "cannot be processed (a bad row of the test)")
        return row


def _records(loader, count: int, position) -> list[dict]:
    out = []
    for _ in range(count):
        batch = next(loader)
        out.append({"module": position.module.name, "dp_rank": position.dp_rank, "dp_size": position.dp_size,
                    "step": int(batch["step"]), "sample_ids": [int(i) for i in batch["sample_ids"]]})
    return out


def elastic_resume(save_layout, resume_layouts, *, steps: int, points: list[int], window: int, across: bool, overlap: bool,
                   bad_rows: list[int], micro_batch_size: int = 8, seed: int = 5, settle_s: float = 0.2,
                   two_level: bool = False) -> dict | None:
    """``{"uninterrupted": records, "resumed": {layout index: {point: records}}}`` on global rank 0 (None on
    the others): every rank's consumed micro-batches of the uninterrupted run on ``save_layout`` and of each
    resume, on each of ``resume_layouts``, from each saved point. ``two_level``: ``--reorder-two-level``
    (encoder replicas by encoder cost, then their language slots by real tokens)."""

    def new_loader(components, layout, end: int | None = steps):
        """A graph that ends with the window holding micro-batch ``steps`` (``end`` None: one that reads on)."""
        config = make_config(components, micro_batch_size=micro_batch_size, window_size=window, across=across, overlap=overlap,
                             global_batch_size=micro_batch_size * window, seed=seed, reorder_language_cost_weight=1.0 if two_level else 0.0)
        config.reorder.reorder_two_level = two_level
        dataset = SyntheticProcessedDataset(DATASET_SIZE, seed=seed)
        skip = SkipBadRows(FailOn(bad_rows), dataset, micro_batch_size=micro_batch_size, seed=seed, dataloader_type="cyclic")
        loader = pipeline(dataset, config, layout, map_fn=skip, image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES)
        loader.end_at(end)
        return loader

    joined = join_layout(save_layout)
    uninterrupted, saved = [], {}
    if joined is not None:
        _, groups, layout = joined
        position = groups.position
        reference = new_loader(save_layout, layout)
        uninterrupted = _records(reference, steps, position)
        reference.close()
        first = position.dp_rank == position.tp_rank == position.pp_rank == 0
        for point in points:
            loader = new_loader(save_layout, layout, end=None)  # reads ahead freely: windows in flight at the save
            _records(loader, point, position)
            time.sleep(settle_s)  # windows in flight on the prefetch thread when the state is taken
            state = json.loads(json.dumps(loader.state_dict()))
            loader.close()
            if first:
                saved[point] = state
        saved = {position.module.name: saved} if first else {}
    everything = gather_from_every_rank((uninterrupted, saved))
    states = {module: by_point for _, per_rank in everything for module, by_point in per_rank.items()}
    resumed: dict = {}
    for number, components in enumerate(resume_layouts):
        joined = join_layout(components)
        mine: dict = {}
        if joined is not None:
            _, groups, layout = joined
            position = groups.position
            for point in points:
                loader = new_loader(components, layout)
                loader.load_state_dict(states[position.module.name][point])
                assert loader.consumed_microbatches == point
                mine[point] = _records(loader, steps - point, position)
                loader.close()
        gathered = gather_from_every_rank(mine)
        resumed[number] = {point: [r for per_rank in gathered for r in per_rank.get(point, [])] for point in points}
    if dist.get_rank() != 0:
        return None
    return {"uninterrupted": [r for per_rank, _ in everything for r in per_rank], "resumed": resumed}
