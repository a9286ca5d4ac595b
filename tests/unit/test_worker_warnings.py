"""Warnings raised where the recipe's work runs on worker processes reach the rank's tally (what its run summary
prints): the same counts as on threads, for both payloads (rows: counted on processes before the exchange;
samples: processed on them), and nothing logged per sample by the workers."""

from __future__ import annotations

import pytest

from mimo_pipes.config import PipelineConfig
from mimo_pipes.data.embedded.builtin_dataset import default_dataset_path
from mimo_pipes.data.embedded.builtin_processor import default_processor_path
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.data.sources.saved_folder import open_dataset
from mimo_pipes.exchange import RankLayout
from mimo_pipes.observe import warning_tally
from mimo_pipes_recipes import vlm_sft

SAMPLES, SEQ = 32, 1300


def truncated_rows() -> list[int]:
    dataset, processor = open_dataset(default_dataset_path(SAMPLES, seed=0)), load_processor(default_processor_path(), 4096)
    return [i for i in range(len(dataset)) if len(processor({**dataset[i], "sample_id": i})["input_ids"]) > SEQ]


def tally(payload: str, processing: str) -> list[warning_tally.WarningCount]:
    config = PipelineConfig(components=("language=dp=1",), micro_batch_size=4, seq_length=SEQ, embedded_samples=SAMPLES,
                            num_workers=2, processing=processing, exchange_payload=payload, dataloader_type="single")
    with warning_tally.collected():
        loader = vlm_sft.build(config, RankLayout(0, 1, 1))
        try:
            assert sum(1 for _ in loader) == SAMPLES // 4
        finally:
            loader.close()
        return warning_tally.counts()


@pytest.mark.parametrize("payload", ["rows", "samples"])
def test_warnings_on_worker_processes_are_counted_on_the_rank(payload, capfd):
    truncated = truncated_rows()
    assert len(truncated) > 2
    on_processes = tally(payload, "process")
    assert [(count.count, count.first) for count in on_processes] == [(len(truncated), truncated[0])]
    assert on_processes == tally(payload, "thread")
    assert "truncated" not in capfd.readouterr().err  # counted, not logged per sample, on the rank or its workers


def test_recorded_warnings_are_counted_once_replayed():
    kind = warning_tally.WarningKind("things tried")
    recorder = warning_tally.WarningsRecorded(lambda item: warning_tally.warn(kind, item, f"tried {item}") or item * 2)
    with warning_tally.collected():
        result, seen = recorder(3)
        assert result == 6 and seen == [(kind, 3, "tried 3")]
        assert warning_tally.counts() == []  # recorded, not counted where it ran
        assert warning_tally.replayed(recorder(4)) == 8
        assert [(count.count, count.first) for count in warning_tally.counts()] == [(1, 4)]
