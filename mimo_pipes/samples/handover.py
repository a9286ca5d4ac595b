"""Processed samples handed from a worker process to the process that uses them through shared memory.

A sample made in a worker process (``processing="process"``: RowProcessor's pool, a ``ParallelMapper`` of
processes) crosses back pickled. Pickled as they are, its pixels would be copied into the pipe and out of it,
and torch's own reduction would pass one file descriptor per tensor over a socket: work on the receiving
process's one result thread, which is what stops worker processes from scaling past a few. Here every tensor
of the sample goes into ONE shared-memory segment, written by the worker, and what is pickled is the segment's
name and the tensors' places in it (a few hundred bytes). Unpickling maps the segment, removes its name at
once, and makes the sample's tensors views of the mapping: no copy on the receiving side, and the memory
goes back to the system with the last tensor that views it (a collated micro-batch copies them; the samples
then go). A segment whose sample is never unpickled (a worker that died mid-hand-over, a queue dropped at
shutdown) is named after the process it was made for; :func:`sweep` removes those, and runs at exit.

The worker side is :func:`for_caller`: processors call it on what they return, and it wraps the sample only
in a process other than the one that made the processor (a thread gets the plain sample; nothing is written).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import itertools
import math
import mmap
import os
import tempfile
import threading
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from mimo_pipes.samples.sample import Sample

if TYPE_CHECKING:
    from mimo_pipes.samples.segment_pool import SegmentPool

SEGMENT_PREFIX = "mimo-pipes-sample-"
ALIGN = 64  # every tensor starts on a cache line: views of any dtype are aligned
FOLDER = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()  # tmpfs on Linux: shm_open's own folder
_written = itertools.count()


def segment_names(owner: int, worker: int | None = None) -> list[str]:
    """The segments made for process ``owner`` (by worker process ``worker``) that are still named."""
    pattern = f"{SEGMENT_PREFIX}{owner}-{'*' if worker is None else worker}-*"
    return sorted(os.path.basename(path) for path in glob.glob(os.path.join(FOLDER, pattern)))


def sweep(owner: int, worker: int | None = None) -> int:
    """Remove the segments made for ``owner`` (by ``worker``) whose samples were never received; how many."""
    removed = 0
    for name in segment_names(owner, worker):
        try:
            os.unlink(os.path.join(FOLDER, name))
            removed += 1
        except FileNotFoundError:
            pass  # received in the meantime
    return removed


atexit.register(sweep, os.getpid())


class HandedOver(dict):
    """A processed sample made in a worker process for process ``owner``: a plain dict in the worker; pickled,
    its tensors travel in one shared-memory segment (see the module doc) and it unpickles as a plain dict."""

    def __init__(self, sample: Sample, owner: int) -> None:
        super().__init__(sample)
        self.owner = owner

    def __reduce__(self) -> tuple[Any, tuple]:
        try:
            return _received, _written_segment(self, self.owner)
        except OSError:  # no room in shared memory: pickled whole, as without it
            return dict, (dict(self),)


def for_caller(sample: Sample, owner: int) -> Sample:
    """``sample`` as a processor returns it: handed over through shared memory when this is a process other
    than ``owner`` (the one that made the processor), else as it is."""
    if os.getpid() == owner or isinstance(sample, HandedOver):
        return sample
    return HandedOver(sample, owner)


def _written_segment(sample: dict, owner: int) -> tuple:
    """Write ``sample``'s CPU tensors into a new segment; what :func:`_received` rebuilds the sample from."""
    places, size = [], 0
    for key, value in sample.items():
        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and not value.is_sparse:
            nbytes = value.numel() * value.element_size()
            places.append((key, value.dtype, tuple(value.shape), size, nbytes))
            size += -(-nbytes // ALIGN) * ALIGN
    rest = {key: value for key, value in sample.items() if not any(key == place[0] for place in places)}
    keys = list(sample)
    if size == 0:
        return None, 0, places, rest, keys
    name = f"{SEGMENT_PREFIX}{owner}-{os.getpid()}-{next(_written)}"
    path = os.path.join(FOLDER, name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)  # a full tmpfs fails here, as an error, not as SIGBUS on a write
        with mmap.mmap(fd, size) as mapped:
            buffer = torch.frombuffer(mapped, dtype=torch.uint8)
            for key, dtype, shape, offset, nbytes in places:
                if nbytes:
                    buffer[offset:offset + nbytes].view(dtype).view(shape).copy_(sample[key])
            del buffer  # the mapping closes only once nothing views it
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return name, size, places, rest, keys


def _received(name: str | None, size: int, places: list, rest: dict, keys: list) -> Sample:
    """The sample a worker wrote into segment ``name``: its tensors views of the mapped segment, whose name
    is removed here (the memory stays while a tensor views it)."""
    tensors: dict[str, torch.Tensor] = {}
    if name is not None:
        path = os.path.join(FOLDER, name)
        fd = os.open(path, os.O_RDWR)
        try:
            os.unlink(path)
            mapped = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        for key, dtype, shape, offset, nbytes in places:
            if nbytes:  # frombuffer keeps the mapping alive while the view lives
                tensors[key] = torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes, offset=offset).view(dtype).view(shape)
    for key, dtype, shape, _, nbytes in places:
        if not nbytes:
            tensors[key] = torch.empty(shape, dtype=dtype)
    return {key: tensors[key] if key in tensors else rest[key] for key in keys}


# ----------------------------------------------------------------------------------------------------
# Placement: a micro-batch's field written by the workers straight where collation finds it


class Placed(NamedTuple):
    """Where a worker writes one sample's rows of a field: segment ``name``, from byte ``offset``, ``shape`` and
    ``dtype`` as the sample's field must be to go there."""

    name: str
    offset: int
    shape: tuple[int, ...]
    dtype: torch.dtype


class Destination:
    """One micro-batch's field as one buffer in shared memory, made before its rows are processed (their row
    counts known from their counts): each worker writes its sample's rows into its slice (:func:`placed`), and the
    slices, in order, collate as the buffer itself, without a copy (:func:`~mimo_pipes.samples.collate.lend_rows`).
    From a ``pool`` (:class:`~mimo_pipes.samples.segment_pool.SegmentPool`) the buffer is a pooled segment, which
    keeps its name and goes back to the pool with the micro-batch; without one it is a fresh segment, whose name
    goes once every row's processing is over (:meth:`row_done`). A sample whose rows differ from its count keeps
    its own and is collated by copying."""

    def __init__(self, owner: int, counts: list[int], tail: tuple[int, ...], dtype: torch.dtype, pool: SegmentPool | None = None) -> None:
        from mimo_pipes.samples.collate import lend_rows

        row_bytes = math.prod(tail) * torch.empty((), dtype=dtype).element_size()
        numel, total = sum(counts) * math.prod(tail), sum(counts) * row_bytes
        self.pooled = pool is not None
        if pool is not None:
            segment, lent = pool.take(max(total, 1))
            self.name = segment.name
            flat = torch.from_numpy(lent[:total]).view(dtype) if numel else torch.empty(0, dtype=dtype)  # pooled again with the micro-batch
        else:
            self.name = f"{SEGMENT_PREFIX}{owner}-{os.getpid()}-{next(_written)}"
            mapped = sized_segment(self.name, max(total, 1))
            flat = torch.frombuffer(mapped, dtype=dtype, count=numel) if numel else torch.empty(0, dtype=dtype)
        # One flat tensor over the segment (what lend_rows is given: every slice's base), its rows as views of it.
        self.buffer = flat
        lend_rows(self.buffer)
        starts = list(itertools.accumulate(counts, initial=0))
        self.places = [Placed(self.name, start * row_bytes, (count, *tail), dtype) for start, count in zip(starts, counts)]
        width = math.prod(tail)
        self.rows = [self.buffer[start * width:(start + count) * width].view(count, *tail) for start, count in zip(starts, counts)]
        self._left = len(counts)
        self._lock = threading.Lock()

    def row_done(self, _: Any = None) -> None:
        """One row's processing is over (done, failed or cancelled); a fresh segment's name goes after the last."""
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last and not self.pooled:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(FOLDER, self.name))


def sized_segment(name: str, size: int) -> mmap.mmap:
    """A new segment ``name`` of ``size`` bytes, mapped; sized, not filled: each worker takes its own part's pages,
    in parallel (:func:`place_target`), none on this thread."""
    path = os.path.join(FOLDER, name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux: the row's page tables made in one call, not one fault a page


def place_target(place: Placed) -> np.ndarray | None:
    """In the worker: the row's slice of the micro-batch's buffer that ``place`` names, as a writable array of its
    shape and dtype (numpy's view of the bytes: bfloat16 as raw 16-bit words), its pages taken; None where shared
    memory has no room for them (the row then keeps its own pixels) or nothing is placed. Only the slice is
    mapped, and it is unmapped when the last view of the array is gone."""
    nbytes = math.prod(place.shape) * torch.empty((), dtype=place.dtype).element_size()
    if not nbytes:
        return None
    fd = os.open(os.path.join(FOLDER, place.name), os.O_RDWR)
    try:
        try:  # this part's pages taken here: a full tmpfs is an error to step aside from, not SIGBUS on a write
            os.posix_fallocate(fd, place.offset, nbytes)
        except OSError:
            return None
        start = place.offset - place.offset % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(fd, place.offset + nbytes - start, flags=mmap.MAP_SHARED | _POPULATE, offset=start)
    finally:
        os.close(fd)
    raw = np.frombuffer(mapped, dtype=np.uint8, count=nbytes, offset=place.offset - start)
    return raw.view(_NUMPY_WORDS[place.dtype]).reshape(place.shape) if place.dtype in _NUMPY_WORDS else raw


_NUMPY_WORDS = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.uint16, torch.float64: np.float64,
                torch.uint8: np.uint8, torch.int64: np.int64, torch.int32: np.int32}


def placed(sample: Sample, field: str, place: Placed | None, target: np.ndarray | None = None) -> Sample:
    """In the worker: ``sample``'s ``field`` written where ``place`` says and replaced by ``place`` (the rows
    are in the micro-batch's buffer), when it has exactly the shape and dtype counted; else ``sample`` as it is.
    ``target`` is the slice already mapped (:func:`place_target`), where the pixels may have been laid out in place."""
    value = sample.get(field)
    if place is None or not isinstance(value, torch.Tensor) or tuple(value.shape) != place.shape or value.dtype != place.dtype:
        return sample
    if value.numel():
        if target is None:
            target = place_target(place)
            if target is None:
                return sample
        destination = torch.from_numpy(target).view(torch.uint8).view(-1)
        if value.data_ptr() != destination.data_ptr():  # made elsewhere (not laid out in place): copied once
            destination.copy_(value.contiguous().reshape(-1).view(torch.uint8))
        del destination
    out = HandedOver(sample, sample.owner) if isinstance(sample, HandedOver) else dict(sample)
    out[field] = place
    return out


def received_rows(sample: Sample, field: str, rows: torch.Tensor) -> Sample:
    """In the receiving process: ``sample`` with its placed ``field`` as its rows of the micro-batch's buffer."""
    if isinstance(sample.get(field), Placed):
        sample[field] = rows
    return sample
