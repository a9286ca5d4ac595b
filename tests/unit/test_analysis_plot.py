"""analyze's plots, as matplotlib builds them (structure, not pixels): one band per before/after whatever
the DP size, the critical path against its lower bound, a bar per what-if, whole ticks for counts, and the
unit each module's ranks were balanced on."""

from __future__ import annotations

import functools
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import LineCollection, PolyCollection

from mimo_pipes.analysis.analyze import analyze, module_plot, write_plots
from mimo_pipes.analysis.plot import DPI, FIGSIZE_INCHES, build_figure
from mimo_pipes.config import PipelineConfig, ReorderConfig
from mimo_pipes.time_model.model import TimeModel, save_time_model

MODEL = TimeModel(floor_ps=20_000_000_000, per_image_ps=1_000_000_000, per_patch_ps=5_500_000, per_patch_squared_ps=400)
STEPS = 16


def _analysis(dp: int, *, time_model: str | None = None, window: int = 4, across: bool = True, steps: int = STEPS):
    """analyze on made-up per-row counts: language dp ``dp`` + images dp ``dp``, 4 samples per rank. Made once
    for each set of arguments, however they are spelled (``_analysis(2)`` is ``_analysis(2, steps=16)``; the
    tests only read it): the plots', tables' and incomplete what-ifs' tests share it."""
    return _made_analysis(dp, time_model, window, across, steps)


@functools.cache
def _made_analysis(dp: int, time_model: str | None, window: int, across: bool, steps: int):
    reorder = ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_window_size=window,
                            reorder_across_microbatches=across, reorder_cost_model=time_model)
    config = PipelineConfig(components=(f"language=dp={dp}", f"images=dp={dp},rank_offset={dp}"), micro_batch_size=4 * dp,
                            reorder=reorder)
    topology = config.validate()
    rng = np.random.default_rng(dp)
    rows = 4 * dp * STEPS
    image_tokens = rng.integers(0, 2000, rows)
    real_tokens = image_tokens + rng.integers(20, 400, rows)
    encoder = np.array([MODEL.encoder_time_ns([t]) if t else 0 for t in image_tokens.tolist()], dtype=np.int64) if time_model else None
    return analyze(config, topology, image_tokens, real_tokens, start=0, stop=steps, encoder_costs=encoder), topology


@functools.cache
def _modelled_analysis(dp: int):
    """``_analysis(dp)`` balanced on MODEL, made once for the plot's and the tables' tests (a model file of a
    test's own folder made it anew in each); the file is needed only while analyze reads it. They use dp 2: what
    they check (the unit each figure is in, bounds below paths, exact integers) does not hang on the DP size, and
    dp 8 costs eight times the balancing."""
    with tempfile.TemporaryDirectory() as folder:
        return _analysis(dp, time_model=str(save_time_model(MODEL, Path(folder) / "model.json")))


def _figure(analysis, topology, module: str):
    return build_figure(module_plot(analysis, topology.module(module), "test"))


@functools.cache
def _images_figure(dp: int):
    """The images module's figure of ``_analysis(dp)``, built once: the band and the path tests only read it."""
    analysis, topology = _analysis(dp)
    return _figure(analysis, topology, "images")


def _is_whole(values) -> bool:
    return all(float(v).is_integer() for v in values)


# The DP sizes docs/analyze.md names (a dp 8 case in between checked the same structure again).
@pytest.mark.parametrize("dp", [2, 64])
def test_ranks_are_one_band_before_and_after_at_any_dp(dp):
    analysis, topology = _analysis(dp)
    figure = _images_figure(dp)
    loads, what_ifs, path, spreads = figure.axes
    assert len(figure.axes) == 4
    bands = [c for c in loads.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2  # before and after, not a line per rank
    assert len(loads.lines) == 2  # the mean rank before and after
    assert len(loads.get_legend().get_texts()) == 4
    after = module_plot(analysis, topology.module("images"), "test").after
    assert after.shape == (STEPS, dp)
    np.testing.assert_allclose(loads.lines[1].get_ydata(), after.mean(axis=1))
    # The band spans the lightest to the heaviest rank of each micro-batch.
    band = bands[1].get_paths()[0].vertices[:, 1]
    assert band.max() == pytest.approx(after.max()) and band.min() == pytest.approx(after.min())
    for axes in (loads, path):
        assert _is_whole(axes.get_xticks())
    assert _is_whole(spreads.get_yticks())  # counts of micro-batches
    assert _is_whole(loads.get_yticks()) and _is_whole(path.get_yticks()) and _is_whole(what_ifs.get_yticks())
    for axes in (loads, what_ifs, path, spreads):
        label = axes.get_ylabel() if axes is not spreads else axes.get_xlabel()
        assert "image tokens" in label


@pytest.mark.parametrize("dp", [2, 64])
def test_critical_path_is_drawn_against_its_lower_bound(dp):
    analysis, topology = _analysis(dp)
    figures = analysis.figures["images"]
    path = _images_figure(dp).axes[2]
    before, after, bound = path.lines
    assert before.get_ydata()[-1] == figures["critical_path_before"]
    assert after.get_ydata()[-1] == figures["critical_path_after"]
    assert bound.get_ydata()[-1] == figures["critical_path_lower_bound"]["across_window_4"]
    assert list(bound.get_xdata()) == [3, 7, 11, 15]  # one bound per window of 4, at its last step
    # Where the bound is known (window ends), it is below the path after.
    assert all(after.get_ydata()[step] >= value for step, value in zip(bound.get_xdata(), bound.get_ydata()))


def test_what_ifs_are_a_bar_each_with_the_given_setting_marked():
    analysis, topology = _analysis(2)
    what_ifs = _figure(analysis, topology, "language").axes[1]
    names = ["no_reorder", "per_microbatch", "across_window_2", "across_window_4", "across_window_8"]
    heights = [bar.get_height() for bar in what_ifs.patches]
    assert heights == [analysis.figures["language"]["what_if"][name]["critical_path"] for name in names]
    marked = [bar.get_facecolor() for bar in what_ifs.patches]
    assert [color == marked[3] for color in marked] == [False, False, False, True, False]  # window 4 across is the given one
    bounds = [c for c in what_ifs.collections if isinstance(c, LineCollection)][0]
    assert [segment[0][1] for segment in bounds.get_segments()] == [analysis.figures["language"]["critical_path_lower_bound"][n] for n in names[1:]]
    assert [t.get_text() for t in what_ifs.get_xticklabels()] == ["no\nreorder", "per\nmicro-batch", "across\n2", "across\n4", "across\n8"]


def test_a_window_outside_the_compared_ones_gets_its_own_bar():
    analysis, topology = _analysis(2, window=3, steps=5)  # the label test's analysis, made once
    what_ifs = _figure(analysis, topology, "images").axes[1]
    assert len(what_ifs.patches) == 6  # the five compared settings, then the given one
    assert what_ifs.patches[-1].get_height() == analysis.figures["images"]["critical_path_after"]
    assert what_ifs.get_xticklabels()[-1].get_text() == "given\n(window 3)\n(incomplete)"  # 5 steps cut a window of 3


def test_a_cut_window_has_no_bound_line():
    analysis, topology = _analysis(2, steps=6)  # --steps inside the second window of 4 (an analysis made once for others)
    path = _figure(analysis, topology, "images").axes[2]
    bound = path.lines[2]
    assert len(bound.get_xdata()) == 0 and "cut" in bound.get_label()


def test_with_a_time_model_the_encoder_plots_modelled_ms():
    analysis, topology = _modelled_analysis(2)
    modelled = analysis.figures["images"]["modelled_encoder_time"]
    images = _figure(analysis, topology, "images")
    loads, what_ifs, path, spreads = images.axes
    assert "modelled ms" in loads.get_ylabel() and "modelled ms" in what_ifs.get_ylabel() and "modelled ms" in spreads.get_xlabel()
    assert path.lines[1].get_ydata()[-1] == pytest.approx(modelled["critical_path_after"] / 1e6)
    assert path.lines[2].get_ydata()[-1] == pytest.approx(modelled["critical_path_lower_bound"]["across_window_4"] / 1e6)
    # Every rank's forward costs at least the model's floor.
    assert loads.lines[0].get_ydata().min() >= MODEL.floor_ns / 1e6
    assert _is_whole(spreads.get_yticks())
    language = _figure(analysis, topology, "language").axes[0]  # the language ranks run no encoder
    assert "image tokens" in language.get_ylabel()


def test_write_plots_writes_one_png_per_module_of_the_documented_size(tmp_path):
    analysis, topology = _analysis(2)
    paths = write_plots(tmp_path, analysis, topology, "test")
    assert [path.name for path in paths] == ["language.png", "images.png"]
    for path in paths:
        header = path.read_bytes()[:24]
        assert header[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", header[16:24]) == (int(FIGSIZE_INCHES[0] * DPI), int(FIGSIZE_INCHES[1] * DPI))


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    from matplotlib import pyplot as plt

    plt.close("all")
