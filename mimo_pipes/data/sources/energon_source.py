"""A prepared Megatron-Energon dataset as a map-style source: sample ``k`` of a split part (``train``
unless ``--split-part`` names another) is the ``k``-th when that part's shards are taken in the order
``.nv-meta/split.yaml`` lists them and each shard's samples in their order in the tar, so a dataset and a
LLaVA list written from it agree row for row. What ``.nv-meta/`` holds is read by
:mod:`~mimo_pipes.data.sources.energon_meta`, which names a missing piece.

Sample ``j`` of a shard is read through Energon's own index of it (``<shard>.tar.idx``, the byte offset
of every sample and of the shard's end, written by ``energon prepare``): one read of the sample's bytes,
whose tar members are split into its parts; images stay encoded (see
:mod:`~mimo_pipes.data.sources.energon_samples` for how parts become a conversation). At most
:data:`OPEN_SHARDS` shards are open at a time (two files each: the tar and its index), the least
recently read closed first, however many shards the dataset has.

A shard that cannot be read whole is found once before any rank starts
(:mod:`~mimo_pipes.data.sources.energon_checks`). A sample that cannot be read all the same (its shard gone since,
an index that no longer matches its shard) or that makes no conversation is handed on as a row that fails
when processed (:data:`~mimo_pipes.data.bad_rows.ROW_FAULT`), its reason naming the shard and the sample's
key: a run stops on it with that line, ``--skip-bad-samples`` replaces it, ``mimo-pipes check`` lists it.
Every row carries its place (``<shard> key <key>``, :data:`~mimo_pipes.data.bad_rows.ROW_PLACE`), so
whatever reason a later step gives for it names the sample too.
"""

from __future__ import annotations

import bisect
import io
import os
import struct
import tarfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from mimo_pipes.data import bad_rows
from mimo_pipes.data.sources.energon_meta import META, read_split, read_yaml, unprepared
from mimo_pipes.data.sources.energon_samples import SampleKind, UnfitSample, sample_kind, sample_row
from mimo_pipes.errors import ConfigError

EXTRA = 'reading Energon datasets needs megatron-energon: pip install "mimo-pipes[energon]"'
OPEN_SHARDS = 32
"""Shards kept open at once (two file handles each)."""


def energon():
    """The ``megatron.energon`` module; ConfigError naming the extra when it is not installed."""
    try:
        import megatron.energon as module
    except ImportError as error:
        raise ConfigError("--dataset", f"{EXTRA} ({error})") from None
    return module


def is_energon(spec: str | Path) -> bool:
    """Whether ``spec`` names an Energon dataset (a folder with ``.nv-meta/``) or metadataset (a YAML file)."""
    from mimo_pipes.data.sources.energon_remote import is_remote, is_remote_energon

    if is_remote(spec):
        return is_remote_energon(str(spec))
    path = Path(spec).expanduser()
    if path.is_dir():
        return (path / META).is_dir()
    return path.suffix.lower() in (".yaml", ".yml") and path.is_file()


def check_split(spec: str | Path | None, split: str) -> None:
    """A split other than ``train`` is read from Energon datasets and metadatasets only: ConfigError otherwise."""
    if split != "train" and (spec is None or not is_energon(spec)):
        not_prepared = None if spec is None else unprepared(Path(spec).expanduser())
        if not_prepared is not None:
            raise ConfigError("--dataset", not_prepared)
        named = "the embedded synthetic dataset" if spec is None else f"--dataset {spec}"
        raise ConfigError("--split-part", f"{split!r} is a split of a Megatron-Energon dataset or metadataset; {named} is not one "
                                          "(it is read whole, as train)")


class ShardFault(Exception):
    """A sample that cannot be read from its shard: ``kind`` (a bad_rows phrase) and why."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


@dataclass
class _OpenShard:
    fd: int
    index_fd: int  # the shard's .tar.idx: one native uint64 byte offset per sample, then the shard's end
    size: int

    def read(self, count: int, offset: int) -> bytes:
        return os.pread(self.fd, count, offset)

    def span(self, sample: int) -> tuple[int, int]:
        raw = os.pread(self.index_fd, 16, 8 * sample)
        if len(raw) < 16:
            raise IndexError(f"the index ends before entry {sample + 1}")
        start, stop = _SPAN.unpack(raw)
        return int(start), int(stop)

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.index_fd)


_SPAN = struct.Struct("QQ")  # as Energon's TarIndexWriter packs them


class EnergonDataset:
    """One prepared dataset's ``split`` part: ``len``, and ``dataset[k]`` -> the row of sample ``k``.
    Safe to read from several threads; picklable (a copy opens its own files)."""

    def __init__(self, path: str | Path, split: str = "train", *, open_shards: int = OPEN_SHARDS) -> None:
        energon()
        from mimo_pipes.data.sources.energon_remote import is_remote, local_meta

        # In object storage: the metadata and indexes copied locally; the shards read where they are.
        self.remote = str(path).rstrip("/") if is_remote(path) else None
        self.path = local_meta(str(path)) if self.remote else Path(path).expanduser()
        self.split = split
        self.open_shards = max(1, open_shards)
        where = f"{str(path)!r}"
        meta = read_split(self.path, split)
        if meta.sample_excludes:
            raise ConfigError("--dataset", f"{where}: split.yaml excludes single samples ({sorted(meta.sample_excludes)[0]}, ...); "
                              "mimo-pipes reads whole shards only: exclude shards, or prepare the dataset without them")
        self.config_file = self.path / META / "dataset.yaml"
        config = read_yaml(self.config_file, "the sample type and field_map")
        self.kind: SampleKind = sample_kind(config if isinstance(config, dict) else {}, str(self.config_file))
        self.shards, self.counts = meta.shards, meta.counts
        self.starts = [0]
        for count in self.counts:
            self.starts.append(self.starts[-1] + count)
        self.info_ids = {name: k for k, name in enumerate(meta.info_names)}  # how the sqlite index numbers the shards
        if self.starts[-1] == 0:
            raise ConfigError("--dataset", f"{where} has no samples in its {split!r} split")
        self._open: OrderedDict[int, _OpenShard] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.starts[-1]

    def locate(self, index: int) -> tuple[int, int]:
        """(shard, sample within it) of global sample ``index``."""
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} of a dataset of {len(self)}")
        shard = bisect.bisect_right(self.starts, index) - 1
        return shard, index - self.starts[shard]

    def __getitem__(self, index: int) -> dict:
        shard, sample = self.locate(int(index))
        name = self.shards[shard]
        try:
            key, parts = self.read(shard, sample)
        except ShardFault as fault:
            place = f"{name} key {self.key(shard, sample)}"
            return {bad_rows.ROW_FAULT: {"kind": fault.kind, "reason": f"{place}: {fault.reason}"}, bad_rows.ROW_PLACE: place}
        try:
            row = sample_row(self.kind, parts, name, key)
        except UnfitSample as unfit:
            row = {bad_rows.ROW_FAULT: {"kind": bad_rows.UNFIT_SAMPLE, "reason": f"{name} key {key}: {unfit}"}}
        row[bad_rows.ROW_PLACE] = f"{name} key {key}"  # every reason a later step gives names it (bad_rows.placed)
        return row

    # ------------------------------------------------------------------------------------------------
    # Reading

    def read(self, shard: int, sample: int, *, every_part: bool = False) -> tuple[str, dict[str, bytes]]:
        """(key, {part: bytes}) of sample ``sample`` of shard ``shard`` (the parts its kind reads, or with
        ``every_part`` all); ShardFault when it cannot be read."""
        with self._lock:  # the LRU: no handle closed while read
            handle = self._handle(shard)
            try:
                start, stop = handle.span(sample)
            except (IndexError, OSError) as error:
                raise ShardFault(bad_rows.STALE_INDEX, f"its index has no entry for sample {sample} ({error})") from None
            if stop > handle.size:
                head = handle.read(512, start) if start < handle.size else b""
                if head and not is_header(head):  # the index points into other bytes: not a cut, a change
                    raise ShardFault(bad_rows.STALE_INDEX, f"its index points at no tar member (byte {start}) and past the shard's "
                                     f"end ({handle.size} bytes): the shard changed after energon prepare; prepare the dataset again")
                raise ShardFault(bad_rows.TRUNCATED_SHARD, f"the shard ends at byte {handle.size}, before this sample's end at "
                                 f"byte {stop}: it is truncated")
            if stop <= start:
                raise ShardFault(bad_rows.STALE_INDEX, f"its index gives the sample no bytes ({start}..{stop}): prepare the dataset again")
            data = handle.read(stop - start, start)
        if len(data) < stop - start:
            raise ShardFault(bad_rows.TRUNCATED_SHARD, f"read {len(data)} of the sample's {stop - start} bytes: the shard is truncated")
        return members(data, None if every_part else self.kind.parts)

    def _handle(self, shard: int) -> _OpenShard:
        handle = self._open.get(shard)
        if handle is not None:
            self._open.move_to_end(shard)
            return handle
        handle = self._opened(shard)
        self._open[shard] = handle
        while len(self._open) > self.open_shards:
            self._open.popitem(last=False)[1].close()
        return handle

    def _opened(self, shard: int) -> _OpenShard:
        from megatron.energon.flavors.webdataset.itar import ITAR_SUFFIX

        if self.remote:
            return self._opened_remote(shard)
        path = self.path / self.shards[shard]
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise ShardFault(bad_rows.MISSING_SHARD, f"the shard {path} does not exist") from None
        except OSError as error:
            raise ShardFault(bad_rows.MISSING_SHARD, f"the shard {path} cannot be opened ({error.strerror})") from None
        index_path = path.with_suffix(ITAR_SUFFIX)
        try:
            index_fd = os.open(index_path, os.O_RDONLY)
        except OSError:
            os.close(fd)
            raise ShardFault(bad_rows.STALE_INDEX, f"the shard has no index ({index_path.name}): prepare the dataset again") from None
        entries = os.fstat(index_fd).st_size // 8
        if entries != self.counts[shard] + 1:
            os.close(fd)
            os.close(index_fd)
            raise ShardFault(bad_rows.STALE_INDEX, f"its index holds {entries - 1} samples but .info.json says {self.counts[shard]}: "
                             "prepare the dataset again")
        return _OpenShard(fd, index_fd, os.fstat(fd).st_size)

    def _opened_remote(self, shard: int):
        from megatron.energon.flavors.webdataset.itar import ITAR_SUFFIX

        from mimo_pipes.data.sources.energon_remote import RemoteShard, epath, remote_size

        path = epath(self.remote) / self.shards[shard]
        size = remote_size(path)
        if size is None:
            raise ShardFault(bad_rows.MISSING_SHARD, f"the shard {path} does not exist")
        index = (self.path / self.shards[shard]).with_suffix(ITAR_SUFFIX)
        try:
            index_fd = os.open(index, os.O_RDONLY)
        except OSError:
            raise ShardFault(bad_rows.STALE_INDEX, f"the shard has no index ({index.name}): prepare the dataset again") from None
        return RemoteShard(path, index_fd, size)

    def close(self) -> None:
        with self._lock:
            while self._open:
                self._open.popitem()[1].close()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_open"], state["_lock"] = OrderedDict(), None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ------------------------------------------------------------------------------------------------
    # Names

    def key(self, shard: int, sample: int) -> str:
        """The sample's key as Energon's sqlite index records it (``sample N`` when it cannot be read)."""
        return self.keys(shard, [sample]).get(sample, f"sample {sample}")

    def keys(self, shard: int, samples: list[int]) -> dict[int, str]:
        from megatron.energon.epathlib import EPath
        from megatron.energon.flavors.webdataset.indexing import SqliteIndexReader

        tar_id = self.info_ids.get(self.shards[shard])
        found: dict[int, str] = {}
        try:
            reader = SqliteIndexReader(EPath(self.path / META / "index.sqlite"))
            try:
                for sample in samples:
                    row = reader.db.select_one("SELECT sample_key FROM samples WHERE tar_file_id = ? AND sample_index = ?", (tar_id, sample))
                    if row is not None:
                        found[sample] = str(row[0])
            finally:
                reader.close()
        except Exception:  # noqa: BLE001 - no index to name it by: the caller says "sample N"
            pass
        return found

    def places(self, rows: list[int]) -> dict[int, tuple[tuple[int, int], str]]:
        """Each dataset row's place, ``(order, "shard key K (dataset row N)")``, for reports."""
        by_shard: dict[int, list[int]] = {}
        for row in rows:
            by_shard.setdefault(self.locate(row)[0], []).append(row)
        found = {}
        for shard, members_of in by_shard.items():
            samples = [row - self.starts[shard] for row in members_of]
            names = self.keys(shard, samples)
            for row, sample in zip(members_of, samples):
                found[row] = ((shard, sample), f"{self.shards[shard]} key {names.get(sample, f'sample {sample}')} (dataset row {row})")
        return found


def is_header(block: bytes) -> bool:
    try:
        tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError:
        return False
    return True


def members(data: bytes, wanted: frozenset[str] | None) -> tuple[str, dict[str, bytes]]:
    """(key, {part: bytes}) of one sample's tar members (``wanted``: the parts to keep, None for all), as
    Energon names them: ``<key>.<part>``, the key up to the first dot of the file name. ShardFault when the
    bytes are not one sample's members (the index no longer matches the shard)."""
    from megatron.energon.flavors.webdataset.config import skip_meta_re, split_name_re

    key: str | None = None
    parts: dict[str, bytes] = {}
    try:
        with tarfile.TarFile(fileobj=io.BytesIO(data), mode="r") as tar:
            for info in tar:
                if not info.isfile() or skip_meta_re.match(info.name):
                    continue
                match = split_name_re.match(info.name)
                if match is None:
                    continue
                base, part = match.groups()
                if key is None:
                    key = base
                elif base != key:
                    raise ShardFault(bad_rows.STALE_INDEX, f"its bytes hold members of two samples ({key!r} and {base!r}): "
                                     "the index no longer matches the shard; prepare the dataset again")
                if info.offset_data + info.size > len(data):
                    raise ShardFault(bad_rows.STALE_INDEX, f"member {info.name!r} runs past the sample's end in the index: "
                                     "the index no longer matches the shard; prepare the dataset again")
                if wanted is None or part in wanted:
                    parts[part] = data[info.offset_data : info.offset_data + info.size]
    except tarfile.TarError as error:
        raise ShardFault(bad_rows.STALE_INDEX, f"its index points at no tar member ({error}): the shard changed after "
                         "energon prepare; prepare the dataset again") from None
    if key is None:
        raise ShardFault(bad_rows.STALE_INDEX, "its index points at no sample file: prepare the dataset again")
    return key, parts
