"""Resume scenarios on every rank: the stream after a restore equals the uninterrupted stream, bitwise."""

from __future__ import annotations

import hashlib
import json
import time

import torch
from scenarios_exchange import PAD_VALUES, join_layout, make_config

from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline


def mark_processed(sample: dict) -> dict:
    """A per-sample map step, so the chain includes torchdata's ParallelMapper as recipes do."""
    sample["processed"] = torch.tensor([sample["sample_id"]])
    return sample


def fingerprint(batch: dict) -> tuple:
    """(step, sample ids, digest of every tensor's dtype, shape and bytes): equal only if bitwise equal."""
    digest = hashlib.sha256()
    for name in sorted(batch):
        value = batch[name]
        if isinstance(value, torch.Tensor):
            digest.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
            digest.update(value.contiguous().view(torch.uint8).numpy().tobytes())
    return batch["step"], list(batch["sample_ids"]), digest.hexdigest()


def resume_points(components, *, steps, points, dataset_size=160, settle_s=0.3, restore_overlap=None, **config_kwargs):
    """For each point K: consume K micro-batches, save the state (through JSON, as on disk), close the graph,
    build a new one, restore, consume to ``steps``; also rebuild from the count K alone (Megatron).
    ``restore_overlap`` (when not None) builds the restored graphs with that overlap setting instead."""
    joined = join_layout(components, timeout_s=60)
    if joined is None:
        return None
    topology, groups, layout = joined
    position = groups.position
    config = make_config(components, **config_kwargs)
    config.validate(world_size=topology.world_size)

    restored_config = config
    if restore_overlap is not None:
        restored_config = make_config(components, **{**config_kwargs, "overlap": restore_overlap})

    def new_loader(consumed: int = 0, config=config, end: int | None = steps):
        """A graph that ends with the window holding micro-batch ``steps`` (``end`` None: one that reads on)."""
        dataset = SyntheticProcessedDataset(dataset_size, seed=config.seed)
        loader = pipeline(dataset, config, layout, map_fn=mark_processed, image_token_id=IMAGE_TOKEN_ID,
                          pad_values=PAD_VALUES, consumed_microbatches=consumed)
        loader.end_at(end)
        return loader

    def consume(loader, count):
        out = []
        iterator = iter(loader) if count else None
        for _ in range(count):
            out.append(fingerprint(next(iterator)))
        return out

    reference_loader = new_loader()
    reference = consume(reference_loader, steps)
    reference_loader.close()
    outcome = {"module": position.module.name, "dp_rank": position.dp_rank, "points": {}}
    for point in points:
        first = new_loader(end=None)  # reads ahead freely: windows are in flight when its state is taken
        head = consume(first, point) if point else []
        time.sleep(settle_s)  # let the prefetch thread fill up: windows in flight when the state is taken
        state = json.loads(json.dumps(first.state_dict()))
        first.close()
        second = new_loader(config=restored_config)
        second.load_state_dict(state)
        tail = consume(second, steps - point)
        yielded = second.consumed_microbatches
        second.close()
        by_count = new_loader(consumed=point, config=restored_config)
        counted = consume(by_count, steps - point)
        by_count.close()
        outcome["points"][point] = {
            "full_state": head + tail == reference,
            "count_only": counted == reference[point:],
            "num_yielded": yielded,
            "first_mismatch": next((i for i, (a, b) in enumerate(zip(head + tail, reference)) if a != b), None),
        }
    return outcome
