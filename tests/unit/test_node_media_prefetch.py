"""MediaPrefetch: items pass unchanged, each started ``ahead`` items before it is asked for, and the state is the
source's after the last item delivered, so a restore at every position gives the same stream whatever ``ahead``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from node_checks import check_save_load_everywhere, saved_after, take, tiny_samples

from mimo_pipes.data.storage.s3_images import media_paths
from mimo_pipes.nodes.media_prefetch import MediaPrefetch
from mimo_pipes.samples.sample import SAMPLE_ID


def prefetching(ahead: int, started: list | None = None) -> MediaPrefetch:
    started = [] if started is None else started
    return MediaPrefetch(tiny_samples(2, 6), start=lambda item: started.append(item[SAMPLE_ID]), ahead=ahead)


@pytest.mark.parametrize("ahead", [0, 1, 5, 40])
def test_restores_at_every_position_whatever_it_read_ahead(ahead):
    items = check_save_load_everywhere(lambda: prefetching(ahead))
    assert [item[SAMPLE_ID] for item in items] == [item[SAMPLE_ID] for item in take(tiny_samples(2, 6), None)]


@given(ahead=st.integers(0, 14), asked=st.integers(0, 12))
@settings(max_examples=30, deadline=None)
def test_each_item_is_started_once_ahead_items_before_it_is_asked_for(ahead, asked):
    started: list = []
    node = prefetching(ahead, started)
    delivered = [item[SAMPLE_ID] for item in take(node, asked)]
    reference = [item[SAMPLE_ID] for item in take(tiny_samples(2, 6), None)]
    assert started == reference[: min(len(reference), asked + ahead)] if asked else started == []
    assert delivered == reference[:asked]


def test_a_state_saved_with_items_read_ahead_resumes_after_the_last_delivered():
    started: list = []
    node = prefetching(4, started)
    state = saved_after(node, 3)
    restored = prefetching(0)
    restored.reset(state)
    assert [i[SAMPLE_ID] for i in take(restored, None)] == [i[SAMPLE_ID] for i in take(tiny_samples(2, 6), None)][3:]


def test_the_files_a_row_names_by_path_are_those_fetched():
    row = {"images": ["a.png", {"bytes": None, "path": "b.jpg"}, {"bytes": b"x", "path": "c.jpg"}, b"raw"],
           "videos": [["f0.jpg", "f1.jpg"], "clip/f.png"], "image": "unused.png", "text": "x.png"}
    assert media_paths(row) == ["a.png", "b.jpg", "f0.jpg", "f1.jpg", "clip/f.png"]
    assert media_paths({"images": None, "image": "one.png"}) == ["one.png"]
    assert media_paths({"messages": [], "images": None}) == []
