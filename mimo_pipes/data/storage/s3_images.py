"""Image and video-frame files under an ``s3://`` image folder (``--image-folder``, or an S3 dataset's own folder):
each fetched when its row is processed, on the processing threads, recently used ones kept in a bounded cache (the
rows payload reads an image's header to count it, then its bytes to move it)."""

from __future__ import annotations

import threading
from pathlib import Path

from mimo_pipes.data import bad_rows
from mimo_pipes.data.storage.byte_cache import ByteBoundedCache
from mimo_pipes.data.storage.s3_store import StorageError, store
from mimo_pipes.data.storage.s3_url import join_inside
from mimo_pipes.errors import SampleError

_CACHES: dict[int, ByteBoundedCache[bytes]] = {}
_LOCK = threading.Lock()


def _cache() -> ByteBoundedCache[bytes]:
    client = store()
    with _LOCK:
        if id(client) not in _CACHES:
            _CACHES.clear()
            _CACHES[id(client)] = ByteBoundedCache(client.settings.cache_bytes, len)
        return _CACHES[id(client)]


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
