"""A ``--dataset`` in S3 (``s3://bucket/key``): Parquet files and globs of them read in place, row group by row group
(:mod:`~mimo_pipes.data.sources.s3_parquet`); JSON, JSON-lines and LLaVA annotation files, and ``save_to_disk``
folders, copied once into the local cache (they are the index of the data, read whole by every run anyway) and
opened as the same files on disk are. Images under an S3 image folder are fetched per row
(:mod:`~mimo_pipes.data.storage.s3_images`). Every failure to reach the data is one ``--dataset`` line naming the URL."""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Callable
from pathlib import Path

from mimo_pipes.data.storage.disk_copies import ARROW, bounded_copy, trim
from mimo_pipes.data.storage.s3_settings import settings_from_env
from mimo_pipes.data.storage.s3_store import S3Store, StorageError, store
from mimo_pipes.data.storage.s3_url import bucket_and_key, suffix
from mimo_pipes.errors import ConfigError

FILE_KINDS = {".parquet": "parquet", ".json": "json", ".jsonl": "json"}
HINT = "pass s3:// .parquet / .json / .jsonl files or a glob of them, or a save_to_disk folder"
SAVED_MARKERS = (("dataset_info.json", "state.json"), ("dataset_dict.json",))


def s3_files(spec: str, setting: str = "--dataset") -> tuple[str, list[dict]]:
    """The builder (parquet or json) and the objects (s3fs info: name, size, ETag) a file URL or glob names, sorted."""
    import glob as globbing

    client = store()
    try:
        if globbing.has_magic(bucket_and_key(spec)[1]):
            objects = [client.info(url) for url in client.glob(spec)]
        else:
            objects = [client.info(spec)]
    except StorageError as error:
        raise ConfigError(setting, f"{error.url}: {error.reason}") from None
    objects = [o for o in objects if o.get("type", "file") == "file"]
    if not objects:
        raise ConfigError(setting, f"{spec!r} matches no object; {HINT}")
    kinds = {suffix(o["name"]) for o in objects}
    builders = {FILE_KINDS.get(k) for k in kinds}
    if None in builders or len(builders) != 1:
        raise ConfigError(setting, f"{spec!r} holds objects of kind {sorted(kinds)}; {HINT} (one kind at a time)")
    return builders.pop(), sorted(objects, key=lambda o: o["name"])


def saved_folder_kind(spec: str) -> bool:
    """Whether ``spec`` is a folder written by ``save_to_disk`` (ConfigError naming the URL when it cannot be listed)."""
    client = store()
    base = spec.rstrip("/")
    try:
        names = {posixpath.basename(url) for url in client.glob(base + "/*")}
    except StorageError as error:
        raise ConfigError("--dataset", f"{error.url}: {error.reason}") from None
    if ".nv-meta" in names:  # an Energon dataset is found before (energon_source.is_energon): this one lacks dataset.yaml
        raise ConfigError("--dataset", f"{spec}: an Energon dataset that was not prepared to the end (its .nv-meta/ has no dataset.yaml)")
    if not names:
        raise ConfigError("--dataset", f"{spec}: no such key or folder; {HINT}")
    return any(set(marker) <= names for marker in SAVED_MARKERS)


def is_file_spec(spec: str) -> bool:
    import glob as globbing

    key = bucket_and_key(spec)[1]
    return globbing.has_magic(key) or suffix(spec) in FILE_KINDS


def check_s3_source(spec: str) -> None:
    """ConfigError (one line naming the URL) unless ``spec`` names readable S3 data: nothing but listings is read."""
    if is_file_spec(spec):
        s3_files(spec)
    elif not saved_folder_kind(spec):
        raise ConfigError("--dataset", f"{spec!r} was not written by save_to_disk; {HINT}")


def check_s3_folder(url: str, setting: str) -> None:
    """ConfigError naming ``url`` when the bucket cannot be reached or nothing is stored under the folder."""
    try:
        found = store().glob(url.rstrip("/") + "/*")
    except StorageError as error:
        raise ConfigError(setting, f"{error.url}: {error.reason}") from None
    if not found:
        raise ConfigError(setting, f"{url}: no object under this folder")


def open_s3_parquet(spec: str):
    """Parquet objects as :class:`~mimo_pipes.data.sources.s3_parquet.S3ParquetRows`: footers read now, rows when asked."""
    from mimo_pipes.data.sources.s3_parquet import ParquetPart, S3ParquetRows, group_rows, read_footer

    _, objects = s3_files(spec)
    client = store()
    parts = []
    for info in objects:
        url = "s3://" + info["name"]
        try:
            footer = read_footer(client, url, int(info["size"]))
            parts.append(ParquetPart(url, int(info["size"]), str(info.get("ETag", "")), footer, group_rows(footer, int(info["size"]))))
        except StorageError as error:
            raise ConfigError("--dataset", f"{error.url}: {error.reason}") from None
        except Exception as error:  # noqa: BLE001 - a file that is not Parquet names itself
            raise ConfigError("--dataset", f"{url} cannot be read as Parquet: {' '.join(str(error).split())}") from None
    return S3ParquetRows(spec, parts, client)


def local_copy(spec: str) -> tuple[str, str]:
    """JSON files or a ``save_to_disk`` folder copied once into the local cache (per object version): the local
    spec to open in its place, and a fingerprint of the objects (names, sizes, versions)."""
    client = store()
    if is_file_spec(spec):
        _, objects = s3_files(spec)
        names = [(o, f"{k:05d}-{posixpath.basename(o['name'])}") for k, o in enumerate(objects)]
    else:
        if not saved_folder_kind(spec):
            raise ConfigError("--dataset", f"{spec!r} was not written by save_to_disk; {HINT}")
        base = bucket_and_key(spec.rstrip("/"))
        prefix = f"{base[0]}/{base[1]}/"
        try:
            objects = [client.info(url) for url in client.listing(spec.rstrip("/"))]
        except StorageError as error:
            raise ConfigError("--dataset", f"{error.url}: {error.reason}") from None
        names = [(o, o["name"][len(prefix):]) for o in objects]
    fingerprint = "s3:" + ",".join(f"{o['name']}@{o['size']}:{o.get('ETag', '')}" for o, _ in names)
    name = hashlib.sha256(fingerprint.encode()).hexdigest()[:24]
    folder = bounded_copy(name, sum(int(o["size"]) for o, _ in names), _downloader(client, names), spec)
    local = str(folder / "*") if is_file_spec(spec) else str(folder)
    return local, fingerprint


def copied_names(spec: str) -> dict[str, str]:
    """Each local copy of ``spec``'s JSON files (as :func:`local_copy` names them) -> its ``s3://`` URL."""
    local, _ = local_copy(spec)
    folder = Path(local).parent
    _, objects = s3_files(spec)
    return {str(folder / f"{k:05d}-{posixpath.basename(o['name'])}"): "s3://" + o["name"] for k, o in enumerate(objects)}


def _downloader(client: S3Store, names: list[tuple[dict, str]]) -> Callable[[Path], None]:
    """Copies the objects into a folder, with a progress bar on a terminal (the first process of a node copies them;
    the others find the copy made)."""

    def download(into: Path) -> None:
        import sys

        from tqdm import tqdm

        total = sum(int(info["size"]) for info, _ in names)
        with tqdm(total=total, unit="B", unit_scale=True, desc="copying from S3", file=sys.stderr, disable=not sys.stderr.isatty()) as bar:
            for info, name in names:
                target = into / name
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    target.write_bytes(client.read("s3://" + info["name"]))
                except StorageError as error:
                    raise ConfigError("--dataset", f"{error.url}: {error.reason}") from None
                bar.update(int(info["size"]))

    return download


def open_s3_source(spec: str, open_local: Callable[..., object]):
    """``spec``'s rows: Parquet read in place, anything else opened by ``open_local(local, arrow_cache=...)`` from
    its local copy (JSON files converted to Arrow inside the copy, so that the copies' bound covers them)."""
    if is_file_spec(spec) and s3_files(spec)[0] == "parquet":
        return open_s3_parquet(spec)
    local, fingerprint = local_copy(spec)
    folder = Path(local).parent if is_file_spec(spec) else Path(local)
    dataset = open_local(local, arrow_cache=folder / ARROW)
    trim(settings_from_env().disk_bytes, keep=folder)  # the conversion made the copy larger
    dataset._fingerprint = fingerprint  # the objects' versions, not the copy's place or time: equal on every node
    return dataset
