"""Image and video-frame files under an ``s3://`` image folder (``--image-folder``, or an S3 dataset's own folder):
fetched ahead of need (:func:`prefetch_media`, called as rows are read, ahead of the processing, by
:class:`~mimo_pipes.nodes.media_prefetch.MediaPrefetch`) on a pool of the store's ``concurrency`` threads, or when
the row is processed where no fetch was started; recently used ones kept in a bounded cache (the rows payload
reads an image's header to count it, then its bytes to move it)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mimo_pipes.data import bad_rows
from mimo_pipes.data.storage.byte_cache import ByteBoundedCache
from mimo_pipes.data.storage.s3_store import StorageError, store
from mimo_pipes.data.storage.s3_url import join_inside
from mimo_pipes.errors import SampleError

_HELD: list[tuple[Any, ByteBoundedCache[bytes], ThreadPoolExecutor]] = []  # (store, its cache, its pool): one
_LOCK = threading.Lock()


def _cache_and_pool() -> tuple[ByteBoundedCache[bytes], ThreadPoolExecutor]:
    """This store's cache of files and its pool of fetches ahead of need (made again with a new store: the store
    itself is held, so a new one is never taken for the old one)."""
    client = store()
    with _LOCK:
        if not _HELD or _HELD[0][0] is not client:
            for _, _, pool in _HELD:
                pool.shutdown(wait=False, cancel_futures=True)
            _HELD[:] = [(client, ByteBoundedCache(client.settings.cache_bytes, len),
                         ThreadPoolExecutor(client.settings.concurrency, thread_name_prefix="mimo-pipes-s3-fetch"))]
        return _HELD[0][1], _HELD[0][2]


def _cache() -> ByteBoundedCache[bytes]:
    return _cache_and_pool()[0]


def media_paths(row: dict) -> list[str]:
    """The files ``row``'s images and video frames name by path (what processing it fetches), in row order."""
    found: list[str] = []

    def visit(value: Any, depth: int) -> None:
        if isinstance(value, (list, tuple)) and depth < 2:  # images: a list; videos: a list of lists of frames
            for item in value:
                visit(item, depth + 1)
        elif isinstance(value, dict) and value.get("bytes") is None and value.get("path"):
            found.append(str(value["path"]))
        elif isinstance(value, (str, Path)):
            found.append(str(value))

    for plural, single in (("images", "image"), ("videos", "video")):  # as processing picks them (conversation.row_images)
        visit(row[plural] if row.get(plural) is not None else row.get(single), 0)
    return found


def prefetch_media(row: dict, image_folder: str) -> int:
    """Starts fetching (into the cache, on the store's pool) every file ``row`` names under the folder URL
    ``image_folder`` that the cache does not hold; returns at once, with how many fetches it started. A fetch
    that fails is forgotten: processing the row fetches the file again and names the failure."""
    cache, pool = _cache_and_pool()
    started = 0
    for path in media_paths(row):
        url = join_inside(image_folder, path)
        if url is None or url in cache:
            continue
        pool.submit(_fetch_quietly, cache, url)
        started += 1
    return started


def prefetch_rows() -> int:
    """How many rows ahead of the processing their files are fetched (``MIMO_PIPES_S3_PREFETCH_ROWS``)."""
    return store().settings.prefetch_rows


def _fetch_quietly(cache: ByteBoundedCache[bytes], url: str) -> None:
    try:
        cache.get(url, lambda: store().read(url))
    except Exception:  # noqa: BLE001 - the row's processing fetches it again and reports the failure there
        pass


def image_bytes(path: str | Path, image_folder: str, row: object, what: str) -> bytes:
    """The bytes of the image ``path`` names inside the folder URL ``image_folder``; SampleError when it climbs out
    of the folder or is missing, StorageError when storage fails for good."""
    url = join_inside(image_folder, path)
    if url is None:
        raise SampleError(row, f"dataset row {row}: {what} {str(path)!r} is outside the image folder", field="images",
                          kind=bad_rows.OUTSIDE_IMAGE_FOLDER)
    try:
        return _cache().get(url, lambda: store().read(url))
    except StorageError as error:
        if error.reason == "no such key":
            raise SampleError(row, f"dataset row {row}: {what} {str(path)!r} does not exist under the image folder {image_folder} "
                                   "(--image-folder; default: the dataset's folder)", field="images", kind=bad_rows.MISSING_IMAGE) from None
        raise
