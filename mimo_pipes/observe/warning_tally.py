"""Warnings said once: each kind of warning is counted per process over the distinct things it is about
(dataset rows), instead of being logged for every sample on every rank.

Outside a command the first warning of each kind in a process is logged (with how to read the count);
a command that reports the tally itself collects it (:func:`collected`): ``mimo-pipes run`` and ``train``
merge every rank's tally on rank 0 and print one line per kind in the summary, ``analyze`` prints its own.
Map functions run on worker processes (``processing="process"``) count in those processes.
"""

from __future__ import annotations

import logging
import numbers
import threading
from collections.abc import Hashable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

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


def warn(kind: WarningKind, subject: Hashable, detail: str) -> None:
    """Count ``subject`` under ``kind``. The first of its kind in this process is logged with ``detail``,
    unless a command collects the tally."""
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
