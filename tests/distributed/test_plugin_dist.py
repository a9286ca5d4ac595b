"""The three ways into an existing training stack: Uncollate on its own, the plug-in recipe over a user's
nodes, and balance_iterator over a user's collated micro-batches (real Gloo ranks, one pool of 4)."""

from __future__ import annotations

import pytest
import torch
from layout_checks import baseline_spread, check_fanout, check_invariants, vision_spread
from node_checks import starting_at
from scenarios_exchange import PAD_VALUES
from scenarios_plugin import run_recipe, run_wrapper_resume, run_wrapper_vs_graph

from mimo_pipes.adapters.microbatch_iterator import balance_iterator
from mimo_pipes.adapters.torchdata_pipeline import balanced_loader
from mimo_pipes.config import ReorderConfig
from mimo_pipes.errors import ConfigError, SampleError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.nodes.uncollate import Uncollate
from mimo_pipes.samples.collate import collate_microbatch
from mimo_pipes.samples.sample import SAMPLE_ID, SLOT, STEP
from mimo_pipes.testing import IMAGE_TOKEN_ID, MERGE, TEXT_TOKEN_ID, SyntheticProcessedDataset

BATCH = 8
LAYOUTS = {
    "lang2-img2": ["language=dp=2", "images=dp=2,rank_offset=2"],
    "lang2-img1": ["language=dp=2", "images=dp=1,rank_offset=2"],  # 3 ranks: the 4th idles
}


# --- Uncollate on its own (no distributed) ---------------------------------------------------------


def multi_image_sample(sample_id: int, grids: list[list[int]], text: int = 5, patch_dim: int = 16) -> dict:
    """A row with several images, placeholders in groups, pixel rows unique to the sample."""
    grid = torch.tensor(grids, dtype=torch.int64).reshape(-1, 3)
    ids = [TEXT_TOKEN_ID] * text
    for t, h, w in grid.tolist():
        ids += [IMAGE_TOKEN_ID] * (t * h * w // MERGE**2) + [TEXT_TOKEN_ID]
    input_ids = torch.tensor(ids, dtype=torch.int64)
    patches = int(grid.prod(dim=1).sum())
    pixel_values = torch.randn(patches, patch_dim, generator=torch.Generator().manual_seed(sample_id))
    length = len(ids)
    return {
        SAMPLE_ID: sample_id,
        STEP: 7,
        SLOT: sample_id % 2,
        "input_ids": input_ids,
        "attention_mask": torch.ones(length, dtype=torch.int64),
        "labels": torch.where(input_ids == IMAGE_TOKEN_ID, -100, input_ids),
        "loss_mask": (input_ids != IMAGE_TOKEN_ID).float(),
        "position_ids": torch.arange(length),
        "pixel_values": pixel_values,
        "image_grid_thw": grid,
        "origin": f"row {sample_id}",
        "score": torch.tensor([float(sample_id), 0.5]),
    }


def mixed_rows() -> list[dict]:
    return [
        multi_image_sample(10, [[1, 2, 4], [1, 4, 4], [2, 2, 2]]),  # three images
        multi_image_sample(11, []),  # text only
        multi_image_sample(12, [[1, 2, 2]]),  # one tiny image
        multi_image_sample(13, []),
        multi_image_sample(14, [[1, 6, 4], [1, 2, 2]]),
    ]


def assert_same_samples(got: list[dict], expected: list[dict]) -> None:
    assert len(got) == len(expected)
    for out, original in zip(got, expected):
        assert set(out) == set(original), f"sample {original[SAMPLE_ID]}: keys {sorted(out)} != {sorted(original)}"
        for name, value in original.items():
            if isinstance(value, torch.Tensor):
                same = out[name].dtype == value.dtype and out[name].shape == value.shape and torch.equal(out[name], value)
                assert same, f"sample {original[SAMPLE_ID]}: field {name} differs"
            else:
                assert out[name] == value, f"sample {original[SAMPLE_ID]}: field {name} differs"


@pytest.mark.parametrize("pad_length", [None, 96])
def test_uncollate_round_trip_is_bitwise(pad_length):
    rows = mixed_rows()
    batch = collate_microbatch(rows, pad_length=pad_length, pad_values={"input_ids": 3, "labels": -100})
    out = list(starting_at(Uncollate(iter([batch]), image_token_id=IMAGE_TOKEN_ID), 7))
    assert_same_samples(out, rows)
    # and collating again gives the batch back, padding included
    again = collate_microbatch(out, pad_length=pad_length, pad_values={"input_ids": 3, "labels": -100})
    for name, value in batch.items():
        assert torch.equal(again[name], value) if isinstance(value, torch.Tensor) else again[name] == value, name


def test_uncollate_synthetic_rows_with_derived_ids_and_steps():
    dataset = SyntheticProcessedDataset(64, seed=4)
    batches = []
    for step in range(3):
        samples = [{**dataset[step * 4 + j], STEP: step} for j in range(4)]
        batch = collate_microbatch(samples, pad_length=2048, pad_values=PAD_VALUES)
        batches.append({name: value for name, value in batch.items() if isinstance(value, torch.Tensor)})
    node = starting_at(Uncollate(iter(batches), image_token_id=IMAGE_TOKEN_ID, rows_per_batch=4, dp_rank=1, dp_size=2), 5)
    out = list(node)
    assert [s[STEP] for s in out] == [5] * 4 + [6] * 4 + [7] * 4
    # position in the global micro-batch of 8, counted over steps: step * 8 + 4 * dp_rank + row
    assert [s[SAMPLE_ID] for s in out] == [step * 8 + 4 + row for step in (5, 6, 7) for row in range(4)]
    for position, sample in enumerate(out):
        original = dataset[position]
        for name, value in original.items():
            assert torch.equal(sample[name], value) and sample[name].dtype == value.dtype, (position, name)


def test_uncollate_uses_num_images_when_given():
    rows = mixed_rows()
    batch = collate_microbatch(rows, pad_length=None)
    del batch["vision_rows"]
    batch["num_images"] = [3, 0, 1, 0, 2]
    batch["input_ids"] = torch.where(batch["input_ids"] == IMAGE_TOKEN_ID, TEXT_TOKEN_ID, batch["input_ids"])
    out = list(starting_at(Uncollate(iter([batch]), image_token_id=IMAGE_TOKEN_ID), 7))
    assert [s["image_grid_thw"].shape[0] for s in out] == [3, 0, 1, 0, 2]
    for got, original in zip(out, rows):
        assert torch.equal(got["pixel_values"], original["pixel_values"])


def test_uncollate_refuses_what_it_cannot_split():
    rows = mixed_rows()
    batch = collate_microbatch(rows, pad_length=None)
    del batch["vision_rows"]  # as another library collates: images are split by their placeholder tokens
    wrong_merge = starting_at(Uncollate(iter([batch]), image_token_id=IMAGE_TOKEN_ID, merge_size=1), 7)
    with pytest.raises(SampleError, match="image placeholder tokens"):
        next(iter(wrong_merge))
    extra = dict(batch, extra_grid=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="extra_grid"):
        next(iter(Uncollate(iter([extra]), image_token_id=IMAGE_TOKEN_ID)))
    left = dict(batch, attention_mask=batch["attention_mask"].flip(1))
    with pytest.raises(SampleError, match="left"):
        next(iter(Uncollate(iter([left]), image_token_id=IMAGE_TOKEN_ID)))
    with pytest.raises(ValueError, match="expected 4"):
        next(iter(Uncollate(iter([batch]), image_token_id=IMAGE_TOKEN_ID, rows_per_batch=4)))


def test_uncollate_restores_inside_a_batch():
    batches = [collate_microbatch(mixed_rows(), pad_length=None) for _ in range(3)]
    node = starting_at(Uncollate(batches, image_token_id=IMAGE_TOKEN_ID), 7)  # a list: re-iterable
    node.reset()
    head = [next(node) for _ in range(7)]
    state = node.state_dict()
    rest = list(node)
    node.reset(state)
    assert [(s[STEP], s[SAMPLE_ID]) for s in node] == [(s[STEP], s[SAMPLE_ID]) for s in rest]
    assert len(head) + len(rest) == 15


# --- balance_iterator without peers (DP 1: a local permutation) -------------------------------------


def single_rank_batches(first: int = 0):
    dataset = SyntheticProcessedDataset(256, seed=2)
    step = first
    while True:
        samples = [{**dataset[step * 4 + j], STEP: step} for j in range(4)]
        yield {k: v for k, v in collate_microbatch(samples, pad_length=2048, pad_values=PAD_VALUES).items() if k != "step"}
        step += 1


def reorder_config(**overrides) -> ReorderConfig:
    return ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, **overrides)


def wrap_single(source=None, **overrides):
    settings = dict(
        config=reorder_config(reorder_window_size=2), layout=RankLayout(0, 1, 1), micro_batch_size=4,
        image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES, seq_length=2048,
    )
    settings.update(overrides)
    return balance_iterator(source, **settings)


def test_wrapper_plain_iterator_saves_counters_but_refuses_to_restore():
    with wrap_single(single_rank_batches()) as wrapped:
        head = [next(wrapped) for _ in range(3)]
        state = wrapped.state_dict()
        tail = [next(wrapped) for _ in range(3)]
    assert [b["step"] for b in head + tail] == list(range(6))
    with pytest.raises(RuntimeError, match="source_factory"):
        wrap_single(single_rank_batches()).load_state_dict(state)
    # the same counters restore through a factory that opens the source at a micro-batch
    with wrap_single(source_factory=single_rank_batches) as restored:
        restored.load_state_dict(state)
        again = [next(restored) for _ in range(3)]
    for got, want in zip(again, tail):
        assert got["sample_ids"] == want["sample_ids"] and torch.equal(got["pixel_values"], want["pixel_values"])


def test_wrapper_config_errors_name_the_setting():
    """In Python the setting's field or argument name (a command names its flag)."""
    with pytest.raises(ConfigError, match="^intra_microbatch_reorder: needs scalable_dp"):
        wrap_single(single_rank_batches(), config=ReorderConfig(intra_microbatch_reorder=True))
    with pytest.raises(ConfigError, match="^pad_to_seq_length: "):
        wrap_single(single_rank_batches(), pad_to_seq_length=False)
    with pytest.raises(ConfigError, match="^micro_batch_size: "):
        wrap_single(single_rank_batches(), layout=RankLayout(0, 2, 2), micro_batch_size=5)
    with pytest.raises(TypeError, match="exactly one"):
        wrap_single(single_rank_batches(), source_factory=single_rank_batches)
    with pytest.raises(ConfigError, match="^micro_batch_size: "):  # the recipe runs the same checks
        balanced_loader(None, reorder=reorder_config(), layout=RankLayout(0, 2, 2), micro_batch_size=5, seq_length=64,
              image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES)


# --- Real Gloo ranks ------------------------------------------------------------------------------


@pytest.fixture
def pool(gloo_pool):
    return gloo_pool


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_recipe_plugs_into_user_nodes(pool, name):
    steps, seed = 10, 21
    results = pool.run(run_recipe, LAYOUTS[name], steps=steps, micro_batch_size=BATCH, seed=seed)
    assert sum(r is not None for r in results) == (4 if name == "lang2-img2" else 3)
    check_invariants(results, micro_batch_size=BATCH, seed=seed)
    check_fanout(results, "images")
    after = vision_spread(results, "language")
    before = baseline_spread(2, steps, micro_batch_size=BATCH, seed=seed)
    assert after < before, f"{name}: the plug-in did not lower the mean vision spread ({before} -> {after})"


@pytest.mark.parametrize(
    "name, with_ids, window_size, across",
    [("lang2-img2", True, 1, False), ("lang2-img2", False, 2, True), ("lang2-img1", False, 1, False)],
)
def test_wrapper_matches_the_graph(pool, name, with_ids, window_size, across):
    results = pool.run(
        run_wrapper_vs_graph, LAYOUTS[name], steps=6, micro_batch_size=BATCH, seed=9, with_ids=with_ids,
        window_size=window_size, across=across,
    )
    check_invariants(results, micro_batch_size=BATCH, seed=9, window_size=window_size, across=across)
    check_fanout(results, "images")


@pytest.mark.parametrize("name, kind", [("lang2-img2", "factory"), ("lang2-img1", "stateful")])
def test_wrapper_resumes_inside_a_window(pool, name, kind):
    # window of 3 with samples moving across its micro-batches; stop after 4 = one into the second window
    results = pool.run(
        run_wrapper_resume, LAYOUTS[name], micro_batch_size=BATCH, seed=13, window_size=3, across=True,
        stop_after=4, total=9, kind=kind,
    )
    check_invariants(results, micro_batch_size=BATCH, seed=13, window_size=3, across=True)
    check_fanout(results, "images")
