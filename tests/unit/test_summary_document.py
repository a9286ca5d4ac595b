"""`run --summary-json`'s document (pure): the printed figures under the contract's names, and what the
exchange moved for the consumed micro-batches' windows."""

from __future__ import annotations

import json

from mimo_pipes.observe.metrics import MovedPerWindow
from mimo_pipes.observe.observer import ExchangeRecord
from mimo_pipes.observe.summary import ModuleSummary, summary_document

KEYS = {"dp_size", "steps", "samples", "image_tokens", "spread_before", "spread_after", "critical_path_before",
        "critical_path_after", "moved_samples", "moved_bytes"}


def test_every_module_has_the_contracts_figures():
    summaries = [ModuleSummary("language", 2, 32, 256, 149123, 1254.9, 138.0, 94640, 76769),
                 ModuleSummary("images", 2, 32, 256, 149123, 1254.9, 138.0, 94640, 76769)]
    document = json.loads(json.dumps(summary_document(summaries, {"language": (113, 9000), "images": (113, 5_000_000)})))
    assert set(document) == {"modules"} and set(document["modules"]) == {"language", "images"}
    language = document["modules"]["language"]
    assert set(language) == KEYS
    assert (language["dp_size"], language["steps"], language["samples"], language["image_tokens"]) == (2, 32, 256, 149123)
    assert (language["spread_before"], language["spread_after"]) == (1254.9, 138.0)
    assert (language["critical_path_before"], language["critical_path_after"]) == (94640, 76769)
    assert (language["moved_samples"], language["moved_bytes"]) == (113, 9000)
    assert document["modules"]["images"]["moved_bytes"] == 5_000_000


def test_a_module_without_an_exchange_moved_nothing():
    document = summary_document([ModuleSummary("language", 1, 4, 16, 10, 0.0, 0.0, 10, 10)], {})
    assert (document["modules"]["language"]["moved_samples"], document["modules"]["language"]["moved_bytes"]) == (0, 0)


def window(first_step: int, assignment: list[list[list[int]]], packed: list[list[int]]) -> ExchangeRecord:
    """A window of DP 2, grid 2, micro-batch 4 (positions 0, 1 read by rank 0; 2, 3 by rank 1)."""
    record = ExchangeRecord(sequence=first_step, first_step=first_step, dp_rank=0, dp_size=2, grid_size=2, across_microbatches=False)
    record.costs = [[1, 1, 1, 1] for _ in assignment]
    record.packed_bytes = packed
    record.assignment = assignment
    return record


def test_moves_count_the_windows_of_the_consumed_micro_batches():
    moved = MovedPerWindow()
    moved(window(0, [[[0, 1], [2, 3]]], [[10, 20, 30, 40]]))  # nothing changes rank
    moved(window(1, [[[0, 2], [1, 3]]], [[10, 20, 30, 40]]))  # positions 1 and 2 swap ranks: 20 + 30 bytes
    moved(window(2, [[[3, 1], [2, 0]]], [[1, 2, 3, 4]]))  # 0 and 3 swap: 1 + 4 bytes
    assert moved.totals(end=2) == (2, 50)  # the third window was exchanged ahead of the consumer
    assert moved.totals(end=3) == (4, 55)
    assert moved.totals(end=0) == (0, 0)
