"""Sample packing: a sample dict <-> a flat run of bytes, for the exchange node's ragged all-to-all.

No pickle: pickle of bytes that came from another process is unsafe and slow. The encoding below is
small and closed: it can only produce the value kinds listed here.

Supported values
----------------
* ``torch.Tensor`` of every dtype torch has except the quantized ones (bool, all int/uint widths incl.
  the sub-byte placeholder dtypes, float16/32/64, bfloat16, every float8/float4 variant, complex32/64/128,
  bits*), any shape (0-d and zero-size included), any strides (non-contiguous tensors are copied
  contiguously straight into the output). Values round-trip bitwise (NaN payloads included).
* ``numpy.ndarray`` (plain ``ndarray`` only) and numpy scalars, of kinds bool/int/uint/float/complex,
  byte order kept. They come back as numpy, not as torch.
* ``None``, ``bool``, ``int`` (any size), ``float`` (bitwise), ``str``, ``bytes``, ``bytearray``, and
  ``list`` / ``tuple`` / ``dict`` (``str`` keys, order kept) of all the above, nested. Types are exact:
  a tuple stays a tuple, a bool stays a bool. Subclasses (``OrderedDict``, named tuples, ``IntEnum``)
  are refused rather than silently turned into their base type. Nesting depth is bounded by the Python
  recursion limit.

Refused, with :class:`~mimo_pipes.errors.SampleError` naming the sample id and the field path
(``pixel_values``, ``meta.boxes[3]``): tensors that require grad, tensors that are not on the CPU,
sparse / quantized / nested tensors, tensor subclasses (``nn.Parameter`` ...), numpy arrays of other
kinds (object, str, structured, datetime), any other object, and dict keys that are not ``str``.
Refusing rather than converting (``detach()``, ``.cpu()``) keeps samples that stay on their rank (never
packed) and samples that move identical in kind. :func:`encoded_size` performs the full check without
copying any data, so calling it on every sample of a window validates samples that stay local too.

Format (all integers little-endian)
-----------------------------------
A record is::

    header   32 bytes: magic b"MPSM", u16 version (1), u16 flags (0), u64 record size,
             u64 meta size, u32 blob count, u32 reserved (0)
    meta     the value tree, tag-encoded (below), starting at byte 32
    blobs    raw data of tensors, arrays and bytes, each at an offset (from the record start) that is a
             multiple of 16; the record is padded to a multiple of 16 bytes

Meta tags (one byte each, then the payload)::

    0x00 None   0x01 False   0x02 True
    0x03 int    i64                       0x04 big int  u32 n, n bytes two's complement
    0x05 float  f64 (bit pattern)         0x06 str      u32 n, n bytes UTF-8 (surrogates kept)
    0x07 bytes  u64 n, u64 blob offset    0x08 bytearray (as bytes)
    0x09 list   u32 count, items          0x0A tuple    u32 count, items
    0x0B dict   u32 count, (u32 n, key UTF-8, value) per entry
    0x0C tensor u8 dtype code, u8 ndim, ndim x u64 dims, u64 blob offset
    0x0D numpy array   u8 n, n bytes dtype string (e.g. "<f4"), u8 ndim, ndim x u64 dims, u64 offset
    0x0E numpy scalar  as 0x0D with ndim 0

Records are self-delimiting, so records written back to back (as :func:`encode_samples` does) are read
back with :func:`decode_samples`.

Aliasing
--------
By default :func:`decode_sample` builds tensors and arrays as zero-copy views over the buffer it is
given (when the buffer is writable and the data suitably aligned): they share memory with it and keep
the whole buffer alive. Pass ``copy=True`` to get independent storage (worth it when a few samples of a
large receive buffer are kept for long). Read-only buffers (``bytes``) are always copied from.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from mimo_pipes.errors import SampleError
from mimo_pipes.samples.sample import SAMPLE_ID

__all__ = [
    "ALIGN",
    "FORMAT_VERSION",
    "MAGIC",
    "SampleLayout",
    "layout_sample",
    "packed_size",
    "pack_into",
    "pack_sample",
    "pack_samples",
    "unpack_sample",
    "unpack_samples",
    "supported_torch_dtypes",
]

MAGIC = b"MPSM"
FORMAT_VERSION = 1
ALIGN = 16
"""Blob offsets and record sizes are multiples of this many bytes."""

_HEADER = struct.Struct("<4sHHQQII")
HEADER_SIZE = _HEADER.size  # 32

# Stable dtype codes: the byte in the stream never depends on the torch version. Names missing from the
# installed torch are skipped; quantized dtypes are not listed (quantized tensors are refused).
_DTYPE_CODES: dict[str, int] = {
    "bool": 1,
    "uint8": 2,
    "int8": 3,
    "int16": 4,
    "int32": 5,
    "int64": 6,
    "uint16": 7,
    "uint32": 8,
    "uint64": 9,
    "float16": 10,
    "bfloat16": 11,
    "float32": 12,
    "float64": 13,
    "complex32": 14,
    "complex64": 15,
    "complex128": 16,
    "float8_e4m3fn": 17,
    "float8_e5m2": 18,
    "float8_e4m3fnuz": 19,
    "float8_e5m2fnuz": 20,
    "float8_e8m0fnu": 21,
    "float4_e2m1fn_x2": 22,
    "bits8": 23,
    "bits16": 24,
    "bits1x8": 25,
    "bits2x4": 26,
    "bits4x2": 27,
    **{f"uint{b}": 27 + b for b in range(1, 8)},  # 28..34
    **{f"int{b}": 34 + b for b in range(1, 8)},  # 35..41
}

_CODE_OF_DTYPE: dict[torch.dtype, int] = {}
_DTYPE_OF_CODE: dict[int, torch.dtype] = {}
for _name, _code in _DTYPE_CODES.items():
    _dt = getattr(torch, _name, None)
    if isinstance(_dt, torch.dtype):
        _CODE_OF_DTYPE[_dt] = _code
        _DTYPE_OF_CODE[_code] = _dt

# A dtype of the same item size that copy_ handles for every strided layout (bitwise, no arithmetic).
_CARRIER = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

_NP_KINDS = frozenset("biufc")
_NP_DTYPE_RE = re.compile(r"^[<>|=][biufc][0-9]{1,2}$")

_T_NONE, _T_FALSE, _T_TRUE = 0x00, 0x01, 0x02
_T_INT, _T_BIGINT, _T_FLOAT, _T_STR = 0x03, 0x04, 0x05, 0x06
_T_BYTES, _T_BYTEARRAY = 0x07, 0x08
_T_LIST, _T_TUPLE, _T_DICT = 0x09, 0x0A, 0x0B
_T_TENSOR, _T_NDARRAY, _T_NPSCALAR = 0x0C, 0x0D, 0x0E

_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_U32_MAX = (1 << 32) - 1

_u8 = struct.Struct("<B")
_u32 = struct.Struct("<I")
_u64 = struct.Struct("<Q")
_i64 = struct.Struct("<q")
_f64 = struct.Struct("<d")
_tag_u32 = struct.Struct("<BI")
_tag_i64 = struct.Struct("<Bq")
_tag_f64 = struct.Struct("<Bd")


def supported_torch_dtypes() -> list[torch.dtype]:
    """The torch dtypes this installation can pack, in code order."""
    return [_DTYPE_OF_CODE[c] for c in sorted(_DTYPE_OF_CODE)]


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# --------------------------------------------------------------------------------------------------
# Layout (validation + sizes, no data copied)


class SampleEncoding:
    """A validated sample, measured: ``size`` bytes once packed. ``write_into`` packs it.

    Holds references to the sample's tensors/arrays; build it right before writing. Computing a layout
    copies no tensor data (only the small meta: keys, strings, numbers)."""

    __slots__ = ("size", "_meta", "_blobs")

    def __init__(self, size: int, meta: bytes, blobs: list[tuple[int, int, Any]]) -> None:
        self.size = size
        self._meta = meta
        self._blobs = blobs  # (offset from record start, nbytes, source)

    def write_into(self, out: Any, offset: int = 0) -> int:
        """Write the record at ``out[offset : offset + size]``; return ``offset + size``.

        ``out`` is a writable uint8 buffer: ``torch.Tensor`` (CPU, uint8, contiguous), ``np.ndarray``
        (uint8, contiguous), ``bytearray`` or a writable ``memoryview``. Place records at offsets that
        are multiples of :data:`ALIGN` so that unpacking can hand out aligned zero-copy views."""
        arr, readonly = _as_u8_array(out, what="out")
        if readonly:
            raise ValueError("pack output buffer is read-only")
        if offset < 0 or offset + self.size > arr.shape[0]:
            raise ValueError(
                f"pack output buffer too small: need bytes [{offset}, {offset + self.size}), "
                f"buffer has {arr.shape[0]}"
            )
        meta = self._meta
        head_end = HEADER_SIZE + len(meta)
        data_start = _align(head_end)
        head = bytearray(data_start)
        _HEADER.pack_into(head, 0, MAGIC, FORMAT_VERSION, 0, self.size, len(meta), len(self._blobs), 0)
        head[HEADER_SIZE:head_end] = meta
        arr[offset : offset + data_start] = np.frombuffer(head, dtype=np.uint8)
        pos = data_start
        for blob_off, nbytes, src in self._blobs:
            if blob_off > pos:  # alignment padding: zero it, never leak old buffer contents
                arr[offset + pos : offset + blob_off] = 0
            dst = arr[offset + blob_off : offset + blob_off + nbytes]
            if nbytes:
                _copy_blob(src, dst)
            pos = blob_off + nbytes
        if self.size > pos:
            arr[offset + pos : offset + self.size] = 0
        return offset + self.size


def _copy_blob(src: Any, dst: np.ndarray) -> None:
    if isinstance(src, torch.Tensor):
        carrier = _CARRIER.get(src.dtype.itemsize, src.dtype)
        d = torch.from_numpy(dst)
        if carrier is not torch.uint8:
            d = d.view(carrier)
        d = d.view(src.shape)
        s = src if carrier is src.dtype else src.view(carrier)
        d.copy_(s)
    elif isinstance(src, np.ndarray):
        np.copyto(dst.view(src.dtype).reshape(src.shape), src, casting="no")
    else:  # bytes / bytearray
        dst[:] = np.frombuffer(src, dtype=np.uint8)


class _Encoder:
    __slots__ = ("meta", "blobs", "fixups", "sample_id")

    def __init__(self, sample_id: object) -> None:
        self.meta = bytearray()
        self.blobs: list[tuple[int, Any]] = []  # (nbytes, source)
        self.fixups: list[int] = []  # meta positions of u64 blob offsets, same order as blobs
        self.sample_id = sample_id

    def fail(self, path: str, message: str) -> SampleError:
        return SampleError(self.sample_id, message, field=path or None)

    def blob(self, nbytes: int, src: Any) -> None:
        self.fixups.append(len(self.meta))
        self.meta += b"\0" * 8
        self.blobs.append((nbytes, src))

    def text(self, s: str, path: str) -> bytes:
        b = s.encode("utf-8", "surrogatepass")
        if len(b) > _U32_MAX:
            raise self.fail(path, f"string of {len(b)} bytes is too long to pack")
        return b

    def value(self, v: Any, path: str) -> None:
        meta = self.meta
        t = type(v)
        if v is None:
            meta.append(_T_NONE)
        elif t is bool:
            meta.append(_T_TRUE if v else _T_FALSE)
        elif t is int:
            if _I64_MIN <= v <= _I64_MAX:
                meta += _tag_i64.pack(_T_INT, v)
            else:
                b = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
                meta += _tag_u32.pack(_T_BIGINT, len(b))
                meta += b
        elif t is float:
            meta += _tag_f64.pack(_T_FLOAT, v)
        elif t is str:
            b = self.text(v, path)
            meta += _tag_u32.pack(_T_STR, len(b))
            meta += b
        elif t is bytes or t is bytearray:
            meta.append(_T_BYTES if t is bytes else _T_BYTEARRAY)
            meta += _u64.pack(len(v))
            self.blob(len(v), v)
        elif t is list or t is tuple:
            if len(v) > _U32_MAX:
                raise self.fail(path, f"{t.__name__} of {len(v)} items is too long to pack")
            meta += _tag_u32.pack(_T_LIST if t is list else _T_TUPLE, len(v))
            for i, item in enumerate(v):
                self.value(item, f"{path}[{i}]")
        elif t is dict:
            self.dict_body(v, path)
        elif isinstance(v, torch.Tensor):
            self.tensor(v, path)
        elif t is np.ndarray:
            self.ndarray(v, path, _T_NDARRAY)
        elif isinstance(v, np.generic):
            if v.dtype.kind not in _NP_KINDS:
                raise self.fail(path, f"numpy scalar of dtype {v.dtype} is not supported")
            self.ndarray(np.asarray(v), path, _T_NPSCALAR)
        else:
            raise self.fail(path, _unsupported_type_message(v))

    def dict_body(self, d: dict, path: str) -> None:
        if len(d) > _U32_MAX:
            raise self.fail(path, f"dict of {len(d)} entries is too long to pack")
        meta = self.meta
        meta += _tag_u32.pack(_T_DICT, len(d))
        for k, item in d.items():
            if type(k) is not str:
                raise self.fail(
                    path, f"dict key {k!r} ({type(k).__name__}) is not a str; only str keys can be packed"
                )
            b = self.text(k, _child(path, k))
            meta += _u32.pack(len(b))
            meta += b
            self.value(item, _child(path, k))

    def tensor(self, v: torch.Tensor, path: str) -> None:
        if type(v) is not torch.Tensor:
            raise self.fail(path, f"tensor subclass {type(v).__qualname__} is not supported; pass a plain torch.Tensor")
        if v.is_quantized:
            raise self.fail(path, f"quantized tensor ({v.dtype}) is not supported; dequantize it first")
        if v.is_nested:
            raise self.fail(path, "nested tensor is not supported")
        if v.layout is not torch.strided:
            raise self.fail(path, f"{v.layout} tensor is not supported; only dense (strided) tensors can be packed")
        if v.device.type != "cpu":
            raise self.fail(
                path,
                f"tensor on device {v.device} is not supported; the exchange moves CPU bytes, "
                "so keep samples on the CPU until after the exchange",
            )
        if v.requires_grad:
            raise self.fail(path, "tensor requires grad; samples carry data, not autograd graphs: detach() it")
        code = _CODE_OF_DTYPE.get(v.dtype)
        if code is None:
            raise self.fail(path, f"tensor dtype {v.dtype} is not supported")
        if v.dim() > 255:
            raise self.fail(path, f"tensor with {v.dim()} dims is not supported (max 255)")
        if v.is_conj():
            v = v.resolve_conj()
        if v.is_neg():
            v = v.resolve_neg()
        shape = tuple(v.shape)
        self.meta += struct.pack(f"<BBB{len(shape)}Q", _T_TENSOR, code, len(shape), *shape)
        self.blob(v.numel() * v.dtype.itemsize, v)

    def ndarray(self, v: np.ndarray, path: str, tag: int) -> None:
        dt = v.dtype
        if dt.kind not in _NP_KINDS or dt.fields is not None or dt.subdtype is not None:
            raise self.fail(
                path, f"numpy array of dtype {dt} is not supported (only bool, int, uint, float, complex)"
            )
        ds = dt.str.encode("ascii")
        if not _NP_DTYPE_RE.match(dt.str):
            raise self.fail(path, f"numpy dtype {dt.str!r} is not supported")
        if v.ndim > 255:
            raise self.fail(path, f"array with {v.ndim} dims is not supported (max 255)")
        shape = v.shape
        self.meta += struct.pack(f"<BB{len(ds)}sB{len(shape)}Q", tag, len(ds), ds, len(shape), *shape)
        self.blob(v.size * dt.itemsize, v)


def _unsupported_type_message(v: Any) -> str:
    t = type(v)
    name = f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__qualname__
    if isinstance(v, dict):
        hint = "; convert it to a plain dict"
    elif isinstance(v, (list, tuple)):
        hint = "; convert it to a plain list or tuple"
    elif isinstance(v, (int, float, str, bytes)):
        hint = "; convert it to the plain builtin type"
    else:
        hint = " (packable: tensors, numpy arrays, None, bool, int, float, str, bytes, lists, tuples, dicts)"
    return f"value of type {name} cannot be packed{hint}"


def sample_encoding(sample: dict) -> SampleEncoding:
    """Validate ``sample`` and compute its packed layout (no tensor data copied).

    Raises :class:`SampleError` naming the sample id and the field path on unsupported content."""
    if type(sample) is not dict:
        raise SampleError(None, f"a sample must be a plain dict, got {type(sample).__qualname__}")
    sid = sample.get(SAMPLE_ID)
    enc = _Encoder(sid)
    try:
        enc.dict_body(sample, "")
    except RecursionError:
        raise SampleError(sid, "sample is nested too deeply to pack") from None
    meta = enc.meta
    pos = _align(HEADER_SIZE + len(meta))
    placed: list[tuple[int, int, Any]] = []
    for fix, (nbytes, src) in zip(enc.fixups, enc.blobs):
        _u64.pack_into(meta, fix, pos)
        placed.append((pos, nbytes, src))
        pos = _align(pos + nbytes)
    return SampleEncoding(pos, bytes(meta), placed)


def encoded_size(sample: dict) -> int:
    """Exact number of bytes :func:`encode_sample` produces for ``sample`` (validates it; copies no data)."""
    return sample_encoding(sample).size


def encode_into(sample: dict, out: Any, offset: int = 0) -> int:
    """Pack ``sample`` into the writable uint8 buffer ``out`` at ``offset``; return the end offset."""
    return sample_encoding(sample).write_into(out, offset)


def encode_sample(sample: dict) -> bytearray:
    """Pack one sample into a new ``bytearray`` (writable, so unpacking can view it without copies)."""
    lay = sample_encoding(sample)
    out = bytearray(lay.size)
    lay.write_into(out, 0)
    return out


def encode_samples(samples: Iterable[dict]) -> torch.Tensor:
    """Pack samples back to back into one new 1-D ``torch.uint8`` tensor (every record 16-aligned)."""
    layouts = [sample_encoding(s) for s in samples]
    out = torch.empty(sum(lay.size for lay in layouts), dtype=torch.uint8)
    arr = out.numpy()
    pos = 0
    for lay in layouts:
        pos = lay.write_into(arr, pos)
    return out


# --------------------------------------------------------------------------------------------------
# Unpacking


def _as_u8_array(buf: Any, what: str = "buffer") -> tuple[np.ndarray, bool]:
    """A 1-D uint8 numpy view over ``buf`` (no copy) and whether it is read-only."""
    if isinstance(buf, torch.Tensor):
        if buf.device.type != "cpu":
            raise ValueError(f"{what} must be a CPU tensor, got one on {buf.device}")
        if buf.dtype != torch.uint8:
            raise ValueError(f"{what} must be a uint8 tensor, got {buf.dtype}")
        if not buf.is_contiguous():
            raise ValueError(f"{what} tensor must be contiguous")
        arr = buf.detach().reshape(-1).numpy()
    elif isinstance(buf, np.ndarray):
        if buf.dtype != np.uint8:
            raise ValueError(f"{what} must be a uint8 array, got {buf.dtype}")
        if not buf.flags.c_contiguous:
            raise ValueError(f"{what} array must be C-contiguous")
        arr = buf.reshape(-1)
    else:
        try:
            arr = np.frombuffer(buf, dtype=np.uint8)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{what} must be a bytes-like object, tensor or array: {e}") from None
    return arr, not arr.flags.writeable


class _Decoder:
    __slots__ = ("meta", "arr", "addr", "base", "size", "copy", "blobs_seen")

    def __init__(self, meta: bytes, arr: np.ndarray, addr: int, base: int, size: int, copy: bool) -> None:
        self.meta = meta
        self.arr = arr
        self.addr = addr  # address of arr[0], for alignment checks
        self.base = base
        self.size = size
        self.copy = copy
        self.blobs_seen = 0

    def corrupt(self, message: str) -> ValueError:
        return ValueError(f"corrupt packed sample at offset {self.base}: {message}")

    def blob(self, off: int, nbytes: int) -> np.ndarray:
        if off < HEADER_SIZE + len(self.meta) or off % ALIGN or off + nbytes > self.size:
            raise self.corrupt(f"data block [{off}, {off + nbytes}) outside the record")
        self.blobs_seen += 1
        start = self.base + off
        return self.arr[start : start + nbytes], self.addr + start

    def dims(self, pos: int) -> tuple[tuple[int, ...], int, int]:
        (ndim,) = _u8.unpack_from(self.meta, pos)
        pos += 1
        shape = struct.unpack_from(f"<{ndim}Q", self.meta, pos)
        pos += 8 * ndim
        numel = 1
        for n in shape:
            numel *= n
        return shape, numel, pos

    def value(self, pos: int) -> tuple[Any, int]:
        meta = self.meta
        tag = meta[pos]
        pos += 1
        if tag == _T_NONE:
            return None, pos
        if tag == _T_FALSE:
            return False, pos
        if tag == _T_TRUE:
            return True, pos
        if tag == _T_INT:
            return _i64.unpack_from(meta, pos)[0], pos + 8
        if tag == _T_FLOAT:
            return _f64.unpack_from(meta, pos)[0], pos + 8
        if tag == _T_STR:
            (n,) = _u32.unpack_from(meta, pos)
            pos += 4
            if pos + n > len(meta):
                raise self.corrupt("string runs past the meta section")
            return meta[pos : pos + n].decode("utf-8", "surrogatepass"), pos + n
        if tag == _T_LIST or tag == _T_TUPLE:
            (n,) = _u32.unpack_from(meta, pos)
            pos += 4
            items = []
            for _ in range(n):
                item, pos = self.value(pos)
                items.append(item)
            return (items if tag == _T_LIST else tuple(items)), pos
        if tag == _T_DICT:
            return self.dict_body(pos)
        if tag == _T_TENSOR:
            code = meta[pos]
            dtype = _DTYPE_OF_CODE.get(code)
            if dtype is None:
                raise self.corrupt(f"unknown tensor dtype code {code}")
            shape, numel, pos = self.dims(pos + 1)
            (off,) = _u64.unpack_from(meta, pos)
            raw, addr = self.blob(off, numel * dtype.itemsize)
            return self.make_tensor(raw, addr, dtype, shape), pos + 8
        if tag == _T_NDARRAY or tag == _T_NPSCALAR:
            n = meta[pos]
            ds = meta[pos + 1 : pos + 1 + n].decode("ascii", "replace")
            if not _NP_DTYPE_RE.match(ds):
                raise self.corrupt(f"bad numpy dtype {ds!r}")
            try:
                dt = np.dtype(ds)
            except TypeError:
                raise self.corrupt(f"bad numpy dtype {ds!r}") from None
            if dt.kind not in _NP_KINDS:
                raise self.corrupt(f"bad numpy dtype {ds!r}")
            shape, numel, pos = self.dims(pos + 1 + n)
            (off,) = _u64.unpack_from(meta, pos)
            raw, addr = self.blob(off, numel * dt.itemsize)
            if tag == _T_NPSCALAR:
                if shape:
                    raise self.corrupt("numpy scalar with dims")
                return raw.view(dt).reshape(())[()], pos + 8
            return self.make_array(raw, addr, dt, shape), pos + 8
        if tag == _T_BYTES or tag == _T_BYTEARRAY:
            n, off = struct.unpack_from("<QQ", meta, pos)
            raw, _ = self.blob(off, n)
            return (raw.tobytes() if tag == _T_BYTES else bytearray(raw.data)), pos + 16
        if tag == _T_BIGINT:
            (n,) = _u32.unpack_from(meta, pos)
            pos += 4
            if pos + n > len(meta):
                raise self.corrupt("integer runs past the meta section")
            return int.from_bytes(meta[pos : pos + n], "little", signed=True), pos + n
        raise self.corrupt(f"unknown tag 0x{tag:02x}")

    def dict_body(self, pos: int) -> tuple[dict, int]:
        meta = self.meta
        (n,) = _u32.unpack_from(meta, pos)
        pos += 4
        out: dict[str, Any] = {}
        for _ in range(n):
            (k,) = _u32.unpack_from(meta, pos)
            pos += 4
            if pos + k > len(meta):
                raise self.corrupt("dict key runs past the meta section")
            key = meta[pos : pos + k].decode("utf-8", "surrogatepass")
            out[key], pos = self.value(pos + k)
        return out, pos

    def make_tensor(self, raw: np.ndarray, addr: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        if raw.shape[0] == 0:
            return torch.empty(0, dtype=torch.uint8).view(dtype).view(shape)
        if not raw.flags.writeable:
            t = torch.from_numpy(raw.copy())
        elif self.copy or addr % dtype.itemsize:
            t = torch.empty(raw.shape[0], dtype=torch.uint8)
            t.copy_(torch.from_numpy(raw))
        else:
            t = torch.from_numpy(raw)
        if dtype is not torch.uint8:
            t = t.view(dtype)
        return t.view(shape)

    def make_array(self, raw: np.ndarray, addr: int, dt: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        if self.copy or not raw.flags.writeable or addr % dt.alignment:
            raw = raw.copy()
        return raw.view(dt).reshape(shape)


def _decode_at(arr: np.ndarray, offset: int, copy: bool, addr: int | None = None) -> tuple[dict, int]:
    total = arr.shape[0]
    if offset < 0 or offset + HEADER_SIZE > total:
        raise ValueError(f"no packed sample at offset {offset}: buffer has {total} bytes")
    magic, version, _flags, size, meta_size, nblobs, _ = _HEADER.unpack_from(arr, offset)
    if magic != MAGIC:
        raise ValueError(f"no packed sample at offset {offset}: bad magic {bytes(magic)!r}")
    if version != FORMAT_VERSION:
        raise ValueError(f"packed sample at offset {offset} has format version {version}, expected {FORMAT_VERSION}")
    if size % ALIGN or HEADER_SIZE + meta_size > size or offset + size > total:
        raise ValueError(
            f"corrupt packed sample at offset {offset}: record size {size}, meta size {meta_size}, "
            f"{total - offset} bytes available"
        )
    meta = arr[offset + HEADER_SIZE : offset + HEADER_SIZE + meta_size].tobytes()
    dec = _Decoder(meta, arr, arr.ctypes.data if addr is None else addr, offset, size, copy)
    try:
        if not meta or meta[0] != _T_DICT:
            raise dec.corrupt("top level is not a dict")
        sample, end = dec.dict_body(1)
    except (struct.error, IndexError, UnicodeDecodeError, RecursionError) as e:
        raise dec.corrupt(f"{type(e).__name__}: {e}") from None
    if end != meta_size or dec.blobs_seen != nblobs:
        raise dec.corrupt("meta section length or data block count does not match the header")
    return sample, offset + size


def decode_sample(buffer: Any, offset: int = 0, *, copy: bool = False) -> tuple[dict, int]:
    """Read the record at ``buffer[offset:]``; return ``(sample, end_offset)``.

    ``buffer``: bytes-like, uint8 ``np.ndarray`` or CPU uint8 ``torch.Tensor``. With ``copy=False``
    tensors and arrays may be views sharing memory with ``buffer`` (see the module doc); ``copy=True``
    gives them their own storage. Raises ``ValueError`` on bytes that are not a valid record."""
    arr, readonly = _as_u8_array(buffer)
    return _decode_at(arr, offset, copy or readonly)


def decode_samples(
    buffer: Any,
    count: int | None = None,
    *,
    sizes: Sequence[int] | None = None,
    offset: int = 0,
    copy: bool = False,
) -> list[dict]:
    """Unpack records written back to back from ``buffer[offset:]``.

    With ``count``, read exactly that many; with ``sizes`` (bytes per record, e.g. the packed sizes
    the exchange gathered), read ``len(sizes)`` records and check each one's length; with neither,
    read until the buffer ends."""
    arr, readonly = _as_u8_array(buffer)
    copy = copy or readonly
    addr = arr.ctypes.data
    out: list[dict] = []
    pos = offset
    if sizes is not None:
        if count is not None and count != len(sizes):
            raise ValueError(f"count {count} does not match {len(sizes)} sizes")
        for i, n in enumerate(sizes):
            sample, end = _decode_at(arr, pos, copy, addr)
            if end - pos != n:
                raise ValueError(f"record {i} at offset {pos} is {end - pos} bytes, expected {n}")
            out.append(sample)
            pos = end
    elif count is not None:
        for _ in range(count):
            sample, pos = _decode_at(arr, pos, copy, addr)
            out.append(sample)
    else:
        while pos < arr.shape[0]:
            sample, pos = _decode_at(arr, pos, copy, addr)
            out.append(sample)
    return out
