"""Scenarios run on every rank of a Gloo pool: every entry point honours ``RankLayout.module`` as the
recipe's graph (what ``mimo-pipes run`` builds) does: the same fields, the same bytes moved. The entry points
take the layout as docs/plugging-in.md builds it (``build_rank_groups(topology).layout()``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from scenarios_exchange import PAD_VALUES, join_layout, make_config
from scenarios_plugin import RankMicrobatches
from torch.utils.data import DataLoader

import mimo_pipes.exchange.collectives as collectives
from mimo_pipes.adapters.dataloader import RankMicroBatches
from mimo_pipes.adapters.microbatch_iterator import balance_iterator
from mimo_pipes.adapters.torchdata_pipeline import balanced_loader
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes import existing_pipeline
from mimo_pipes_recipes.vlm_sft import pipeline

SEQ_LENGTH = 2048
DATASET_SIZE = 4096


class _Moved:
    """Bytes this rank sent and received in every window, and the samples they held."""

    def __init__(self) -> None:
        self.windows: list[tuple[int, int, int, int]] = []

    def __call__(self, record) -> None:
        self.windows.append((record.bytes_sent, record.bytes_received, record.samples_sent, record.samples_received))


@contextlib.contextmanager
def _encoded_fields() -> Iterator[set[str]]:
    """The field names of every sample this process encodes for the exchange while inside."""
    fields: set[str] = set()
    encode = collectives.sample_encoding

    def spy(sample):
        fields.update(sample)
        return encode(sample)

    collectives.sample_encoding = spy
    try:
        yield fields
    finally:
        collectives.sample_encoding = encode


def _consume(loader, exchange, steps: int) -> dict:
    moved = _Moved()
    exchange.add_observer(moved)
    keys, ids = set(), []
    with _encoded_fields() as encoded:
        iterator = iter(loader)
        for _ in range(steps):
            batch = next(iterator)
            keys |= set(batch)
            ids.append(list(batch["sample_ids"]))
    return {"keys": sorted(keys), "ids": ids, "moved": moved.windows, "encoded": sorted(encoded)}


def entry_points(components, *, steps: int, micro_batch_size: int, seed: int, window_size: int = 1) -> dict | None:
    """Per entry point: the fields this rank's micro-batches carried, their sample ids and the bytes moved
    per window; ``run`` is the recipe's graph, ``all-fields`` the same graph built without a module."""
    joined = join_layout(components, timeout_s=60)
    if joined is None:
        return None
    _, groups, plain = joined  # plain: a layout without a module (every field)
    layout = groups.layout()
    config = make_config(components, micro_batch_size=micro_batch_size, window_size=window_size, seed=seed, seq_length=SEQ_LENGTH,
                         global_batch_size=micro_batch_size * window_size)
    dataset = SyntheticProcessedDataset(DATASET_SIZE, seed=seed)
    out: dict = {"module": groups.position.module.name, "layout_module": layout.module, "dp_rank": layout.dp_rank, "dp_size": layout.dp_size}

    def graph(for_layout):
        return pipeline(dataset, config, for_layout, map_fn=None, image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES)

    def plugged():
        samples = existing_pipeline.example_samples(dataset, micro_batch_size=micro_batch_size, layout=layout, seed=seed)
        return balanced_loader(samples, reorder=config.reorder, layout=layout, micro_batch_size=micro_batch_size,
                                       seq_length=SEQ_LENGTH, image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES)

    for name, make in (("run", lambda: graph(layout)), ("all-fields", lambda: graph(plain)), ("existing_pipeline", plugged)):
        loader = make()
        try:
            out[name] = _consume(loader, loader.exchange_node(), steps)
        finally:
            loader.close()
    source = RankMicrobatches(dataset, layout, micro_batch_size=micro_batch_size, seed=seed, with_ids=True)
    with balance_iterator(source.iterate(), config=config.reorder, layout=layout, micro_batch_size=micro_batch_size,
                          image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES, seq_length=SEQ_LENGTH) as wrapped:
        out["balance_iterator"] = _consume(wrapped, wrapped.exchange_node(), steps)
    view = RankMicroBatches(plugged)
    try:
        out["dataloader"] = _consume(DataLoader(view, batch_size=None, num_workers=0), view.loader.exchange_node(), steps)
    finally:
        view.close()
    return out
