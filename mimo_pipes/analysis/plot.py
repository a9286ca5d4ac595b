"""PNG of one module for a person to read: the ranks' load over steps as a band (readable at any DP size),
the critical path against its lower bound, the critical path of every what-if, and the spread per
micro-batch; all in the unit the module's ranks were balanced on."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FIGSIZE_INCHES = (12.0, 8.0)
DPI = 100  # so the PNG is 1200 x 800 pixels
BEFORE_COLOR = "0.55"
AFTER_COLOR = "tab:blue"
BOUND_COLOR = "black"


@dataclass(frozen=True)
class WhatIf:
    """One bar of the what-if chart: a setting's critical path, its lower bound (None: none known), whether
    it is the setting given, and whether the run leaves one of its windows unfilled (``incomplete``: drawn
    hatched, labelled so and left out of the comparison with the others)."""

    label: str
    critical_path: float
    bound: float | None = None
    given: bool = False
    incomplete: bool = False


@dataclass(frozen=True)
class ModulePlot:
    """What one module's PNG shows, already in the unit shown (``integer``: a count, so ticks are whole).

    ``before`` / ``after``: (steps, dp size) rank loads with reordering off and as given; ``bound_steps`` /
    ``bound_path``: the lower bound on the critical path so far, at the last step each bound covers (None
    when a window is cut)."""

    title: str
    unit: str
    integer: bool
    steps: np.ndarray
    before: np.ndarray
    after: np.ndarray
    bound_steps: np.ndarray | None = None
    bound_path: np.ndarray | None = None
    bound_label: str = "lower bound"
    what_ifs: list[WhatIf] = field(default_factory=list)


def plot_module(path: Path, plot: ModulePlot) -> Path:
    """Writes ``path`` (FIGSIZE_INCHES at DPI) and returns it."""
    from matplotlib import pyplot as plt

    figure = build_figure(plot)
    figure.savefig(path, dpi=DPI)
    plt.close(figure)
    return path


def build_figure(plot: ModulePlot) -> Any:
    """The matplotlib Figure of :func:`plot_module` (four axes: loads, what-ifs, critical path, spreads)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=FIGSIZE_INCHES, dpi=DPI, gridspec_kw={"width_ratios": [3, 2]})
    (loads, what_ifs), (path, spreads) = axes
    _loads(loads, plot)
    _what_ifs(what_ifs, plot)
    _critical_path(path, plot)
    _spreads(spreads, plot)
    figure.suptitle(plot.title, fontsize=10)
    # Laid out when drawn (savefig, canvas.draw), as tight_layout() would lay it out now: a caller that only
    # reads the figure's structure does not pay for measuring every label's text.
    figure.set_layout_engine("tight")
    return figure


def _loads(axes: Any, plot: ModulePlot) -> None:
    dp_size = plot.before.shape[1]
    for name, loads, color, alpha in (("before", plot.before, BEFORE_COLOR, 0.3), ("after", plot.after, AFTER_COLOR, 0.35)):
        if len(plot.steps):
            axes.fill_between(plot.steps, loads.min(axis=1), loads.max(axis=1), step="mid", color=color, alpha=alpha, linewidth=0,
                              label=f"{name}: lightest to heaviest of {dp_size} ranks")
            axes.plot(plot.steps, loads.mean(axis=1), drawstyle="steps-mid", color=color, linewidth=1.2,
                      linestyle="--" if name == "before" else "-", label=f"{name}: mean rank")
    axes.set_title(f"load per rank, {plot.unit}: before (reorder off) and after")
    axes.set_xlabel("global micro-batch")
    axes.set_ylabel(f"{plot.unit} per rank")
    top = max(float(plot.before.max(initial=0)), float(plot.after.max(initial=0)))
    axes.set_ylim(0, top * 1.3 or 1)  # room for the legend above the bands
    axes.legend(fontsize=8, loc="upper center", ncol=2)
    _whole_steps(axes)
    _value_axis(axes.yaxis, plot.integer)


def _what_ifs(axes: Any, plot: ModulePlot) -> None:
    labels = [w.label.replace(" ", "\n", 1) + ("\n(incomplete)" if w.incomplete else "") for w in plot.what_ifs]
    paths = [w.critical_path for w in plot.what_ifs]
    x = np.arange(len(plot.what_ifs))
    colors = [AFTER_COLOR if w.given else BEFORE_COLOR for w in plot.what_ifs]
    bars = axes.bar(x, paths, color=colors, width=0.7)
    baseline = paths[0] if paths and paths[0] else None
    for bar, what_if in zip(bars, plot.what_ifs):
        text = _number(what_if.critical_path, plot.integer)
        if what_if.incomplete:  # a window cut by the steps: part of its windows, not comparable with the others
            bar.set_hatch("//")
            bar.set_alpha(0.45)
            text += "\nincomplete"
        elif baseline is not None and what_if is not plot.what_ifs[0]:
            text += f"\n{what_if.critical_path / baseline - 1:+.1%}"
        axes.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=7,
                      xytext=(0, 2), textcoords="offset points")
    bounded = [(i, w.bound) for i, w in enumerate(plot.what_ifs) if w.bound is not None]
    if bounded:
        axes.hlines([b for _, b in bounded], [i - 0.35 for i, _ in bounded], [i + 0.35 for i, _ in bounded], color=BOUND_COLOR,
                    linewidth=1.5, label="lower bound")
        axes.legend(fontsize=8, loc="lower right")
    # This panel is narrow: with six bars, or an '(incomplete)' label, smaller labels, so that none runs into its neighbour.
    crowded = len(plot.what_ifs) > 5 or any(w.incomplete for w in plot.what_ifs)
    axes.set_xticks(x, labels, fontsize=6.5 if crowded else 8)
    axes.set_ylim(0, max(paths, default=1) * 1.22 or 1)
    axes.set_title("critical path per setting (given: blue)")
    axes.set_ylabel(f"critical path, {plot.unit}")
    _value_axis(axes.yaxis, plot.integer)


def _critical_path(axes: Any, plot: ModulePlot) -> None:
    for name, loads, color, style in (("before (reorder off)", plot.before, BEFORE_COLOR, "--"), ("after", plot.after, AFTER_COLOR, "-")):
        path = np.cumsum(loads.max(axis=1)) if len(plot.steps) else np.zeros(0)
        axes.plot(plot.steps, path, color=color, linestyle=style, label=f"{name}: {_number(float(path[-1]) if len(path) else 0, plot.integer)}")
    if plot.bound_steps is not None and plot.bound_path is not None:
        final = _number(float(plot.bound_path[-1]) if len(plot.bound_path) else 0, plot.integer)
        # Each bound holds from the last step it covers on: drawn as steps, never above the path mid-window.
        axes.plot(plot.bound_steps, plot.bound_path, color=BOUND_COLOR, linestyle=":", drawstyle="steps-post",
                  marker="." if len(plot.bound_steps) < 40 else None, label=f"{plot.bound_label}: {final}")
    else:
        axes.plot([], [], color=BOUND_COLOR, linestyle=":", label=plot.bound_label)
    axes.set_title("critical path so far: heaviest rank summed over micro-batches")
    axes.set_xlabel("global micro-batch")
    axes.set_ylabel(f"{plot.unit}")
    axes.legend(fontsize=8, loc="upper left")
    _whole_steps(axes)
    _value_axis(axes.yaxis, plot.integer)


def _spreads(axes: Any, plot: ModulePlot) -> None:
    before = plot.before.max(axis=1) - plot.before.min(axis=1) if len(plot.steps) else np.zeros(0)
    after = plot.after.max(axis=1) - plot.after.min(axis=1) if len(plot.steps) else np.zeros(0)
    top = max(float(before.max(initial=0)), float(after.max(initial=0))) or 1.0
    bins = np.unique(np.linspace(0, np.ceil(top), 31).round()) if plot.integer and top >= 30 else np.linspace(0, top, 31)
    for name, spread, color, alpha in (("before", before, BEFORE_COLOR, 0.6), ("after", after, AFTER_COLOR, 0.6)):
        mean = _number(float(spread.mean()) if len(spread) else 0.0, plot.integer, decimals=1)
        axes.hist(spread, bins=bins, color=color, alpha=alpha, label=f"{name} (mean {mean})")
    axes.set_title("spread per micro-batch")
    axes.set_xlabel(f"heaviest - lightest rank, {plot.unit}")
    axes.set_ylabel("micro-batches")
    axes.legend(fontsize=8)
    from matplotlib.ticker import MaxNLocator

    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    _value_axis(axes.xaxis, plot.integer, bins=5)


def _whole_steps(axes: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    axes.xaxis.set_major_locator(MaxNLocator(integer=True))


def _value_axis(axis: Any, integer: bool, bins: int | str = "auto") -> None:
    """Whole ticks for counts; readable numbers either way (thousands separated, no offset or exponent)."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    axis.set_major_locator(MaxNLocator(nbins=bins, integer=integer))
    axis.set_major_formatter(FuncFormatter(lambda value, _position: _number(value, integer or float(value).is_integer())))


def _number(value: float, integer: bool, decimals: int = 0) -> str:
    """``12,345`` for counts (``decimals`` for a mean of them), ``1,234.5`` for times."""
    return f"{value:,.{decimals}f}" if integer else f"{value:,.1f}"
