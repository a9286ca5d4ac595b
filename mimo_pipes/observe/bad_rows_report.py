"""The bad-row lines of a job's summary (``--skip-bad-samples``): rows replaced before the exchange by the next
good row, and rows masked after it (``rows`` payload), from the records of the micro-batches every rank consumed.
Pure: the ``run`` and ``train`` commands and ``analyze`` print them alike."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mimo_pipes.samples.masking import MASKED

REPORTED_ROWS = 50  # bad rows listed one per line; the count covers them all


def replaced_in(batch: dict[str, Any]) -> list[tuple[int, str]]:
    """(row, reason) of every bad row a micro-batch's samples stand in for, in order."""
    rows, reasons = batch.get("replaced_rows") or [], batch.get("replaced_reasons") or []
    return [(row, why) for sample_rows, sample_reasons in zip(rows, reasons) for row, why in zip(sample_rows or [], sample_reasons or [])]


def masked_in(batch: dict[str, Any]) -> list[tuple[int, str]]:
    """(row, reason) of every sample a micro-batch holds masked (rows that failed after the exchange)."""
    return [(row, why) for row, why in zip(batch.get("sample_ids") or [], batch.get(MASKED) or []) if why is not None]


def masked_rows(records: Iterable[dict[str, Any]]) -> tuple[dict[int, str], dict[str, list[int]]]:
    """Each distinct dataset row masked after the exchange with its reason, and the rows each module masked
    (every module masks the same ones: the summary says so, or which differ)."""
    reasons: dict[int, str] = {}
    by_module: dict[str, set[int]] = {}
    for record in records:
        if record.get("tp_rank", 0) or record.get("pp_rank", 0):
            continue
        rows = by_module.setdefault(record["module"], set())
        for row, why in record.get("masked_rows", []):
            reasons.setdefault(int(row), why)
            rows.add(int(row))
    return dict(sorted(reasons.items())), {module: sorted(rows) for module, rows in by_module.items()}


def format_mask_report(rows: dict[int, str], by_module: dict[str, list[int]]) -> str:
    """The summary lines of rows masked after the exchange: the rows, whether every module masked them, why."""
    if not rows:
        return "masked 0 row(s) that failed after the exchange (--skip-bad-samples)"
    listed = list(rows.items())[:REPORTED_ROWS]
    alike = len({tuple(masked) for masked in by_module.values()}) == 1
    modules = ", ".join(sorted(by_module))
    agreement = (f"on every module ({modules})" if alike else
                 "NOT alike on every module: " + "; ".join(f"{module}: {masked}" for module, masked in sorted(by_module.items())))
    head = (f"masked {len(rows)} row(s) that failed after the exchange (--skip-bad-samples), {agreement}: kept in their "
            f"micro-batches with blank images and every label ignored: rows {', '.join(str(row) for row, _ in listed)}"
            f"{f' and {len(rows) - len(listed)} more' if len(rows) > len(listed) else ''}")
    return "\n".join([head, *(f"  row {row}: {why}" for row, why in listed)])


def skipped_rows(records: Iterable[dict[str, Any]], module: str) -> tuple[dict[int, str], int]:
    """Each distinct dataset row ``module`` skipped with its reason (every module skips the same ones), and
    how many times bad rows were met: once per DP rank's micro-batch (tensor and pipeline peers hold the
    same one), a row met again (another slot's successor, a later epoch) counting again."""
    reasons: dict[int, str] = {}
    attempts = 0
    for record in records:
        if record["module"] != module or record.get("tp_rank", 0) or record.get("pp_rank", 0):
            continue
        for row, why in record.get("replaced_rows", []):
            reasons.setdefault(int(row), why)
            attempts += 1
    return dict(sorted(reasons.items())), attempts


def format_skip_report(rows: dict[int, str], attempts: int) -> str:
    """The ``--skip-bad-samples`` lines of the run summary: the distinct rows, then each with its reason."""
    if not rows:
        return "skipped 0 bad dataset row(s) (--skip-bad-samples)"
    listed = list(rows.items())[:REPORTED_ROWS]
    head = (f"skipped {len(rows)} bad dataset row(s) (--skip-bad-samples; {attempts} attempts to read them), each replaced by "
            f"the next good row of the global order: rows {', '.join(str(row) for row, _ in listed)}"
            f"{f' and {len(rows) - len(listed)} more' if len(rows) > len(listed) else ''}")
    return "\n".join([head, *(f"  row {row}: {why}" for row, why in listed)])


def bad_row_fields(batch: dict[str, Any]) -> dict[str, list[tuple[int, str]]]:
    """What a consumed micro-batch's record keeps of its bad rows: the rows its samples stand in for and the
    samples it holds masked, each with the reason."""
    return {"replaced_rows": replaced_in(batch), "masked_rows": masked_in(batch)}
