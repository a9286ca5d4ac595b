"""PNG of one module's vision load: per-rank image tokens over steps, and the spread before and after."""

from __future__ import annotations

from pathlib import Path

import numpy as np

FIGSIZE_INCHES = (12.0, 4.5)
DPI = 100  # so the PNG is 1200 x 450 pixels


def plot_module(path: Path, module: str, steps: np.ndarray, before: np.ndarray, after: np.ndarray, title: str) -> Path:
    """``before`` / ``after``: (steps, dp_size) per-rank image tokens. Writes ``path`` and returns it."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, (over_steps, spreads) = plt.subplots(1, 2, figsize=FIGSIZE_INCHES, dpi=DPI, gridspec_kw={"width_ratios": [2, 1]})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for rank in range(before.shape[1]):
        color = colors[rank % len(colors)]
        over_steps.plot(steps, before[:, rank], color=color, alpha=0.35, linewidth=0.8, label=f"rank {rank} before")
        over_steps.plot(steps, after[:, rank], color=color, linewidth=1.4, label=f"rank {rank} after")
    over_steps.set_xlabel("global micro-batch")
    over_steps.set_ylabel("image tokens per rank")
    over_steps.set_title(f"{module}: per-rank vision load")
    if before.shape[1] <= 8:
        over_steps.legend(fontsize=7, ncol=2)
    spread_before = before.max(axis=1) - before.min(axis=1)
    spread_after = after.max(axis=1) - after.min(axis=1)
    top = max(int(spread_before.max(initial=0)), int(spread_after.max(initial=0)), 1)
    bins = np.linspace(0, top, 31)
    spreads.hist(spread_before, bins=bins, alpha=0.5, label=f"before (mean {spread_before.mean() if len(steps) else 0:.0f})")
    spreads.hist(spread_after, bins=bins, alpha=0.7, label=f"after (mean {spread_after.mean() if len(steps) else 0:.0f})")
    spreads.set_xlabel("heaviest - lightest rank, image tokens")
    spreads.set_ylabel("micro-batches")
    spreads.set_title("spread per micro-batch")
    spreads.legend(fontsize=8)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    plt.close(figure)
    return path
