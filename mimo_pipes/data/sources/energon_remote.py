"""A prepared Megatron-Energon dataset in object storage, read through Energon's own storage layer (``EPath`` on
NVIDIA's multi-storage client): ``s3://bucket/path`` (read as MSC's implicit profile ``msc://_s3-bucket/path``,
with the endpoint, region and credentials of the standard AWS variables) or ``msc://profile/path`` (a profile of
the user's MSC configuration). Its ``.nv-meta/`` and the shards' ``.tar.idx`` indexes (small) are copied once into
the local cache; each sample is then one range request for its bytes, found through the local index, so a rank
reads only the samples it reads.

Every request to an ``s3://`` dataset is tried as ``MIMO_PIPES_S3_ATTEMPTS`` and ``MIMO_PIPES_S3_BACKOFF_S`` say, by
one layer: :func:`~mimo_pipes.data.storage.retries.with_retries` around each call made here. The client of the
implicit profile is the library's own (:func:`s3_client`), its boto3 and MSC retries off: left on, the three layers
multiplied (boto3's 3 tries inside each of MSC's 3, inside each of ours) and MSC's waits of a second or more (its
jitter is up to 1 s a try) ignored the backoff setting. A ``msc://profile`` of the user's own MSC configuration
keeps that configuration's retries, under the library's."""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mimo_pipes.data import bad_rows
from mimo_pipes.data.storage.retries import with_retries
from mimo_pipes.data.storage.s3_settings import S3Settings, settings_from_env
from mimo_pipes.errors import ConfigError

META = ".nv-meta"


def is_remote(spec: object) -> bool:
    return isinstance(spec, str) and spec.startswith(("s3://", "msc://"))


def epath(spec: str) -> Any:
    """``spec`` as an Energon ``EPath``: an ``s3://`` URL through MSC's implicit S3 profile of its bucket, whose
    client is :func:`s3_client` (so are the paths Energon makes from its URLs in this process)."""
    from megatron.energon.epathlib import EPath

    if spec.startswith("s3://"):
        bucket, _, key = spec[len("s3://"):].partition("/")
        spec = f"msc://_s3-{bucket}/{key}"
    if spec.startswith("msc://_s3-"):  # the implicit profile (s3:// as MSC names it; Energon's names of a blend's parts)
        use_s3_client(spec[len("msc://_s3-"):].partition("/")[0])
    return EPath(spec.rstrip("/"))


@functools.lru_cache(maxsize=16)
def s3_client(bucket: str, settings: S3Settings, aws: tuple[tuple[str, str], ...], pid: int) -> Any:
    """MSC's client of the implicit profile ``_s3-<bucket>`` as MSC would build it (endpoint, region and credentials
    from the AWS variables ``aws``), with the requests' timeout of ``settings`` and no retries of its own: boto3
    tries once (``total_max_attempts``: 1) and so does MSC (no retry configuration: with one of a single attempt,
    MSC would log every transient failure as "All retry attempts failed", which the library then tries again).
    One per process (``pid``), as MSC keeps its clients."""
    from multistorageclient import StorageClient, StorageClientConfig

    profile = f"_s3-{bucket}"
    options = {"base_path": bucket, "retries": {"total_max_attempts": 1},
               "connect_timeout": settings.timeout_s, "read_timeout": settings.timeout_s}
    config = StorageClientConfig.from_dict({"profiles": {profile: {"storage_provider": {"type": "s3", "options": options}}}},
                                           profile=profile, skip_validation=True)
    config.retry_config = None
    return StorageClient(config)


def use_s3_client(bucket: str) -> None:
    """Makes :func:`s3_client`, for the settings and AWS variables of now, the client MSC resolves the bucket's
    implicit profile to in this process (MSC keeps one client a profile, made at first use, and makes Energon's
    paths and unpickled ones through it)."""
    from multistorageclient import shortcuts

    aws = tuple(sorted((name, value) for name, value in os.environ.items() if name.startswith("AWS_")))
    client = s3_client(bucket, settings_from_env(), aws, os.getpid())  # MSC empties its clients in a forked child
    # MSC has no call to set a profile's client: its cache of them is private (multi-storage-client 1.3). Where a
    # release keeps them otherwise, MSC's own client is used (its retries then add to the library's).
    clients = vars(shortcuts).get("_STORAGE_CLIENT_CACHE")
    if isinstance(clients, dict):
        clients[f"_s3-{bucket}"] = client  # one assignment (atomic): no lock, which a fork could leave held in the child


def retried(call: Callable[[], Any]) -> Any:
    """``call()`` (one request through MSC), tried as the ``MIMO_PIPES_S3_*`` settings say."""
    settings = settings_from_env()
    return with_retries(call, attempts=settings.attempts, backoff_s=settings.backoff_s)


def is_metadataset_url(spec: str) -> bool:
    """Whether ``spec`` names a metadataset file (YAML) by its suffix."""
    return Path(spec).suffix.lower() in (".yaml", ".yml")


@functools.lru_cache(maxsize=64)
def is_remote_energon(spec: str) -> bool:
    """Whether the URL ``spec`` is a folder that holds a prepared Energon dataset (its ``.nv-meta/dataset.yaml``) or
    an Energon metadataset file (YAML) that exists; one request."""
    import glob as globbing

    if globbing.has_magic(spec) or Path(spec).suffix.lower() in (".parquet", ".json", ".jsonl"):
        return False
    try:
        if is_metadataset_url(spec):
            return bool(retried(epath(spec).is_file))
        return bool(retried((epath(spec) / META / "dataset.yaml").is_file))
    except Exception:  # noqa: BLE001 - no MSC, no such bucket, no endpoint: not an Energon dataset (the S3 checks say why)
        return False


def remote_text(spec: str) -> str:
    """The text of the object ``spec`` names, read through Energon's storage layer."""
    return retried(epath(spec).read_text)


def local_meta(spec: str) -> Path:
    """A local folder holding the dataset's ``.nv-meta/`` and ``*.tar.idx`` files, copied once (per their sizes), among
    the bounded copies of :mod:`~mimo_pipes.data.storage.disk_copies`."""
    from mimo_pipes.data.storage.disk_copies import bounded_copy

    root = epath(spec)
    try:
        files = sorted(p for p in retried(lambda: list(root.walk()))
                       if p.relative_to(root).startswith(META + "/") or p.name.endswith(".tar.idx"))
        listing = [(p.relative_to(root), retried(p.size)) for p in files]
    except Exception as error:  # noqa: BLE001 - storage failures name the URL
        raise ConfigError("--dataset", f"{spec}: cannot list the dataset ({' '.join(str(error).split())[:200]})") from None
    digest = hashlib.sha256(repr((spec, listing)).encode()).hexdigest()[:24]

    def copy(into: Path) -> None:
        for path, (name, _) in zip(files, listing):
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(retried(path.read_bytes))

    return bounded_copy(f"energon-{digest}", sum(size for _, size in listing), copy, spec)


class RemoteShard:
    """One shard in object storage: its local index, and its bytes read by range (retried on transient errors)."""

    def __init__(self, path: Any, index_fd: int, size: int) -> None:
        self.path = path
        self.index_fd = index_fd
        self.size = size
        self.settings = settings_from_env()

    def span(self, sample: int) -> tuple[int, int]:
        import os
        import struct

        raw = os.pread(self.index_fd, 16, 8 * sample)
        if len(raw) < 16:
            raise IndexError(f"the index ends before entry {sample + 1}")
        start, stop = struct.unpack("QQ", raw)
        return int(start), int(stop)

    def read(self, count: int, offset: int) -> bytes:
        from multistorageclient.types import Range

        count = max(0, min(count, self.size - offset))
        if count == 0:
            return b""
        return with_retries(lambda: self.path.fs.read(str(self.path.internal_path), byte_range=Range(offset=offset, size=count)),
                            attempts=self.settings.attempts, backoff_s=self.settings.backoff_s)

    def close(self) -> None:
        import os

        os.close(self.index_fd)


def remote_size(path: Any) -> int | None:
    """The object's size; None when it does not exist."""
    try:
        return int(retried(path.size))
    except FileNotFoundError:
        return None


def remote_unreadable(shard: Any, index: Path, count: int) -> tuple[str, str, int] | None:
    """As :func:`~mimo_pipes.data.sources.energon_checks._unreadable`, for a shard in object storage: missing, an index
    that does not match, or cut short (its size before the index's end; the first sample past it)."""
    import numpy as np

    size = remote_size(shard)
    if size is None:
        return bad_rows.MISSING_SHARD, f"the shard {shard} does not exist", 0
    try:
        offsets = np.frombuffer(index.read_bytes(), dtype=np.uint64)
    except OSError:
        return bad_rows.STALE_INDEX, f"the shard has no index ({index.name}): prepare the dataset again", 0
    if len(offsets) != count + 1:
        return bad_rows.STALE_INDEX, f"its index holds {len(offsets) - 1} samples but .info.json says {count}: prepare the dataset again", 0
    if int(offsets[-1]) <= size:
        return None
    cut = int(np.searchsorted(offsets[1:], size, side="right"))
    return bad_rows.TRUNCATED_SHARD, f"the shard ends at byte {size}, inside its sample {cut} (counting from 0): it is truncated", cut
