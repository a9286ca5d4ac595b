"""A what-if whose windows the consumed micro-batches cut (--steps, --stop-after or --resume inside a window
whose samples may move) is marked incomplete in analysis.json, the table and the plot, and the plot leaves it
out of its comparison: its consumed micro-batches were balanced with samples of micro-batches never consumed."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_analysis_plot import _analysis, _figure

from mimo_pipes.analysis.analyze import analyze, cut_window
from mimo_pipes.analysis.replay import Schedule
from mimo_pipes.analysis.table import format_analysis
from mimo_pipes.config import PipelineConfig, ReorderConfig

NAMES = ["no_reorder", "per_microbatch", "across_window_2", "across_window_4", "across_window_8"]


def _expected_incomplete(start: int, stop: int) -> set[str]:
    return {f"across_window_{w}" for w in (2, 4, 8) if start % w or stop % w}


# Each case cuts a different set of windows: 4 and 8; 8 only; none; all three. Which windows a range cuts does
# not hang on the DP size, so all are at dp 2 (the analysis of 12 steps is the tables' test's own, made once).
@pytest.mark.parametrize(("dp", "steps"), [(2, 6), (2, 12), (2, 16), (2, 3)])
def test_cut_what_ifs_are_marked_in_the_json_the_table_and_the_plot(dp, steps):
    analysis, topology = _analysis(dp, steps=steps)
    incomplete = _expected_incomplete(0, steps)
    assert analysis.incomplete == incomplete
    for module in ("language", "images"):
        what_if = analysis.figures[module]["what_if"]
        assert {name for name in NAMES if what_if[name].get("incomplete")} == incomplete
        assert all(what_if[name].get("incomplete", True) is True for name in NAMES)  # absent, or true
        bounds = analysis.figures[module]["critical_path_lower_bound"]
        assert {name for name in NAMES[1:] if bounds[name] is None} == incomplete  # the same windows have no bound
        axes = _figure(analysis, topology, module).axes[1]
        labels = [label.get_text() for label in axes.get_xticklabels()]
        texts = [text.get_text() for text in axes.texts]
        for name, bar, label, text in zip(NAMES, axes.patches, labels, texts):
            if name in incomplete:
                assert label.endswith("(incomplete)") and text.endswith("incomplete") and "%" not in text and bar.get_hatch() == "//"
            else:
                assert "incomplete" not in label and not bar.get_hatch()
                assert name == "no_reorder" or "%" in text  # the complete ones are compared with no reorder
    table = format_analysis(analysis)
    header = next(line for line in table.splitlines() if line.startswith("module    unit"))
    for label in ("across 2", "across 4", "across 8"):
        name = "across_window_" + label.split()[1]
        assert (re.search(rf"{label}\*? \(incomplete\)", header) is not None) == (name in incomplete)
    assert ("(incomplete): the micro-batches consumed cut a window" in table) == bool(incomplete)


def test_a_window_cut_at_the_start_by_a_resume_is_incomplete():
    rows = np.random.default_rng(3).integers(0, 2000, 4 * 2 * 16)
    config = PipelineConfig(components=("language=dp=2", "images=dp=2,rank_offset=2"), micro_batch_size=8,
                            reorder=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_window_size=2,
                                                  reorder_across_microbatches=True))
    analysis = analyze(config, config.validate(), rows, rows + 50, start=2, stop=10)
    assert analysis.incomplete == {"across_window_4", "across_window_8"}  # 2..9: windows of 4 and 8 are cut at 2 or 10
    assert analysis.given_what_if() == "across_window_2" and "incomplete" not in analysis.figures["images"]["what_if"]["across_window_2"]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40), st.integers(1, 40), st.sampled_from([1, 2, 3, 4, 8]), st.booleans(), st.booleans())
def test_cut_window_is_a_window_of_moving_samples_cut_by_the_range(start, length, window, across, cyclic):
    schedule = Schedule(dataset_size=8 * 30, micro_batch_size=8, grid_size=2, seed=1, cyclic=cyclic)
    stop = start + length
    end = schedule.end(stop)
    if end <= start:
        assert not cut_window(schedule, start, stop, window, across)
        return
    # a window is cut where the range does not start or end at a window edge; a single pass ends where the data ends
    edge_end = end % window == 0 or (not cyclic and end == schedule.per_epoch)
    assert cut_window(schedule, start, stop, window, across) == (across and window > 1 and (start % window != 0 or not edge_end))


# Label sets: six bars, all cut; five, 2 whole beside 4 and 8 cut; five, all cut (the given window only colours
# a bar, so window 4 at 9 steps draws the very labels of window 2 at 7 steps).
@pytest.mark.parametrize(("window", "steps"), [(3, 5), (4, 6), (2, 7)])
def test_every_what_if_label_is_readable_beside_the_others(window, steps):
    """The what-if labels (incomplete ones are four lines) never overlap one another, with the given window
    among the compared ones (5 bars) or not (a sixth bar): an overlapped '(incomplete)' reads as no mark."""
    analysis, topology = _analysis(2, window=window, steps=steps)
    figure = _figure(analysis, topology, "images")
    figure.draw_without_rendering()  # the layout a PNG gets (tight layout, label fonts), with no pixels drawn
    renderer = figure.canvas.get_renderer()
    labels = [label for label in figure.axes[1].get_xticklabels() if label.get_text()]
    assert len(labels) == 5 + (window not in (2, 4, 8))
    assert any("(incomplete)" in label.get_text() for label in labels)
    boxes = [label.get_window_extent(renderer) for label in labels]
    for left, right in zip(boxes, boxes[1:]):
        assert not left.overlaps(right), [label.get_text() for label in labels]
