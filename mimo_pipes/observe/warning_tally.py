"""Warnings said once: each kind of warning is counted per process over the distinct things it is about
(dataset rows), instead of being logged for every sample on every rank.

Outside a command the first warning of each kind in a process is logged (with how to read the count);
a command that reports the tally itself collects it (:func:`collected`): ``mimo-pipes run`` and ``train``
merge every rank's tally on rank 0 and print one line per kind in the summary, ``analyze`` prints its own.
The recipe's map functions on worker processes (``processing="process"``) record their warnings there
(:class:`WarningsRecorded`) and the rank counts them as it takes their results (:func:`replayed`); a map function
run on worker processes of a program's own counts in those processes.
"""

from __future__ import annotations

import logging
import numbers
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("mimo_pipes")


@dataclass(frozen=True)
class WarningKind:
    """``what``: the counted things, in the plural ("samples truncated to --seq-length"); ``subject``: what
    names one of them ("dataset row"); ``note``: what the summary line adds about them."""

    what: str
    subject: str = "dataset row"
    note: str = ""


@dataclass(frozen=True)
class WarningCount:
    kind: WarningKind
    count: int
    first: Hashable  # the smallest subject (numbers before names)

    def line(self) -> str:
        note = f"{self.kind.note}; " if self.kind.note else ""
        return f"warnings: {self.count} {self.kind.what} ({note}first: {self.kind.subject} {self.first})"


Snapshot = dict[WarningKind, list[Hashable]]
"""A tally as it travels between processes: every kind's distinct subjects."""


class WarningTally:
    """Distinct subjects per kind (thread-safe: map functions run on the mapper's threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subjects: dict[WarningKind, set[Hashable]] = {}
        self.collecting = False

    def add(self, kind: WarningKind, subject: Hashable) -> bool:
        """Count ``subject``; True when it is the first of its kind here."""
        with self._lock:
            subjects = self._subjects.setdefault(kind, set())
            first = not subjects
            subjects.add(subject)
            return first

    def snapshot(self) -> Snapshot:
        with self._lock:
            return {kind: sorted(subjects, key=_order) for kind, subjects in self._subjects.items()}

    def clear(self) -> None:
        with self._lock:
            self._subjects.clear()


_TALLY = WarningTally()


Recorded = list[tuple[WarningKind, Hashable, str]]
"""Warnings recorded on a worker process for the process the work is done for: (kind, subject, detail) each."""


class _Recording(threading.local):
    """Per thread: where warnings are recorded instead of counted (None: counted here)."""

    seen: Recorded | None = None


_recording = _Recording()


def warn(kind: WarningKind, subject: Hashable, detail: str) -> None:
    """Count ``subject`` under ``kind``. The first of its kind in this process is logged with ``detail``,
    unless a command collects the tally. Within :func:`recorded` on this thread: only recorded."""
    seen = _recording.seen
    if seen is not None:
        seen.append((kind, subject, detail))
        return
    if _TALLY.add(kind, subject) and not _TALLY.collecting:
        logger.warning("%s; further %s are counted, not logged (mimo_pipes.observe.warning_tally.counts())", detail, kind.what)


def counts() -> list[WarningCount]:
    """This process's tally so far."""
    return merge([_TALLY.snapshot()])


@contextmanager
def collected() -> Iterator[WarningTally]:
    """Within: warnings are only counted, from an empty tally; the caller reports them."""
    previous = _TALLY.collecting
    _TALLY.clear()
    _TALLY.collecting = True
    try:
        yield _TALLY
    finally:
        _TALLY.collecting = previous


@contextmanager
def recorded() -> Iterator[Recorded]:
    """Within, on this thread: warnings are recorded in the list yielded, not counted nor logged here (a worker
    process records the warnings of the work it does; the rank it works for counts them, :func:`replayed`)."""
    previous, _recording.seen = _recording.seen, []
    try:
        yield _recording.seen
    finally:
        _recording.seen = previous


class WarningsRecorded:
    """``function`` run with its warnings recorded: ``(its result, the warnings)``. Picklable when ``function``
    is: what a worker process runs in place of a map function, so that the warnings reach the rank's tally (and
    its run summary) through :func:`replayed` instead of staying counted in the worker."""

    def __init__(self, function: Callable[[Any], Any]) -> None:
        self.function = function

    def __call__(self, item: Any) -> tuple[Any, Recorded]:
        with recorded() as seen:
            result = self.function(item)
        return result, seen


def replayed(result_and_warnings: tuple[Any, Recorded]) -> Any:
    """The result of a :class:`WarningsRecorded` call, its warnings (recorded elsewhere, :func:`recorded`) counted
    here as if they were raised here."""
    result, seen = result_and_warnings
    for kind, subject, detail in seen:
        warn(kind, subject, detail)
    return result


def merge(snapshots: Iterable[Mapping[WarningKind, Iterable[Hashable]]]) -> list[WarningCount]:
    """Every process's tally as one: distinct subjects per kind (the modules and TP peers of a job process
    the same rows), kinds in the order first seen."""
    union: dict[WarningKind, set[Hashable]] = {}
    for snapshot in snapshots:
        for kind, subjects in snapshot.items():
            union.setdefault(kind, set()).update(subjects)
    return [WarningCount(kind, len(subjects), min(subjects, key=_order)) for kind, subjects in union.items() if subjects]


def _order(subject: Hashable) -> tuple[int, float, str]:
    """Numbers in numeric order, then anything else by its text."""
    if isinstance(subject, numbers.Real) and not isinstance(subject, bool):
        return (0, float(subject), "")
    return (1, 0.0, str(subject))
