"""The processing workers a rank gets when ``num_workers`` is unset: its share of the node's cores, less its own threads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mimo_pipes.config import PipelineConfig
from mimo_pipes.config.tail_settings import resolve_pipeline_tail
from mimo_pipes.config.workers import RANK_THREADS, default_workers, local_ranks, processing_workers, rank_cores


@given(st.integers(1, 1024), st.integers(1, 64), st.integers(0, 8))
def test_the_ranks_of_a_node_never_ask_for_more_than_its_cores_beyond_one_each(cores, ranks, reserved):
    workers = default_workers(cores, ranks, reserved)
    assert workers >= 1
    share = cores // ranks
    if share > reserved:  # a share with room beside the rank's own threads: all of that room, no more
        assert workers == share - reserved
        assert ranks * (workers + reserved) <= cores
    else:
        assert workers == 1


@given(st.integers(1, 1024), st.integers(1, 64))
def test_more_ranks_on_a_node_never_give_a_rank_more_workers(cores, ranks):
    assert default_workers(cores, ranks + 1) <= default_workers(cores, ranks)
    assert default_workers(cores + ranks, ranks) >= default_workers(cores, ranks)


def test_sixteen_cores_one_rank_take_fourteen_workers():
    assert default_workers(16, 1) == 16 - RANK_THREADS == 14
    assert default_workers(128, 8) == 14
    assert default_workers(2, 1) == 1


@pytest.mark.parametrize(("environ", "ranks"), [
    ({}, 1),
    ({"WORLD_SIZE": "4"}, 4),
    ({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}, 8),
    ({"LOCAL_WORLD_SIZE": "", "WORLD_SIZE": "2"}, 2),
    ({"LOCAL_WORLD_SIZE": "0"}, 1),
])
def test_the_ranks_sharing_the_node_come_from_the_launcher(environ, ranks):
    assert local_ranks(environ) == ranks


def test_unset_num_workers_resolves_on_the_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert PipelineConfig().num_workers is None
    expected = default_workers(rank_cores(), 1)
    assert processing_workers(None) == expected
    assert processing_workers(0) == 1 and processing_workers(5) == 5
    config = PipelineConfig(components=("language=dp=1",))
    tail = resolve_pipeline_tail(config, 1, image_token_ids=7, pad_values={"input_ids": 0})
    assert tail.processing.workers == expected
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(rank_cores() * 4))  # more ranks than cores: one worker each
    assert resolve_pipeline_tail(config, 1, image_token_ids=7, pad_values={"input_ids": 0}).processing.workers == 1


@given(st.integers(1, 4096))
def test_counting_workers_keep_up_with_their_workers_and_stay_few(workers):
    from mimo_pipes.config.workers import WORKERS_PER_COUNTING_WORKER, counting_workers

    threads = counting_workers(workers)
    assert 1 <= threads <= workers
    assert threads * WORKERS_PER_COUNTING_WORKER >= workers > (threads - 1) * WORKERS_PER_COUNTING_WORKER
    assert counting_workers(workers + 1) in (threads, threads + 1)
