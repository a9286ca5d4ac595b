"""Reading a shard's rows of a map-style source several at a time, where the source offers it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def rows_together(dataset: Any, indices: Sequence[int]) -> list[dict] | None:
    """The rows at ``indices``, as new dicts, from one call of the source's ``__getitems__`` (torch's batched
    read; a Hugging Face dataset answers it with one table query, where a row at a time costs a query and a
    format each). None where the source has none, or the call fails or gives another number of rows: the
    caller then reads a row at a time, and a row that cannot be read fails at its own turn."""
    read = getattr(dataset, "__getitems__", None)
    if read is None:
        return None
    try:
        rows = read(list(indices))
    except Exception:  # noqa: BLE001 - read again a row at a time, where the failure names its row
        return None
    if len(rows) != len(indices):
        return None
    return [dict(row) for row in rows]
