"""The pure parts of reading object storage: URLs joined inside their folder, which errors are retried and how
often, the byte-bounded cache, the settings from the environment, and the sparse file pyarrow reads row groups from."""

from __future__ import annotations

import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mimo_pipes.data.sources.s3_parquet import SparseFile
from mimo_pipes.data.storage.byte_cache import ByteBoundedCache
from mimo_pipes.data.storage.retries import is_transient, with_retries
from mimo_pipes.data.storage.s3_settings import settings_from_env
from mimo_pipes.data.storage.s3_url import bucket_and_key, is_s3, join_inside, parent
from mimo_pipes.errors import ConfigError

parts = st.lists(st.sampled_from(["a", "b", "..", ".", "c.png", ""]), min_size=1, max_size=6)


@given(parts)
def test_a_joined_path_stays_inside_its_folder_or_is_refused(names):
    relative = "/".join(names)
    url = join_inside("s3://bucket/images", relative)
    climbs = posixpath.normpath(relative).startswith("..") or posixpath.normpath(relative) in (".", "..")
    if url is None:
        assert climbs or relative.startswith("/")
    else:
        assert url.startswith("s3://bucket/images/") and "/../" not in url and not url.endswith("/..")


def test_urls_split_and_their_folders():
    assert is_s3("s3://b/k") and not is_s3("/data/s3://x") and not is_s3(None)
    assert bucket_and_key("s3://b/x/y.parquet") == ("b", "x/y.parquet")
    assert parent("s3://b/x/y.parquet") == "s3://b/x"
    assert parent("s3://b/x/part-*/y.parquet") == "s3://b/x"
    assert join_inside("s3://b/x", "/etc/passwd") is None


class Answer(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": 503 if code == "SlowDown" else 404}}


@pytest.mark.parametrize(("error", "transient"), [
    (Answer("SlowDown"), True), (ConnectionResetError("reset"), True), (TimeoutError(), True),
    (Answer("NoSuchKey"), False), (PermissionError("denied"), False), (ValueError("bad"), False),
])
def test_which_errors_are_tried_again(error, transient):
    assert is_transient(error) is transient


@given(st.integers(0, 8), st.integers(1, 6))
def test_retries_are_bounded_and_back_off(failures, attempts):
    calls, waits = [], []

    def call():
        calls.append(1)
        if len(calls) <= failures:
            raise ConnectionResetError("reset")
        return "ok"

    if failures < attempts:
        assert with_retries(call, attempts=attempts, backoff_s=0.5, sleep=waits.append) == "ok"
        assert len(calls) == failures + 1
    else:
        with pytest.raises(ConnectionResetError):
            with_retries(call, attempts=attempts, backoff_s=0.5, sleep=waits.append)
        assert len(calls) == attempts
    assert waits == [0.5 * 2**k for k in range(len(calls) - 1)]


def test_a_lasting_error_is_not_retried():
    calls = []

    def call():
        calls.append(1)
        raise Answer("NoSuchKey")

    with pytest.raises(Answer):
        with_retries(call, attempts=5, backoff_s=0, sleep=lambda s: None)
    assert len(calls) == 1


@given(st.lists(st.tuples(st.integers(0, 9), st.integers(1, 50)), max_size=40), st.integers(0, 120))
def test_the_cache_holds_at_most_its_limit_and_builds_each_value_once_while_held(requests, limit):
    cache: ByteBoundedCache[bytes] = ByteBoundedCache(limit, len)
    for key, size in requests:
        value = cache.get(key, lambda key=key, size=size: bytes(size))
        assert isinstance(value, bytes)
        assert cache.held_bytes <= max(limit, len(value))
    if requests:
        key, _ = requests[-1]
        loads = cache.loads
        cache.get(key, lambda: b"never")
        assert cache.loads == loads  # the newest value is always held


def test_settings_from_the_environment():
    settings = settings_from_env({"MIMO_PIPES_S3_CONCURRENCY": "4", "MIMO_PIPES_S3_CACHE_MB": "1.5"})
    assert settings.concurrency == 4 and settings.cache_bytes == int(1.5 * 2**20)
    with pytest.raises(ConfigError, match="MIMO_PIPES_S3_CONCURRENCY: must be >= 1"):
        settings_from_env({"MIMO_PIPES_S3_CONCURRENCY": "0"})
    with pytest.raises(ConfigError, match="MIMO_PIPES_S3_ATTEMPTS: must be an integer"):
        settings_from_env({"MIMO_PIPES_S3_ATTEMPTS": "many"})


@given(st.binary(min_size=1, max_size=64), st.integers(0, 100), st.integers(0, 80), st.integers(0, 80))
def test_a_sparse_file_reads_its_pieces_where_they_are_and_zeros_elsewhere(piece, at, start, length):
    size = at + len(piece) + 10
    whole = bytes(at) + piece + bytes(10)
    handle = SparseFile(size, {at: piece})
    handle.seek(min(start, size))
    assert handle.read(length) == whole[min(start, size): min(start, size) + length]
