"""analyze's terminal output: the run's figures and the what-ifs, one row per module, in the unit each
module's ranks were balanced on (modelled ms, image tokens or real tokens). analysis.json keeps the exact
integers; this is for reading."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mimo_pipes.analysis.analyze import Analysis, Quantity, what_if_label


def _number(value: float | int | None, quantity: Quantity, decimals: int = 0) -> str:
    """A figure as shown: raw / scale, thousands separated; counts whole (``decimals`` for their means)."""
    if value is None:
        return "-"
    shown = value / quantity.scale
    return f"{shown:,.{decimals if quantity.integer else 1}f}"


def _block(figures: dict[str, Any], quantity: Quantity) -> dict[str, Any]:
    return figures if quantity.block is None else figures[quantity.block]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: Sequence[int]) -> list[str]:
    """Columns as wide as their widest cell; the columns ``left`` left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.ljust(width) if i in left else cell.rjust(width) for i, (cell, width) in enumerate(zip(cells, widths))).rstrip()

    head = line(header)
    return [head, "-" * len(head), *(line(row) for row in rows)]


def format_analysis(analysis: Analysis) -> str:
    """Two tables, one row per module each: what the run with these flags would measure, and the critical
    path of every what-if with its lower bound."""
    run_rows, what_if_rows = [], []
    given = analysis.given_what_if()
    names = list(next(iter(analysis.figures.values()))["what_if"]) if analysis.figures else []
    for module, figures in analysis.figures.items():
        quantity = analysis.balanced[module]
        block = _block(figures, quantity)
        before, after = block["critical_path_before"], block["critical_path_after"]
        saved = f"{1 - after / before:.1%}" if before else "-"
        run_rows.append([
            module, str(figures["dp_size"]), quantity.unit, f"{figures['steps']:,}", f"{figures['samples']:,}",
            _number(block["spread_before"], quantity, 1), _number(block["spread_after"], quantity, 1),
            _number(before, quantity), _number(after, quantity), saved,
        ])
        bounds = block["critical_path_lower_bound"]
        what_if_rows.append([
            module, quantity.unit,
            *(_number(block["what_if"][name]["critical_path"], quantity) + (f" [{_number(bounds[name], quantity)}]" if name in bounds else "")
              for name in names),
        ])
    run = _table(["module", "dp", "unit", "steps", "samples", "spread before", "after", "crit. path before", "after", "saved"], run_rows, (0, 2))
    labels = [what_if_label(name) + ("*" if name == given else "") + (" (incomplete)" if name in analysis.incomplete else "")
              for name in names]
    what_ifs = _table(["module", "unit", *labels], what_if_rows, (0, 1))
    notes = [
        "spread: mean over micro-batches of heaviest minus lightest rank; crit. path: sum over micro-batches of the heaviest rank",
        "(what gates each step); before: the readers' shards (reordering off); saved: crit. path after vs before",
        "",
        "critical path per setting [lower bound: no balancing with that setting does better]"
        + ("; * the settings given" if given is not None else ""),
        *what_ifs,
        "across W: windows of W micro-batches whose samples may move between micro-batches",
        *(["(incomplete): the micro-batches consumed cut a window of that setting, whose consumed part was balanced with samples of "
           "micro-batches never consumed; its figure covers part of its windows and compares with no other (the plot leaves it "
           "out of its comparison)"] if analysis.incomplete else []),
    ]
    return "\n".join([*run, *notes])
