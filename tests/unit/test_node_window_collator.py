"""WindowCollator: the windows of its source collated on the thread that asks, restore at every position and
mid-window under the assembler, a failure that names the sample, the exchange's record reported when a window is
handed to the consumer (also through the loader's read-ahead thread), and states saved before the node existed."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
from node_checks import assert_same, check_save_load_everywhere, saved_after, take, tiny_samples

from mimo_pipes.errors import SampleError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.nodes import BalanceExchange, MicroBatchAssembler, WindowCollator, Windower
from mimo_pipes.samples.collate import Collator
from mimo_pipes.samples.sample import SAMPLE_ID, Window
from mimo_pipes.testing import tail_settings

PADDED = Collator(1600, {"labels": -100, "input_ids": 7})
SAVED_STATES = pathlib.Path(__file__).parent.parent / "helpers" / "saved_states"


def settings_for(per_microbatch=3, window_size=2, collator=PADDED):
    return tail_settings(samples_per_rank=per_microbatch, window_size=window_size, collator=collator, reorder=True)


def windower(per_microbatch=3, window_size=2, steps=7) -> Windower:
    return Windower(tiny_samples(per_microbatch, steps), settings=settings_for(per_microbatch, window_size))


def collator_node(per_microbatch=3, window_size=2, steps=7, collator=PADDED) -> WindowCollator:
    settings = settings_for(per_microbatch, window_size, collator)
    return WindowCollator(windower(per_microbatch, window_size, steps), settings=settings)


def expected(per_microbatch=3, window_size=2, steps=7, collator=PADDED) -> list[Window]:
    return [collator.window(window) for window in take(windower(per_microbatch, window_size, steps), None)]


def test_windows_are_their_source_collated():
    node = collator_node()
    got = take(node, None)
    node.shutdown()
    assert_same(got, expected())
    assert all(window.collated for window in got) and [window.first_step for window in got] == [0, 2, 4, 6]


def test_restores_at_every_position():
    check_save_load_everywhere(collator_node)


@pytest.mark.parametrize("window_size", [1, 3])
def test_restores_inside_a_window_under_the_assembler(window_size):
    settings = settings_for(2, window_size)

    def graph() -> MicroBatchAssembler:
        return MicroBatchAssembler(WindowCollator(windower(2, window_size, 7), settings=settings), settings=settings)

    batches = check_save_load_everywhere(graph)
    assert [batch["step"] for batch in batches] == list(range(7))


def test_it_reads_no_window_ahead_of_the_one_asked_for():
    node = collator_node(steps=9)
    take(node, 1)
    reader = node.source.source
    assert reader.state_dict()[reader.NEXT_STEP_KEY] == 2


def test_a_window_that_cannot_be_collated_names_the_sample_and_a_restore_starts_over():
    lengths = {w.first_step: max(s["input_ids"].shape[-1] for mb in w.microbatches for s in mb) for w in take(windower(), None)}
    pad = min(lengths.values())  # the windows longer than it cannot be collated
    assert pad < max(lengths.values())
    first_bad = min(step for step, length in lengths.items() if length > pad)
    node = collator_node(collator=Collator(pad, PADDED.pad_values))
    state = saved_after(node, 0)
    got = []
    with pytest.raises(SampleError, match=rf"^sample \d+, field 'input_ids': has \d+ tokens, more than the pad length {pad}$"):
        while True:
            got.append(next(node))
    assert [window.first_step for window in got] == [step for step in sorted(lengths) if step < first_bad]
    restored = collator_node()
    restored.reset(state)
    assert_same(take(restored, None), expected())
    restored.shutdown()


@pytest.mark.parametrize("read_ahead", [0, 2])
def test_the_exchange_record_is_reported_when_the_window_is_handed_to_the_consumer_with_its_collation_time(read_ahead):
    from test_node_balance_exchange import windows  # costed windows of 3 micro-batches of 4, 7 in all

    from mimo_pipes.graph.loader import GraphLoader

    settings = tail_settings(samples_per_rank=4, window_size=3, reorder=True, collator=PADDED)
    exchange = BalanceExchange(windows(), settings=settings, layout=RankLayout(0, 1, 2), report_on_delivery=False)
    loader = GraphLoader(MicroBatchAssembler(WindowCollator(exchange, settings=settings, report=exchange.report), settings=settings),
                         read_ahead=read_ahead)
    records = []
    exchange.add_observer(records.append)
    for handed_out in range(7):
        batch = next(loader)
        window = handed_out // 3
        assert [record.first_step for record in records] == [0, 3, 6][:window + 1]  # not the windows read ahead
        assert records[-1].first_step == batch["step"] - handed_out % 3 and records[-1].seconds["collate"] > 0
        assert exchange.metrics() is records[-1].metrics
    loader.close()


def _before_the_collator(state: dict) -> dict:
    """A graph loader's state as the graph saved it before WindowCollator was part of it: the assembler's source
    state is the collator's source's."""
    older = json.loads(json.dumps(state))
    assembler = older["root"]
    assert "valid_for" not in assembler["source"]  # the collator's own level carries no description
    assembler["source"] = assembler["source"]["source"]
    return older


@pytest.mark.parametrize("count", [4, 5, 7])
def test_a_state_saved_before_the_collator_resumes_the_same_stream(count):
    from test_elastic_loader import GRID_1, GRID_2, graph, ids

    loader = graph(GRID_1)
    take(loader, count)
    state = loader.state_dict()
    rest = ids(take(loader, 12 - count))
    loader.close()
    for target in (GRID_1, GRID_2):
        resumed = graph(target)
        resumed.load_state_dict(_before_the_collator(state))
        got = ids(take(resumed, 12 - count))
        resumed.close()
        window_end = -(-count // 4) * 4
        assert got[: window_end - count] == rest[: window_end - count]
        assert sorted(sum(got, [])) == sorted(sum(rest, []))
        if target is GRID_1:
            assert got == rest


def test_a_state_the_graph_saved_before_the_collator_existed_resumes_the_same_stream():
    # Saved by the graph of test_elastic_loader.graph(GRID_1) after 5 micro-batches, inside its second window of 4,
    # before collation had a node of its own (the assembler's source state was the exchange's).
    from test_elastic_loader import GRID_1, graph, ids

    state = json.loads((SAVED_STATES / "graph_before_window_collator.json").read_text())
    assert "valid_for" in state["root"]["source"] and state["consumed_microbatches"] == 5  # the exchange's state
    uninterrupted = graph(GRID_1)
    reference = ids(take(uninterrupted, 12))
    uninterrupted.close()
    resumed = graph(GRID_1)
    resumed.load_state_dict(state)
    assert ids(take(resumed, 7)) == reference[5:]
    assert resumed.consumed_microbatches == 12 and "valid_for" not in resumed.state_dict()["root"]["source"]  # the collator's
    resumed.close()


def test_it_collates_the_rows_a_row_processor_hands_on():
    from mimo_pipes.nodes import RowProcessor

    settings = tail_settings(samples_per_rank=3, window_size=2, collator=PADDED, payload="rows", workers=2)

    def process(row: dict) -> dict:
        return {**row, "processed": torch.tensor([row[SAMPLE_ID]])}

    node = WindowCollator(RowProcessor(windower(), settings=settings, process=process), settings=settings)
    got = take(node, None)
    node.shutdown()
    node.source.shutdown()
    want = [PADDED.window(Window(w.first_step, [[process(row) for row in mb] for mb in w.microbatches])) for w in take(windower(), None)]
    assert_same(got, want)
