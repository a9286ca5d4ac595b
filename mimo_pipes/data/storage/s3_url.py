"""``s3://bucket/key`` URLs: recognised, split and joined as plain strings (no client needed)."""

from __future__ import annotations

import glob
import posixpath
from pathlib import Path

SCHEME = "s3://"


def is_s3(spec: object) -> bool:
    """Whether ``spec`` (a ``--dataset`` or ``--image-folder`` value) is an ``s3://`` URL."""
    return isinstance(spec, str) and spec.startswith(SCHEME)


def bucket_and_key(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``."""
    rest = url[len(SCHEME):]
    bucket, _, key = rest.partition("/")
    return bucket, key


def parent(url: str) -> str:
    """The folder a file URL is in, or the fixed folder above a glob's first wildcard (no trailing slash)."""
    bucket, key = bucket_and_key(url.rstrip("/"))
    parts = key.split("/") if key else []
    if glob.has_magic(key):
        parts = parts[: next(k for k, part in enumerate(parts) if glob.has_magic(part))]
    else:
        parts = parts[:-1]
    return SCHEME + "/".join([bucket, *parts])


def join_inside(folder: str, relative: str | Path) -> str | None:
    """``relative`` resolved inside the folder URL ``folder``; None when it climbs out of it (``..``) or is absolute."""
    text = str(relative).replace("\\", "/")
    if text.startswith("/"):
        return None
    normal = posixpath.normpath(text)
    if normal == ".." or normal.startswith("../") or normal == ".":
        return None
    return folder.rstrip("/") + "/" + normal


def suffix(url: str) -> str:
    """The lower-case extension of a URL's last part (``.parquet``), '' when none."""
    return Path(bucket_and_key(url)[1]).suffix.lower()
