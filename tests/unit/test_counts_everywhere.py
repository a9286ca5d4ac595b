"""Every public entry point that takes a count or a size, walked with one value in each form a user may hand it:
numpy and torch integers are taken as the int they are (and what is kept is a plain int, states included);
a float (even a whole one), a bool, a string or a value below the range is refused where it is given, in one
line naming the parameter and the reason (the kind, or the range), never later or for another reason."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torchdata.nodes import IterableWrapper

from mimo_pipes.adapters.microbatch_iterator import balance_iterator
from mimo_pipes.adapters.torchdata_pipeline import balanced_loader, reader_first_step
from mimo_pipes.analysis.analyze import analyze
from mimo_pipes.config import PipelineConfig, ReorderConfig
from mimo_pipes.data.bad_rows.skipping import SkipBadRows
from mimo_pipes.errors import ConfigError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.graph.loader import GraphLoader
from mimo_pipes.megatron import MimoBatchSettings, global_microbatch_size, grid_layout, stage_of
from mimo_pipes.megatron.routing import peer_row_counts
from mimo_pipes.nodes.canonical_shard_reader import CanonicalShardReader
from mimo_pipes.samples.collate import collate_microbatch
from mimo_pipes.samples.sample import STEP
from mimo_pipes.samples.thd import pack_microbatch
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes.time_model.model import TimeModel
from mimo_pipes_recipes.existing_pipeline import example_samples

PAD_VALUES = {"input_ids": 0, "labels": -100}
SAME = {"np.int64": np.int64, "np.int32": np.int32, "torch": torch.tensor}
REFUSED = {  # the form, and what the message says of it
    "float": (float, "must be an integer"),
    "bool": (lambda good: True, "must be an integer"),
    "str": (str, "must be an integer"),
    "negative": (lambda good: -1, "-1"),
}


@dataclass(frozen=True)
class Entry:
    """``call(value)`` hands ``value`` to the entry point as ``name``; ``good`` is a value it takes; ``kept(result)``
    gives what it kept of the value (checked to be a plain int equal to ``good``), or None where it keeps nothing."""

    name: str
    good: int
    call: Callable[[Any], Any]
    kept: Callable[[Any], Any] | None = None


def batches(first: int = 0):
    dataset = SyntheticProcessedDataset(64, seed=2, text_tokens=4, patch_dim=2)
    step = first
    while True:
        samples = [{**dataset[(step * 4 + j) % 64], STEP: step} for j in range(4)]
        yield {k: v for k, v in collate_microbatch(samples, pad_length=2048, pad_values=PAD_VALUES).items() if k != "step"}
        step += 1


def iterated(**overrides):
    """balance_iterator over a factory of micro-batches, one taken; its state (JSON-plain, or this fails)."""
    options = dict(config=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_window_size=2),
                   layout=RankLayout(0, 1, 1), micro_batch_size=4, image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES,
                   seq_length=2048, source_factory=batches)
    with balance_iterator(**{**options, **overrides}) as loader:
        next(loader)
        return json.loads(json.dumps(loader.state_dict()))


def loaded(**overrides):
    layout = RankLayout(0, 1, 1)
    dataset = SyntheticProcessedDataset(64, seed=2, text_tokens=4, patch_dim=2)
    options = dict(reorder=ReorderConfig(), layout=layout, micro_batch_size=4, seq_length=2048, image_token_id=IMAGE_TOKEN_ID,
                   pad_values=PAD_VALUES)
    loader = balanced_loader(example_samples(dataset, micro_batch_size=4, layout=layout, seed=1, num_workers=1), **{**options, **overrides})
    try:
        next(loader)
        return json.loads(json.dumps(loader.state_dict()))
    finally:
        loader.close()


def grids(micro_batch_size):
    grid = {"images": SimpleNamespace(shape=[1, 1, 1, 2], dim_names=["tp", "cp", "pp", "dp"], rank_offset=0),
            "language": SimpleNamespace(shape=[1, 1, 1, 4], dim_names=["tp", "cp", "pp", "dp"], rank_offset=2)}
    return grid_layout(grid, micro_batch_size=micro_batch_size)


def analysed(**counts):
    config = PipelineConfig(components=("language=dp=2",), micro_batch_size=4, dataloader_type="single")
    return analyze(config, config.validate(), np.arange(32, dtype=np.int64), np.arange(32, dtype=np.int64), **{"start": 0, "stop": 4, **counts})


def reader(**counts):
    """A CanonicalShardReader; its state's description holds its counts (plain values only)."""
    node = CanonicalShardReader(SyntheticProcessedDataset(16), **{"micro_batch_size": 4, "dp_rank": 1, "dp_size": 2, "grid_size": 2, **counts})
    json.dumps(node.valid_for)
    return node


def packed(pad_multiple):
    return pack_microbatch(next(batches()), pad_multiple=pad_multiple)


def entries() -> list[Entry]:
    found = [Entry(name, {"global_batch_size": 16, "micro_batch_size": 4}.get(name, max(least, 1) * 8), lambda v, n=name: PipelineConfig(**{n: v}),
                   lambda c, n=name: getattr(c, n)) for name, least in PipelineConfig.COUNTS.items()]
    found += [Entry(name, 4, lambda v, n=name: ReorderConfig(**{n: v}), lambda c, n=name: getattr(c, n)) for name in ReorderConfig.COUNTS]
    layout = {"dp_rank": 1, "dp_size": 2, "grid_size": 4}
    found += [Entry(name, good, lambda v, n=name: RankLayout(**{**layout, n: v}), lambda r, n=name: getattr(r, n)) for name, good in layout.items()]
    found += [
        Entry("micro_batch_size", 8, grids),
        *(Entry(name, good, lambda v, n=name: iterated(**{n: v})) for name, good in
          (("micro_batch_size", 4), ("seq_length", 2048), ("merge_size", 2), ("consumed_microbatches", 3))),
        Entry("pack_pad_multiple", 8, lambda v: iterated(pack_sequences=True, pack_pad_multiple=v)),
        *(Entry(name, good, lambda v, n=name: loaded(**{n: v})) for name, good in
          (("micro_batch_size", 4), ("seq_length", 2048), ("consumed_microbatches", 3))),
        Entry("consumed_microbatches", 3, lambda v: reader_first_step(ReorderConfig(), v)),
        Entry("consumed_microbatches", 3, lambda v: GraphLoader(IterableWrapper([]), consumed_microbatches=v), lambda g: g.consumed_microbatches),
        Entry("end_microbatches", 3, lambda v: GraphLoader(IterableWrapper([]), end_microbatches=v)),
        *(Entry(f"mimo_batch: {name}", good, lambda v, n=name: MimoBatchSettings(**{n: v}), lambda s, n=name: getattr(s, n)) for name, good in
          (("image_token_id", 5), ("video_token_id", 6), ("spatial_merge_size", 2))),
        Entry("pad_multiple", 8, packed),
        *(Entry(name, good, lambda v, n=name: reader(**{n: v}), lambda r, n=name: getattr(r, n)) for name, good in
          (("micro_batch_size", 4), ("grid_size", 2), ("dp_rank", 1), ("seed", 3))),
        *(Entry(name, good, lambda v, n=name: SkipBadRows(lambda row: row, SyntheticProcessedDataset(16), **{"micro_batch_size": 4, "seed": 1,
                                                                                                       "dataloader_type": "single", n: v}),
                lambda r, n=name: getattr(r, n)) for name, good in (("micro_batch_size", 4), ("seed", 3))),
        Entry("per_patch_ps", 5, lambda v: TimeModel(per_patch_ps=v), lambda m: m.per_patch_ps),
        Entry("merge_size", 2, lambda v: TimeModel(per_patch_ps=1, merge_size=v), lambda m: m.merge_size),
        Entry("stop", 4, lambda v: analysed(stop=v)),
        Entry("pp_size", 4, lambda v: stage_of(0, v)),
        Entry("peers", 2, lambda v: peer_row_counts([3, 3], 6, v)),
        Entry("micro_batch_size", 4, lambda v: global_microbatch_size(micro_batch_size=v, data_parallel_size=2)),
    ]
    return found


ENTRIES = {f"{entry.name}@{k}": entry for k, entry in enumerate(entries())}


@pytest.mark.parametrize("form", sorted(SAME))
@pytest.mark.parametrize("where", sorted(ENTRIES))
def test_numpy_and_torch_integers_are_taken_as_ints(where, form):
    entry = ENTRIES[where]
    result = entry.call(SAME[form](entry.good))
    if entry.kept is not None:
        kept = entry.kept(result)
        assert type(kept) is int and kept == entry.good, (where, kept)


@pytest.mark.parametrize("form", sorted(REFUSED))
@pytest.mark.parametrize("where", sorted(ENTRIES))
def test_anything_else_is_refused_in_one_line_naming_the_parameter(where, form):
    entry = ENTRIES[where]
    make, reason = REFUSED[form]
    with pytest.raises(ValueError) as raised:  # ConfigError, and TimeModelError for a time model's terms
        entry.call(make(entry.good))
    message = str(raised.value)
    assert "\n" not in message and f"{entry.name}: " in message and reason in message, (where, message)
    assert isinstance(raised.value, ConfigError) or "time model" in message, (where, message)
