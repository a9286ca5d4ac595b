"""Parquet files in S3 as a map-style source that reads only what is asked of it: each file's footer once, then
the row groups that hold the rows a rank reads, each by one byte-range request, kept in a bounded cache.
Rows come out as :func:`~mimo_pipes.data.sources.open_source.read_rows` gives those of the same files on disk."""

from __future__ import annotations

import bisect
import io
import struct
from dataclasses import dataclass
from typing import Any

from mimo_pipes.data.storage.byte_cache import ByteBoundedCache
from mimo_pipes.data.storage.s3_store import S3Store

TAIL = 64 * 1024
"""Bytes read from a file's end to find its footer in one request (a larger footer costs a second)."""


@dataclass(frozen=True)
class ParquetPart:
    """One file: its URL, size, version tag, footer bytes (as they end the file) and rows per row group."""

    url: str
    size: int
    tag: str
    footer: bytes
    group_rows: tuple[int, ...]


class S3ParquetRows:
    """Rows of Parquet files in S3 (in the order of ``parts``, each file's row groups in order)."""

    def __init__(self, spec: str, parts: list[ParquetPart], client: S3Store) -> None:
        import datasets
        import pyarrow.parquet as pq

        from mimo_pipes.data.sources.open_source import encoded_image_features

        self.spec = spec
        self.parts = parts
        self.client = client
        self.cache: ByteBoundedCache[tuple[list[dict], int]] = ByteBoundedCache(client.settings.cache_bytes, lambda v: v[1])
        self._groups = [(p, g) for p in range(len(parts)) for g in range(len(parts[p].group_rows))]
        counts = [parts[p].group_rows[g] for p, g in self._groups]
        self._starts = [0]
        for count in counts:
            self._starts.append(self._starts[-1] + count)
        schema = pq.ParquetFile(_sparse_head(parts[0])).schema_arrow
        features = datasets.Features.from_arrow_schema(schema)
        self.features = features
        self._decode_features = encoded_image_features(features) or features
        self.column_names = list(features)
        # Nothing read: the files' names, sizes and version tags, equal on every rank.
        self._fingerprint = "s3:" + ",".join(f"{p.url}@{p.size}:{p.tag}" for p in parts)

    def __len__(self) -> int:
        return self._starts[-1]

    def __getstate__(self) -> dict:
        """A copy (worker processes under ``--skip-bad-samples``) takes its process's client and an empty cache."""
        state = dict(self.__dict__)
        state["client"], state["cache"] = None, None
        return state

    def __setstate__(self, state: dict) -> None:
        from mimo_pipes.data.storage.s3_store import store

        self.__dict__.update(state)
        self.client = store()
        self.cache = ByteBoundedCache(self.client.settings.cache_bytes, lambda v: v[1])

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} of {self.spec} (it has {len(self)})")
        group = bisect.bisect_right(self._starts, index) - 1
        rows, _ = self.cache.get(group, lambda: self._read_group(group))
        return dict(rows[index - self._starts[group]])

    def _read_group(self, group: int) -> tuple[list[dict], int]:
        """One row group, fetched by one range request over its column chunks, decoded by the files' features."""
        import pyarrow.parquet as pq

        part_index, number = self._groups[group]
        part = self.parts[part_index]
        meta = pq.ParquetFile(_sparse_head(part)).metadata.row_group(number)
        starts, ends = [], []
        for c in range(meta.num_columns):
            column = meta.column(c)
            first = column.data_page_offset
            if column.has_dictionary_page and column.dictionary_page_offset is not None and column.dictionary_page_offset > 0:
                first = min(first, column.dictionary_page_offset)
            starts.append(first)
            ends.append(first + column.total_compressed_size)
        lo, hi = min(starts), max(ends)
        body = self.client.read(part.url, lo, hi)
        table = pq.ParquetFile(SparseFile(part.size, {lo: body, part.size - len(part.footer): part.footer})).read_row_group(number)
        columns = self._decode_features.decode_batch(table.to_pydict())
        rows = [dict(zip(columns, values)) for values in zip(*columns.values())]
        return rows, table.nbytes


def _sparse_head(part: ParquetPart) -> SparseFile:
    """Enough of a file for pyarrow to read its footer: the magic, then the footer where the file ends."""
    return SparseFile(part.size, {0: b"PAR1", part.size - len(part.footer): part.footer})


def read_footer(client: S3Store, url: str, size: int) -> bytes:
    """The last bytes of a Parquet file that hold its footer (metadata, its length, the magic)."""
    tail = client.read(url, max(0, size - TAIL), size)
    if len(tail) < 8 or tail[-4:] != b"PAR1":
        raise ValueError("not a Parquet file (no PAR1 at its end)")
    length = struct.unpack("<I", tail[-8:-4])[0] + 8
    if length > len(tail):
        tail = client.read(url, size - length, size)
    return tail[-length:]


def group_rows(footer: bytes, size: int) -> tuple[int, ...]:
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(SparseFile(size, {0: b"PAR1", size - len(footer): footer})).metadata
    return tuple(meta.row_group(g).num_rows for g in range(meta.num_row_groups))


class SparseFile(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only ``pieces`` (offset -> bytes) are known; the rest reads as
    zeros. pyarrow reads a row group's column chunks and the footer from it, which are the pieces fetched."""

    def __init__(self, size: int, pieces: dict[int, bytes]) -> None:
        self.size = size
        self.pieces = sorted(pieces.items())
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        count = max(0, min(len(view), self.size - self.position))
        view[:count] = b"\x00" * count
        for start, data in self.pieces:
            lo, hi = max(start, self.position), min(start + len(data), self.position + count)
            if lo < hi:
                view[lo - self.position: hi - self.position] = data[lo - start: hi - start]
        self.position += count
        return count
