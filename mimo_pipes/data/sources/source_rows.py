"""Every row of a ``--dataset`` source with its place (file and line, or file and row), for ``mimo-pipes check``.

A source is opened as a run opens it (:func:`~mimo_pipes.data.sources.open_source.open_source`), so its rows are the
run's, numbered as the run numbers them (``dataset row N``, from 0). JSON and JSON-lines files that
``datasets`` cannot read are read here instead, line by line: every malformed line and every empty file is
named, and every other row is still checked, numbered as the run will number it once those lines are mended
(a blank line is no row). An empty file among readable ones, which ``datasets`` takes for no rows, is named
too. Lines count from 1, rows from 0.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mimo_pipes.data import bad_rows
from mimo_pipes.data.sources.energon_source import is_energon
from mimo_pipes.data.sources.open_source import data_files, open_source, read_rows
from mimo_pipes.data.storage.s3_url import is_s3
from mimo_pipes.errors import ConfigError, json_error_text


@dataclass(frozen=True, order=True)
class Place:
    """Where a row or a finding is: ``order`` sorts places as the files hold them (file, then line or row)."""

    order: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class Finding:
    """A fault met reading the source itself: a malformed line (``rows``: the dataset rows it stands for, 1),
    an empty or unreadable file (0), a shard of an Energon dataset that cannot be read (its samples)."""

    place: Place
    kind: str
    reason: str
    rows: int


@dataclass
class SourceRows:
    """The rows to check of one source. ``total``: its rows, malformed lines included; ``findings``: the
    faults met reading it; ``batches`` yields ``(dataset row, row)`` pairs in order."""

    spec: str
    total: int
    findings: list[Finding] = field(default_factory=list)
    dataset: Any = None  # the source as a run opens it; None when it is read line by line
    files: list[str] | None = None  # its files (None: a save_to_disk folder)
    builder: str | None = None
    unread: Callable[[int], bool] | None = None  # rows a finding stands for (a shard that cannot be read): not read

    def batches(self, size: int) -> Iterator[list[tuple[int, dict]]]:
        if self.dataset is not None and self.unread is not None:
            rows = (row for row in range(self.total) if not self.unread(row))
            while chunk := list(itertools.islice(rows, size)):
                yield [(row, self.dataset[row]) for row in chunk]
            return
        if self.dataset is not None:
            for start in range(0, self.total, size):
                yield list(enumerate(read_rows(self.dataset, start, min(start + size, self.total)), start))
            return
        batch: list[tuple[int, dict]] = []
        for _, row, entry in _json_entries(self.files or []):
            if isinstance(entry, dict):
                batch.append((row, entry))
                if len(batch) == size:
                    yield batch
                    batch = []
        if batch:
            yield batch

    def places(self, rows: Iterable[int]) -> dict[int, Place]:
        """The place of each of ``rows`` (read from the files again: called for the bad rows only)."""
        wanted = set(rows)
        found: dict[int, Place] = {}
        if hasattr(self.dataset, "places"):  # a source that names its own rows (an Energon shard and key)
            return {row: Place(order, text) for row, (order, text) in self.dataset.places(sorted(wanted)).items()}
        if self.files is not None and self.builder == "json":
            for place, row, _ in _json_entries(self.files):
                if row in wanted:
                    found[row] = place
        elif self.files is not None:
            import pyarrow.parquet as pq

            start = 0
            for index, name in enumerate(self.files):
                count = pq.ParquetFile(name).metadata.num_rows
                for row in sorted(r for r in wanted if start <= r < start + count):
                    found[row] = Place((index, row - start), f"{name} row {row - start} (dataset row {row})")
                start += count
        return {row: found.get(row) or Place((0, row), f"dataset row {row}") for row in wanted}


def open_rows(spec: str, split: str = "train") -> SourceRows:
    """The rows of ``spec`` (a ``--dataset`` value; its ``split`` part). Raises ConfigError when the source
    cannot be read and no line or file of it is to blame (a missing path, another kind of file, a column
    missing). An Energon shard that cannot be read is one finding for all its samples, which are not read."""
    if is_energon(spec):
        from mimo_pipes.data.sources.energon_checks import source_problems

        dataset = open_source(spec, split)
        problems, unread = source_problems(dataset)
        findings = [Finding(Place(p.order, p.text), p.kind, f"{p.reason}; its rows are not checked", rows=p.rows) for p in problems]
        return SourceRows(spec, len(dataset), findings, dataset=dataset, unread=unread if problems else None)
    if is_s3(spec):
        from mimo_pipes.data.sources.s3_source import copied_names, is_file_spec, local_copy, s3_files

        if is_file_spec(spec) and s3_files(spec)[0] == "parquet":  # read in place, row group by row group
            dataset = open_source(spec, split)
            return SourceRows(spec, len(dataset), dataset=dataset)
        rows = open_rows(local_copy(spec)[0], split)  # JSON files, a save_to_disk folder: their local copy, read as on disk
        return _named_by_urls(rows, copied_names(spec)) if is_file_spec(spec) else rows
    if Path(spec).expanduser().is_dir():
        dataset = open_source(spec, split)
        return SourceRows(spec, len(dataset), dataset=dataset)
    builder, files = data_files(spec)
    try:
        dataset = open_source(spec, split)
    except ConfigError:
        if builder != "json":
            raise
        findings, total = _read_findings(files)
        if not findings:
            raise
        return SourceRows(spec, total, findings, files=files, builder=builder)
    empty = [_empty_file(index, name) for index, name in enumerate(files) if builder == "json" and not _has_rows(name)]
    return SourceRows(spec, len(dataset), empty, dataset=dataset, files=files, builder=builder)


def _named_by_urls(rows: SourceRows, names: dict[str, str]) -> SourceRows:
    """``rows`` of local copies whose places name the copies' ``s3://`` URLs instead (what the user passed)."""

    def renamed(place: Place) -> Place:
        text = place.text
        for local, url in names.items():
            text = text.replace(local, url)
        return Place(place.order, text)

    class Renamed(SourceRows):
        def places(self, wanted: Iterable[int]) -> dict[int, Place]:
            return {row: renamed(place) for row, place in super().places(wanted).items()}

    findings = [Finding(renamed(f.place), f.kind, f.reason, f.rows) for f in rows.findings]
    return Renamed(rows.spec, rows.total, findings, rows.dataset, rows.files, rows.builder, rows.unread)


# ----------------------------------------------------------------------------------------------------
# JSON and JSON lines, read here


Entry = tuple[Place, int, "dict | Finding"]
"""(place, dataset row or -1 for a file's fault, the row or what is wrong with it)."""


def _read_findings(files: list[str]) -> tuple[list[Finding], int]:
    findings, total = [], 0
    for _, row, entry in _json_entries(files):
        if isinstance(entry, Finding):
            findings.append(entry)
        total += row >= 0
    return findings, total


def _has_rows(name: str) -> bool:
    with open(name, "rb") as handle:
        return any(line.strip() for line in handle)


def _empty_file(index: int, name: str) -> Finding:
    return Finding(Place((index, 0), name), bad_rows.EMPTY_FILE, "holds no rows", rows=0)


def _json_entries(files: list[str]) -> Iterator[Entry]:
    """Every row and fault of ``files`` in order, as ``datasets`` reads them: a ``.json`` file as one value
    (a list of rows) unless it holds several values (JSON lines), a ``.jsonl`` file line by line."""
    row = 0
    for index, name in enumerate(files):
        if not _has_rows(name):
            yield _empty_file(index, name).place, -1, _empty_file(index, name)
            continue
        if name.lower().endswith(".json"):
            value, fault = _whole(index, name)
            if fault is not None:
                yield fault.place, -1, fault
                continue
            if value is not None:
                for k, item in enumerate(value):
                    place = Place((index, k), f"{name} row {k} (dataset row {row})")
                    yield place, row, item if isinstance(item, dict) else Finding(place, bad_rows.NOT_A_ROW, _not_a_row(item), rows=1)
                    row += 1
                continue
        with open(name, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                place = Place((index, number), f"{name} line {number} (dataset row {row})")
                yield place, row, _line(raw, place)
                row += 1


def _whole(index: int, name: str) -> tuple[list | None, Finding | None]:
    """A ``.json`` file's list of rows; (None, None) when it holds JSON lines instead."""
    try:
        with open(name, encoding="utf-8") as handle:
            value = json.load(handle)
    except json.JSONDecodeError as error:
        if error.msg == "Extra data":  # more than one value: JSON lines in a .json file
            return None, None
        place = Place((index, error.lineno), f"{name} line {error.lineno}")
        return None, Finding(place, bad_rows.INVALID_JSON, f"{json_error_text(error, line=False)}; none of the file's rows can be read", rows=0)
    except UnicodeDecodeError as error:
        return None, Finding(Place((index, 0), name), bad_rows.INVALID_JSON, f"not UTF-8 text ({error.reason} at byte {error.start})", rows=0)
    if not isinstance(value, list):
        return None, Finding(Place((index, 0), name), bad_rows.NOT_A_ROW, f"holds a JSON {type(value).__name__}, not a list of rows", rows=0)
    return value, None


def _line(raw: bytes, place: Place) -> dict | Finding:
    try:
        value = json.loads(raw.rstrip(b"\r\n"))
    except UnicodeDecodeError:
        return Finding(place, bad_rows.INVALID_JSON, "not UTF-8 text", rows=1)
    except json.JSONDecodeError as error:
        return Finding(place, bad_rows.INVALID_JSON, f"{json_error_text(error, line=False)}", rows=1)
    return value if isinstance(value, dict) else Finding(place, bad_rows.NOT_A_ROW, _not_a_row(value), rows=1)


def _not_a_row(value: object) -> str:
    return f"a row must be a JSON object, got {type(value).__name__} {json.dumps(value)[:40]}"
