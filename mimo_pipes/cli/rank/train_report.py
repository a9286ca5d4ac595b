"""Per-iteration summary of a training run from every rank's step results: pure arithmetic."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any


def training_rows(results: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per iteration: the loss (language ranks agree on it), the slowest rank's step time, and per
    encoder module the slowest and mean rank's forward+backward time (the straggler reordering removes)."""
    by_iteration: dict[int, list[Any]] = defaultdict(list)
    for result in results:
        by_iteration[result.iteration].append(result)
    rows = []
    for iteration in sorted(by_iteration):
        group = by_iteration[iteration]
        losses = [r.loss for r in group if r.loss is not None]
        encoder = [r.compute_seconds for r in group if r.loss is None]
        rows.append({
            "iteration": iteration,
            "loss": losses[0] if losses else None,
            "step_s": max(r.seconds for r in group),
            "vision_slowest_s": max(encoder, default=0.0),
            "vision_mean_s": sum(encoder) / len(encoder) if encoder else 0.0,
        })
    return rows


def format_training(results: Sequence[Any]) -> str:
    header = f"{'iteration':>9} {'loss':>12} {'step s':>8} {'vision fwd+bwd s, slowest':>26} {'mean':>7}"
    lines = [header, "-" * len(header)]
    for row in training_rows(results):
        loss = f"{row['loss']:.6f}" if row["loss"] is not None else "-"
        lines.append(
            f"{row['iteration']:>9} {loss:>12} {row['step_s']:>8.2f} {row['vision_slowest_s']:>26.2f} {row['vision_mean_s']:>7.2f}"
        )
    lines.append("loss: sum of per-token losses over the global batch / its loss tokens; step s: slowest rank")
    return "\n".join(lines)
