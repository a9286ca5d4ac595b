"""Scenarios run on every rank of a Gloo pool: the exchange plugged into a user's node pipeline, and
wrapped around a user's iterator of collated micro-batches."""

from __future__ import annotations

import torch
from scenarios_exchange import PAD_VALUES, check_batch, join_layout, make_config, rank_result
from torchdata.stateful_dataloader import StatefulDataLoader

from mimo_pipes.adapters.microbatch_iterator import balance_iterator
from mimo_pipes.adapters.torchdata_pipeline import balanced_loader
from mimo_pipes.parallel.sharding import global_microbatch_indices, shard_indices
from mimo_pipes.parallel.topology import build_topology
from mimo_pipes.samples.collate import collate_microbatch
from mimo_pipes.samples.sample import SAMPLE_ID, STEP
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.existing_pipeline import example_samples
from mimo_pipes_recipes.vlm_sft import pipeline

DATASET_SIZE = 4096
SEQ_LENGTH = 2048  # the longest synthetic sample has 1569 tokens
METADATA_LISTS = ("step", "sample_ids", "slots", "image_tokens", "real_tokens", "costs")


def _rank(components, timeout_s=60.0):
    """(position, layout) of this rank, or None for a rank beyond the topology."""
    joined = join_layout(components, timeout_s=timeout_s)
    if joined is None:
        return None
    _, groups, layout = joined
    return groups.position, layout


def _wrapper_config(components, micro_batch_size, window_size, across, seed):
    """One global batch per window, so across-micro-batch windows are allowed."""
    return make_config(
        components, micro_batch_size=micro_batch_size, window_size=window_size, across=across, seed=seed,
        seq_length=SEQ_LENGTH, global_batch_size=micro_batch_size * window_size,
    )


def _record(batch, sample_ids=None):
    return {"step": batch["step"], "sample_ids": sample_ids or batch["sample_ids"], "image_tokens": batch["image_tokens"]}


def tag_origin(sample):
    """The user's own per-sample mapper: adds a field that must survive the exchange."""
    sample["origin"] = f"mapped:{sample[SAMPLE_ID]}"
    return sample


def run_recipe(components, *, steps, micro_batch_size, seed, window_size=1):
    """recipes/existing_pipeline.py end to end: the user's sampler/mapper nodes, then the library tail."""
    rank = _rank(components)
    if rank is None:
        return None
    position, layout = rank
    config = make_config(components, micro_batch_size=micro_batch_size, window_size=window_size, seed=seed, seq_length=SEQ_LENGTH)
    config.validate(world_size=build_topology(components).world_size)
    dataset = SyntheticProcessedDataset(DATASET_SIZE, seed=seed)
    samples = example_samples(dataset, micro_batch_size=micro_batch_size, layout=layout, seed=seed, map_fn=tag_origin)
    loader = balanced_loader(
        samples, reorder=config.reorder, layout=layout, micro_batch_size=micro_batch_size, seq_length=SEQ_LENGTH,
        image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES,
    )
    records = []
    try:
        for batch in loader:
            check_batch(batch, dataset)
            assert batch["origin"] == [f"mapped:{i}" for i in batch["sample_ids"]], "the user's mapper output was lost"
            assert batch["input_ids"].shape == (micro_batch_size // layout.dp_size, SEQ_LENGTH)
            records.append(_record(batch))
            if len(records) == steps:
                break
    finally:
        loader.close()
    return rank_result(position, records)


class RankMicrobatches:
    """This rank's collated micro-batch of every global step, as a Megatron-style loop holds them."""

    def __init__(self, dataset, layout, *, micro_batch_size, seed, with_ids, pad_length=SEQ_LENGTH):
        self.dataset, self.layout = dataset, layout
        self.micro_batch_size, self.seed, self.with_ids, self.pad_length = micro_batch_size, seed, with_ids, pad_length

    def __len__(self):
        return 1_000

    def __getitem__(self, step):
        indices = shard_indices(step, self.layout.dp_rank, self.layout.dp_size, DATASET_SIZE, self.micro_batch_size, self.seed, True)
        samples = []
        for index in indices:
            sample = self.dataset[int(index)]
            sample[STEP] = step
            if self.with_ids:
                sample[SAMPLE_ID] = int(index)
            samples.append(sample)
        batch = collate_microbatch(samples, pad_length=self.pad_length, pad_values=PAD_VALUES)
        for name in METADATA_LISTS:
            if name != "sample_ids" or not self.with_ids:
                del batch[name]  # a plain batch: model fields only
        return batch

    def iterate(self, first=0):
        step = first
        while True:
            yield self[step]
            step += 1


def dataset_ids(derived_ids, *, micro_batch_size, seed):
    """Dataset indices of ids the wrapper derived from (step, position): step * B + position."""
    return [
        int(global_microbatch_indices(sid // micro_batch_size, DATASET_SIZE, micro_batch_size, seed, True)[sid % micro_batch_size])
        for sid in derived_ids
    ]


def assert_batches_equal(got, expected, what, names=None):
    names = names or [name for name, value in expected.items() if isinstance(value, torch.Tensor)]
    for name in names:
        a, b = got[name], expected[name]
        if isinstance(b, torch.Tensor):
            same = isinstance(a, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        else:
            same = a == b
        assert same, f"{what}: field {name!r} differs"


def graph_batches_and_wrapper(dataset, config, layout, *, steps, micro_batch_size, seed, with_ids, **wrapper_options):
    """The graph's first ``steps`` micro-batches of ``dataset``, and ``balance_iterator`` (not yet started) over
    the same rank's collated micro-batches of it."""
    graph = pipeline(dataset, config, layout, map_fn=None, image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES)
    try:
        expected = [next(graph) for _ in range(steps)]
    finally:
        graph.close()
    source = RankMicrobatches(dataset, layout, micro_batch_size=micro_batch_size, seed=seed, with_ids=with_ids)
    wrapped = balance_iterator(
        source.iterate(), config=config.reorder, layout=layout, micro_batch_size=micro_batch_size,
        image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES, seq_length=SEQ_LENGTH, **wrapper_options,
    )
    return expected, wrapped


def run_wrapper_vs_graph(components, *, steps, micro_batch_size, seed, with_ids, window_size=1, across=False):
    """balance_iterator over collated micro-batches gives what the graph gives for the same samples."""
    rank = _rank(components)
    if rank is None:
        return None
    position, layout = rank
    config = _wrapper_config(components, micro_batch_size, window_size, across, seed)
    config.validate(world_size=build_topology(components).world_size)
    dataset = SyntheticProcessedDataset(DATASET_SIZE, seed=seed)
    expected, wrapped = graph_batches_and_wrapper(dataset, config, layout, steps=steps, micro_batch_size=micro_batch_size, seed=seed,
                                                  with_ids=with_ids)
    records = []
    with wrapped:
        for step, want in enumerate(expected):
            got = next(wrapped)
            ids = got["sample_ids"] if with_ids else dataset_ids(got["sample_ids"], micro_batch_size=micro_batch_size, seed=seed)
            assert ids == want["sample_ids"], f"step {step}: wrapper holds {ids}, graph holds {want['sample_ids']}"
            assert got["step"] == want["step"] == step
            check_batch({**got, "sample_ids": ids}, dataset)
            assert_batches_equal(got, want, f"step {step}")
            assert_batches_equal(got, want, f"step {step}", names=["image_tokens", "real_tokens", "costs"])
            records.append(_record(got, ids))
        assert wrapped.consumed_microbatches == steps
    return rank_result(position, records)


def _resume_source(kind, source, first=0):
    if kind == "stateful":
        return StatefulDataLoader(source, batch_size=None, shuffle=False, num_workers=0)
    return source.iterate(first)


def run_wrapper_resume(components, *, micro_batch_size, seed, window_size, across, stop_after, total, kind):
    """state_dict after ``stop_after`` micro-batches (inside a window), restore, and the stream continues
    exactly; so does a fresh start from the count alone (``consumed_microbatches``) with a source factory."""
    rank = _rank(components)
    if rank is None:
        return None
    position, layout = rank
    config = _wrapper_config(components, micro_batch_size, window_size, across, seed)
    dataset = SyntheticProcessedDataset(DATASET_SIZE, seed=seed)
    source = RankMicrobatches(dataset, layout, micro_batch_size=micro_batch_size, seed=seed, with_ids=False)
    common = dict(
        config=config.reorder, layout=layout, micro_batch_size=micro_batch_size, image_token_id=IMAGE_TOKEN_ID,
        pad_values=PAD_VALUES, seq_length=SEQ_LENGTH,
    )
    reference, state = [], None
    with balance_iterator(_resume_source(kind, source), **common) as wrapped:
        for count in range(total):
            if count == stop_after:
                state = wrapped.state_dict()
                assert wrapped.consumed_microbatches == stop_after
            reference.append(next(wrapped))
    outcomes = {}
    if kind == "stateful":
        restored = balance_iterator(_resume_source(kind, source), **common)
    else:
        restored = balance_iterator(source_factory=source.iterate, **common)
    restored.load_state_dict(state)
    outcomes["restored"] = restored
    if kind == "factory":
        outcomes["from_count"] = balance_iterator(source_factory=source.iterate, consumed_microbatches=stop_after, **common)
    for name, wrapped in outcomes.items():
        with wrapped:
            for count in range(stop_after, total):
                got = next(wrapped)
                want = reference[count]
                assert got["sample_ids"] == want["sample_ids"], f"{name}: micro-batch {count} holds other samples"
                assert_batches_equal(got, want, f"{name}: micro-batch {count}")
            assert wrapped.consumed_microbatches == total
    records = [_record(b, dataset_ids(b["sample_ids"], micro_batch_size=micro_batch_size, seed=seed)) for b in reference]
    return rank_result(position, records)
