"""What a rank hands rank 0 at the end of ``run`` and ``train`` (its warnings, metrics line, place and what its
exchange moved), and the ``--summary-json`` document rank 0 writes from them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mimo_pipes.cli.job.output_paths import write_failed
from mimo_pipes.observe.metrics import MovedPerWindow
from mimo_pipes.observe.summary import ModuleSummary, summary_document
from mimo_pipes.observe.warning_tally import Snapshot


@dataclass(frozen=True)
class RankReport:
    """What a rank hands rank 0 at the end besides its records: its warnings tally (merged there into one
    line per kind), its module's last exchange metrics line (printed there once the bar is closed), where
    it sits, and the samples and bytes its exchange moved for the micro-batches consumed."""

    warnings: Snapshot
    metrics_line: str | None = None
    position: tuple[str, int, int, int] = ("", 0, 0, 0)  # module, dp rank, tp rank, pp rank
    moved: tuple[int, int] = (0, 0)

def moved_by_module(reports: Iterable[RankReport]) -> dict[str, tuple[int, int]]:
    """Each module's (samples, bytes) moved: module-wide figures, so its first rank's."""
    return {report.position[0]: report.moved for report in reports if report.position[1:] == (0, 0, 0)}

def watch_moves(loader: Any) -> MovedPerWindow:
    """What the loader's exchange moves, window by window (nothing without an exchange)."""
    moved = MovedPerWindow()
    exchange = loader.exchange_node() if hasattr(loader, "exchange_node") else None
    if exchange is not None:
        exchange.add_observer(moved)
    return moved

def write_summary_json(path: str, summaries: list[ModuleSummary], moved: dict[str, tuple[int, int]]) -> None:
    """``--summary-json``: the document of :func:`~mimo_pipes.observe.summary.summary_document` (rank 0)."""
    import json

    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(summary_document(summaries, moved), indent=1) + "\n")
    except OSError as error:
        raise write_failed("--summary-json", target, error) from None
