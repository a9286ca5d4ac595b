"""CanonicalShardReader: this rank's canonical slots, restore at every position, and what its state is valid for."""

from __future__ import annotations

import datasets
import pytest
from node_checks import check_refused, check_save_load_everywhere, saved_after, starting_at, take

from mimo_pipes.checkpoint.validity import SAMPLED_ROWS, source_fingerprint
from mimo_pipes.errors import StateMismatchError
from mimo_pipes.nodes import CanonicalShardReader
from mimo_pipes.parallel.sharding import global_microbatch_indices
from mimo_pipes.samples.sample import SAMPLE_ID, SLOT, STEP
from mimo_pipes.testing import SyntheticProcessedDataset

DATASET = SyntheticProcessedDataset(40, seed=3, text_tokens=4, patch_dim=2)


def reader(dataset=DATASET, **overrides) -> CanonicalShardReader:
    settings = dict(micro_batch_size=8, dp_rank=1, dp_size=2, grid_size=4, seed=5, dataloader_type="cyclic")
    first_step = overrides.pop("first_step", 0)
    settings.update(overrides)
    return starting_at(CanonicalShardReader(dataset, **settings), first_step)


@pytest.mark.parametrize("dataloader_type, count", [("single", None), ("cyclic", 44)])
def test_restores_at_every_position(dataloader_type, count):
    # cyclic: 5 micro-batches per epoch, 4 samples each on this rank; 44 items cross into a third epoch
    items = check_save_load_everywhere(lambda: reader(dataloader_type=dataloader_type), count)
    assert len(items) == (20 if dataloader_type == "single" else 44)


def test_ranks_read_their_own_slots_of_each_global_microbatch():
    streams = [take(reader(dp_rank=rank, dp_size=2), 24) for rank in range(2)]
    for step in range(6):
        ours = [[s[SAMPLE_ID] for s in stream if s[STEP] == step] for stream in streams]
        assert ours[0] + ours[1] == global_microbatch_indices(step, len(DATASET), 8, 5, True).tolist()
        assert [s[SLOT] for s in streams[1] if s[STEP] == step] == [2, 2, 3, 3]


def test_start_step_is_the_restore_of_a_count():
    restored = reader()
    restored.reset(saved_after(reader(), 3 * 4))
    assert [s[SAMPLE_ID] for s in take(reader(first_step=3), 12)] == [s[SAMPLE_ID] for s in take(restored, 12)]


def test_bad_settings():
    with pytest.raises(ValueError, match="single or cyclic"):
        reader(dataloader_type="external")
    with pytest.raises(ValueError, match="fewer than one micro-batch"):
        reader(SyntheticProcessedDataset(6))


MISMATCHES = [
    ("micro-batch size", dict(micro_batch_size=4, grid_size=2), 8, 4),
    ("dp rank", dict(dp_rank=0), 1, 0),
    ("dp size", dict(dp_size=4, dp_rank=1), 2, 4),
    ("canonical grid size", dict(grid_size=2), 4, 2),
    ("seed", dict(seed=6), 5, 6),
    ("dataloader type", dict(dataloader_type="single"), "cyclic", "single"),
    ("dataset length", dict(dataset=SyntheticProcessedDataset(48, seed=3, text_tokens=4, patch_dim=2)), 40, 48),
]


@pytest.mark.parametrize("setting, overrides, saved, now", MISMATCHES, ids=[m[0] for m in MISMATCHES])
def test_refuses_a_state_made_for_other_settings(setting, overrides, saved, now):
    state = saved_after(reader(), 5)
    check_refused(reader(**overrides).reset, state, "CanonicalShardReader", setting, saved, now)


def test_refuses_other_data_of_the_same_length():
    state = saved_after(reader(), 5)
    other = reader(SyntheticProcessedDataset(40, seed=4, text_tokens=4, patch_dim=2))
    with pytest.raises(StateMismatchError, match="dataset fingerprint rows:"):
        other.reset(state)
    with pytest.raises(StateMismatchError, match="dataset fingerprint rows:.*this graph has mine"):
        reader(dataset_fingerprint="mine").reset(state)
    given = saved_after(reader(dataset_fingerprint="mine"), 2)
    reader(SyntheticProcessedDataset(40, seed=4), dataset_fingerprint="mine").reset(given)  # the user's word holds


def test_refuses_a_state_without_a_description():
    state = saved_after(reader(), 5)
    del state["valid_for"]
    with pytest.raises(StateMismatchError, match="does not say what it is valid for.*consumed micro-batch count"):
        reader().reset(state)


class CountingReads:
    def __init__(self, dataset):
        self.dataset, self.reads = dataset, 0

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        self.reads += 1
        return self.dataset[index]


def test_fingerprint_reads_a_few_of_the_rank_s_own_rows_or_none():
    counting = CountingReads(SyntheticProcessedDataset(1000))
    first = source_fingerprint(counting, range(10, 20))
    assert counting.reads == SAMPLED_ROWS and source_fingerprint(counting, range(10, 20)) == first
    assert source_fingerprint(SyntheticProcessedDataset(1000, seed=1), range(10, 20)) != first
    counting = CountingReads(DATASET)
    node = reader(counting)
    own = [s[SAMPLE_ID] for s in take(reader(), 4)]  # this rank's slots of step 0
    assert counting.reads == SAMPLED_ROWS and node.valid_for["dataset fingerprint"] == source_fingerprint(DATASET, own)
    table = datasets.Dataset.from_dict({"prompt": ["a", "b", "c"], "response": ["x", "y", "z"]})
    assert source_fingerprint(table, [0]) == f"datasets:{table._fingerprint}"
    assert source_fingerprint(table.select([0, 2, 1]), [0]) != source_fingerprint(table, [0])


class _CountedRows:
    """A map-style dataset of plain rows that counts its reads; ``batched`` gives it torch's ``__getitems__``,
    ``failing`` a row that cannot be read."""

    def __init__(self, size: int, *, batched: bool, failing: int | None = None) -> None:
        self.size, self.failing, self.single_reads, self.batched_reads = size, failing, 0, 0
        if batched:
            self.__getitems__ = self._getitems

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:
        self.single_reads += 1
        if index == self.failing:
            raise OSError(f"row {index} is unreadable")
        return {"value": index * 10}

    def _getitems(self, indices: list[int]) -> list[dict]:
        self.batched_reads += 1
        if self.failing in indices:
            raise OSError("a row of the batch is unreadable")
        return [{"value": i * 10} for i in indices]


def test_a_step_s_rows_are_read_together_where_the_dataset_reads_batches():
    # One __getitems__ call a step gives the stream a row at a time gives, restored at every position too.
    batched = _CountedRows(40, batched=True)
    ours = take(reader(batched, dataset_fingerprint="fixed"), 12)
    single = take(reader(_CountedRows(40, batched=False), dataset_fingerprint="fixed"), 12)
    assert [(s[SAMPLE_ID], s["value"]) for s in ours] == [(s[SAMPLE_ID], s["value"]) for s in single]
    assert (batched.batched_reads, batched.single_reads) == (3, 0)
    check_save_load_everywhere(lambda: reader(_CountedRows(40, batched=True), dataset_fingerprint="fixed"), 12)


def test_a_hugging_face_dataset_gives_the_same_rows_read_together():
    table = datasets.Dataset.from_dict({"text": [f"row {i}" for i in range(40)], "sizes": [[i, i + 1] for i in range(40)]})
    ours = take(reader(table), 16)
    assert [{k: v for k, v in s.items() if k in ("text", "sizes")} for s in ours] == [table[s[SAMPLE_ID]] for s in ours]


def test_a_row_that_fails_in_a_batch_fails_at_its_own_turn():
    # The batch fails; the step is read again a row at a time, so the rows before the bad one still come out.
    indices = global_microbatch_indices(0, 40, 8, 5, True).tolist()[4:8]  # rank 1 of 2: positions 4..7 of step 0
    dataset = _CountedRows(40, batched=True, failing=indices[2])
    node = reader(dataset, dataset_fingerprint="fixed")
    assert [next(node)[SAMPLE_ID] for _ in range(2)] == indices[:2]
    with pytest.raises(OSError, match=f"row {indices[2]} is unreadable"):
        next(node)
