"""Warnings said once: a process's tally counts distinct subjects per kind, merging tallies counts each
subject once however many ranks saw it, and only the first of a kind is logged outside a command."""

from __future__ import annotations

import logging
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_pipes.observe.warning_tally import WarningKind, WarningTally, collected, counts, merge, warn

A = WarningKind("samples truncated to --seq-length")
B = WarningKind("images resized", subject="image", note="kept")

subjects = st.one_of(st.integers(-5, 50), st.sampled_from(["rx-1", "rx-2", "b"]))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([A, B]), subjects), max_size=40), st.integers(1, 5), st.data())
def test_merged_tallies_count_each_subject_once(events, ranks, data):
    """However the warnings fall on ranks (each rank may see a subject again: modules, TP peers, prefetch),
    the merge is the tally of one process that saw them all."""
    tallies = [WarningTally() for _ in range(ranks)]
    for kind, subject in events:
        for rank in data.draw(st.lists(st.integers(0, ranks - 1), min_size=1, max_size=3)):
            tallies[rank].add(kind, subject)
    merged = {count.kind: count for count in merge(tally.snapshot() for tally in tallies)}
    expected = {kind: {s for k, s in events if k == kind} for kind, _ in events}
    assert set(merged) == set(expected)
    for kind, seen in expected.items():
        assert merged[kind].count == len(seen)
        numbers = [s for s in seen if isinstance(s, int)]
        assert merged[kind].first == (min(numbers) if numbers else min(seen))  # numbers first, in numeric order


def test_the_line_names_the_count_the_note_and_the_first_subject():
    tally = WarningTally()
    for row in (12, 7, 30, 7):
        tally.add(A, row)
    tally.add(B, "x.png")
    assert [count.line() for count in merge([tally.snapshot()])] == [
        "warnings: 3 samples truncated to --seq-length (first: dataset row 7)",
        "warnings: 1 images resized (kept; first: image x.png)",
    ]


def test_threads_count_every_subject():
    tally = WarningTally()
    threads = [threading.Thread(target=lambda k=k: [tally.add(A, k * 1000 + i) for i in range(500)]) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert merge([tally.snapshot()])[0].count == 2000


def test_outside_a_command_the_first_of_a_kind_is_logged_once(caplog):
    with collected():
        warn(A, 1, "inside")  # counted, not logged
    assert [count.count for count in counts()] == [1]
    with caplog.at_level(logging.WARNING, logger="mimo_pipes"):
        warn(A, 2, "not the first of its kind here")
        warn(B, "y", "dataset row y: first of its kind")
        warn(B, "z", "dataset row z: again")
    assert [record.getMessage().split(";")[0] for record in caplog.records] == ["dataset row y: first of its kind"]
    with collected() as tally:  # a command's block starts from an empty tally
        assert tally.snapshot() == {}
