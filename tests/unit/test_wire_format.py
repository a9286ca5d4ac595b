"""Sample packing: exact round trips, exact sizes, back-to-back records, clear refusals, corrupt input."""

from __future__ import annotations

import collections
import enum
import struct
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mimo_pipes.errors import SampleError
from mimo_pipes.exchange.wire_format import (
    ALIGN,
    decode_sample,
    decode_samples,
    encode_into,
    encode_sample,
    encode_samples,
    encoded_size,
    sample_encoding,
    supported_torch_dtypes,
)

# The library itself must not warn (read-only buffers, experimental dtypes...).
pytestmark = pytest.mark.filterwarnings("error")

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Lists of samples: what these add is the framing between records (offsets, order, counts); each sample's own
# encoding is drawn 120 times by the single-record properties, so fewer lists suffice.
LISTS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

DTYPES = supported_torch_dtypes()
NP_DTYPES = ["|b1", "|u1", "|i1", "<u2", ">u2", "<i4", ">i8", "<u8", "<f2", "<f4", ">f8", "<c8", ">c16"]
_CARRIER = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# ---------------------------------------------------------------------------------------------------
# Exact comparison


def _bits(t: torch.Tensor) -> torch.Tensor:
    """An integer view of ``t`` that compares bit for bit (any strides; conj/neg views resolved)."""
    t = t.resolve_conj().resolve_neg()
    if t.dtype.itemsize == 16:
        return torch.view_as_real(t).view(torch.int64)
    return t.view(_CARRIER[t.dtype.itemsize])


def assert_same(a, b, path="sample"):
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{path}: shape {a.shape} != {b.shape}"
        assert not b.is_conj() and not b.is_neg()
        assert torch.equal(_bits(a), _bits(b)), f"{path}: values differ"
    elif isinstance(a, np.ndarray):
        assert a.dtype.str == b.dtype.str and a.shape == b.shape, f"{path}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(), f"{path}: values differ"
    elif isinstance(a, np.generic):
        assert a.dtype.str == b.dtype.str and a.tobytes() == b.tobytes(), f"{path}: {a!r} != {b!r}"
    elif type(a) is float:
        assert struct.pack("<d", a) == struct.pack("<d", b), f"{path}: {a!r} != {b!r} bitwise"
    elif type(a) is dict:
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif type(a) in (list, tuple):
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


# ---------------------------------------------------------------------------------------------------
# Strategies


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=4)))
    numel = int(np.prod(shape, dtype=np.int64))
    nbytes = numel * dtype.itemsize
    if dtype == torch.bool:
        raw = bytes(draw(st.lists(st.integers(0, 1), min_size=numel, max_size=numel)))
    else:  # arbitrary bit patterns: NaNs with payloads, infinities, subnormals, fp8 specials...
        raw = draw(st.binary(min_size=nbytes, max_size=nbytes))
    base = torch.from_numpy(np.frombuffer(bytearray(raw), dtype=np.uint8).copy()) if raw else torch.empty(0, dtype=torch.uint8)
    t = base.view(dtype).reshape(shape)
    how = draw(st.sampled_from(["plain", "transpose", "step", "expand", "conj", "neg", "offset"]))
    if how == "transpose" and t.dim() >= 2:
        t = t.transpose(0, -1)
    elif how == "step" and t.dim() >= 1:
        t = t[::2]
    elif how == "expand":
        t = t.unsqueeze(0).expand(3, *t.shape)
    elif how == "conj" and dtype in (torch.complex64, torch.complex128):
        t = t.conj()
    elif how == "neg" and dtype in (torch.complex64, torch.complex128):
        t = torch._neg_view(t)
    elif how == "offset" and t.dim() >= 1 and t.shape[0] > 1:
        t = t[1:]
    return t


@st.composite
def arrays(draw):
    dt = np.dtype(draw(st.sampled_from(NP_DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    numel = int(np.prod(shape, dtype=np.int64))
    if dt.kind == "b":
        raw = bytes(draw(st.lists(st.integers(0, 1), min_size=numel, max_size=numel)))
    else:
        raw = draw(st.binary(min_size=numel * dt.itemsize, max_size=numel * dt.itemsize))
    a = np.frombuffer(bytearray(raw), dtype=np.uint8).view(dt).reshape(shape)
    if a.ndim >= 2 and draw(st.booleans()):
        a = a.T
    if draw(st.booleans()) and a.size:
        return a.reshape(-1)[0]  # numpy scalar
    return a


bit_floats = st.integers(0, 2**64 - 1).map(lambda b: struct.unpack("<d", struct.pack("<Q", b))[0])
texts = st.one_of(st.text(max_size=8), st.sampled_from(["", "é", "\ud800x", "a.b", "\x00"]))
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.floats(allow_nan=True, allow_infinity=True),
    bit_floats,
    texts,
    st.binary(max_size=20),
    st.binary(max_size=20).map(bytearray),
    tensors(),
    arrays(),
)
values = st.recursive(
    leaves,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4),
        st.lists(kids, max_size=4).map(tuple),
        st.dictionaries(texts, kids, max_size=4),
    ),
    max_leaves=12,
)
samples = st.dictionaries(texts, values, max_size=6)


def realistic(sample_id: int, rows: int, dtype=torch.float32) -> dict:
    return {
        "sample_id": sample_id,
        "input_ids": torch.arange(64, dtype=torch.int64),
        "pixel_values": torch.randn(rows, 1176).to(dtype),
        "image_grid_thw": torch.tensor([[1, 2, rows // 2]] if rows else [], dtype=torch.int64).reshape(-1, 3),
        "step": 3,
        "cost": 10**30,
    }


# ---------------------------------------------------------------------------------------------------
# Round trips


@FAST
@given(samples)
def test_round_trip_exact_and_size_exact(sample):
    data = encode_sample(sample)
    assert len(data) == encoded_size(sample)
    assert len(data) % ALIGN == 0
    out, end = decode_sample(data)
    assert end == len(data)
    assert_same(sample, out)
    copied, _ = decode_sample(bytes(data), copy=True)
    assert_same(sample, copied)


@LISTS
@given(st.lists(samples, max_size=5), st.booleans())
def test_back_to_back_records_unpack_in_order(batch, as_bytes):
    buf = encode_samples(batch)
    assert buf.dtype == torch.uint8 and buf.dim() == 1
    sizes = [encoded_size(s) for s in batch]
    assert buf.numel() == sum(sizes)
    src = bytes(buf.numpy()) if as_bytes else buf
    for got in (decode_samples(src), decode_samples(src, len(batch)), decode_samples(src, sizes=sizes)):
        assert len(got) == len(batch)
        for a, b in zip(batch, got):
            assert_same(a, b)


@LISTS
@given(st.lists(samples, min_size=1, max_size=4), st.integers(0, 3))
def test_pack_into_at_offsets_of_a_shared_buffer(batch, lead):
    offsets, pos = [], lead * ALIGN
    for s in batch:
        offsets.append(pos)
        pos += encoded_size(s)
    for kind in ("tensor", "ndarray", "bytearray"):
        out = {"tensor": torch.full((pos + 5,), 0xAB, dtype=torch.uint8),
               "ndarray": np.full(pos + 5, 0xAB, dtype=np.uint8),
               "bytearray": bytearray(b"\xab" * (pos + 5))}[kind]
        for s, off in zip(batch, offsets):
            assert encode_into(s, out, off) == off + encoded_size(s)
        for s, off in zip(batch, offsets):
            got, end = decode_sample(out, off)
            assert end == off + encoded_size(s)
            assert_same(s, got)


def test_layout_is_reusable_and_matches_pack_sample():
    s = realistic(1, 40)
    lay = sample_encoding(s)
    a = bytearray(lay.size)
    b = bytearray(lay.size)
    lay.write_into(a)
    lay.write_into(b)
    assert a == b == encode_sample(s)


def test_packing_is_deterministic_including_padding():
    # Padding bytes are zeroed, so the same sample always packs to the same bytes (whatever was in the buffer).
    s = {"sample_id": 5, "x": torch.arange(3, dtype=torch.int8), "s": "abc", "y": b"12345", "z": np.ones(1, "u1")}
    out = torch.full((encoded_size(s),), 0xFF, dtype=torch.uint8)
    encode_into(s, out)
    assert bytes(out.numpy()) == bytes(encode_sample(s))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_zero_d_empty_and_noncontiguous(dtype):
    raw = torch.arange(24 * dtype.itemsize, dtype=torch.int64).remainder(251).to(torch.uint8)
    if dtype == torch.bool:
        raw = raw.remainder(2)
    full = raw.view(dtype).reshape(4, 6)
    sample = {
        "sample_id": 0,
        "zero_d": full.reshape(-1)[5],  # 0-d view with a storage offset
        "empty": raw[:0].view(dtype).reshape(0, 1176),
        "empty3": raw[:0].view(dtype).reshape(2, 0, 3),
        "noncontig": full.t()[1:, ::2],
        "contig": full,
        "nested": {"deep": [full[1], (full[:, 0],)]},
    }
    out = decode_sample(encode_sample(sample))[0]
    assert_same(sample, out)
    assert out["noncontig"].is_contiguous()


def test_every_non_quantized_torch_dtype_is_supported():
    present = {v for k in dir(torch) if isinstance(v := getattr(torch, k), torch.dtype)}
    quantized = {getattr(torch, n) for n in ("qint8", "qint32", "quint8", "quint4x2", "quint2x4") if hasattr(torch, n)}
    assert present - quantized <= set(DTYPES), sorted(map(str, present - quantized - set(DTYPES)))
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"):
        if getattr(torch, name, None) is not None:
            assert getattr(torch, name) in DTYPES


def test_nan_payloads_survive_in_float_tensors():
    patterns = {
        torch.float32: [0x7FC00001, 0xFFBFFFFF, 0x7F800001],
        torch.float64: [0x7FF0000000000001, 0xFFF8DEADBEEF0000],
        torch.bfloat16: [0x7FC1, 0xFF81, 0x7F81],
        torch.float16: [0x7E01, 0xFC01],
    }
    carriers = {4: torch.int32, 8: torch.int64, 2: torch.int16}
    for dtype, bits in patterns.items():
        c = carriers[dtype.itemsize]
        ints = torch.tensor([b - (1 << (8 * dtype.itemsize)) if b >= 1 << (8 * dtype.itemsize - 1) else b for b in bits], dtype=c)
        t = ints.view(dtype)
        out = decode_sample(encode_sample({"x": t}))[0]["x"]
        assert torch.equal(out.view(c), ints), dtype
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"):
        dtype = getattr(torch, name, None)
        if dtype is None:
            continue
        everything = torch.arange(256, dtype=torch.int64).to(torch.uint8)
        out = decode_sample(encode_sample({"x": everything.view(dtype)}))[0]["x"]
        assert out.dtype == dtype and torch.equal(out.view(torch.uint8), everything), name


def test_python_scalars_keep_their_exact_type():
    sample = {
        "b": True, "i": 1, "f": 1.0, "big": 2**64, "neg_big": -(2**63) - 1, "edge": -(2**63), "top": 2**63 - 1,
        "t": (1, [2, (3,)]), "l": [(), []], "none": None, "s": "", "by": b"", "ba": bytearray(),
        "np_i": np.int64(3), "np_b": np.bool_(True), "np_f": np.float16(1.5), "np_c": np.complex64(1 + 2j),
    }
    out = decode_sample(encode_sample(sample))[0]
    assert_same(sample, out)
    assert [type(v) for v in out.values()] == [type(v) for v in sample.values()]


def test_key_order_preserved():
    keys = ["z", "a", "m", "pixel_values", "b", "0", ""]
    sample = {k: i for i, k in enumerate(keys)}
    sample["nested"] = {k: None for k in reversed(keys)}
    out = decode_sample(encode_sample(sample))[0]
    assert list(out) == list(sample) and list(out["nested"]) == list(reversed(keys))


# ---------------------------------------------------------------------------------------------------
# Aliasing, copies, buffers


def test_zero_copy_views_alias_the_buffer_and_copy_true_does_not():
    s = realistic(9, 8)
    s["boxes"] = np.arange(4, dtype=np.int32) + 1
    buf = encode_samples([s])
    view = decode_samples(buf)[0]
    own = decode_samples(buf, copy=True)[0]
    assert_same(s, view)
    assert_same(s, own)
    buf.zero_()
    assert not torch.equal(view["input_ids"], s["input_ids"])  # shares the receive buffer
    assert torch.equal(own["input_ids"], s["input_ids"])  # independent storage
    assert not view["boxes"].any() and (own["boxes"] == s["boxes"]).all()


def test_views_keep_the_buffer_alive():
    s = realistic(2, 16)
    view = decode_samples(encode_samples([s]))[0]  # buffer only referenced through the views
    import gc

    gc.collect()
    assert_same(s, view)


def test_read_only_buffer_unpacks_without_warnings():
    s = realistic(3, 4)
    data = bytes(encode_sample(s))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, _ = decode_sample(data)
    assert_same(s, out)
    out["input_ids"][0] = 99  # its own storage: writable, and the bytes object is untouched
    assert decode_sample(data)[0]["input_ids"][0] == 0


def test_misaligned_offset_still_unpacks():
    s = {"x": torch.arange(5, dtype=torch.float64), "y": np.arange(3, dtype=np.int32)}
    out = bytearray(encoded_size(s) + 3)
    encode_into(s, out, 3)
    got, end = decode_sample(out, 3)
    assert end == len(out)
    assert_same(s, got)


def test_realistic_samples_round_trip():
    batch = [realistic(i, rows, dtype) for i, (rows, dtype) in enumerate([(0, torch.float32), (1000, torch.float32), (37, torch.bfloat16)])]
    got = decode_samples(encode_samples(batch), 3)
    for a, b in zip(batch, got):
        assert_same(a, b)
    assert got[0]["pixel_values"].shape == (0, 1176)
    assert got[0]["image_grid_thw"].shape == (0, 3)


def test_buffer_errors():
    s = {"x": 1}
    with pytest.raises(ValueError, match="too small"):
        encode_into(s, bytearray(encoded_size(s) - 1))
    with pytest.raises(ValueError, match="read-only"):
        encode_into(s, bytes(encoded_size(s)))
    with pytest.raises(ValueError, match="uint8"):
        encode_into(s, torch.zeros(encoded_size(s), dtype=torch.int16))
    with pytest.raises(ValueError, match="record 0 .* expected"):
        decode_samples(encode_samples([s]), sizes=[encoded_size(s) + 16])


# ---------------------------------------------------------------------------------------------------
# Refusals name the sample and the field


class Thing:
    pass


class Color(enum.IntEnum):
    RED = 1


Point = collections.namedtuple("Point", "x y")


def _quantized():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)


BAD = [
    (lambda: Thing(), "Thing"),
    (lambda: {1, 2}, "set"),
    (lambda: collections.OrderedDict(a=1), "plain dict"),
    (lambda: Point(1, 2), "plain list or tuple"),
    (lambda: Color.RED, "plain builtin"),
    (lambda: torch.zeros(2, requires_grad=True), "requires grad"),
    (lambda: torch.nn.Parameter(torch.zeros(2), requires_grad=False), "subclass"),
    (lambda: torch.zeros(2, device="meta"), "device meta"),
    (lambda: torch.zeros(3).to_sparse(), "sparse"),
    (lambda: _quantized(), "quantized"),
    (lambda: np.array([object()], dtype=object), "numpy array of dtype object"),
    (lambda: np.array(["a"]), "numpy array of dtype <U1"),
    (lambda: np.zeros(2, dtype=[("a", "i4")]), "numpy array"),
    (lambda: np.datetime64("2020-01-01"), "numpy scalar"),
    (lambda: np.ma.masked_array([1, 2]), "MaskedArray"),
    (lambda: memoryview(b"ab"), "memoryview"),
    (lambda: 1j, "complex"),
]


@pytest.mark.parametrize("make, words", BAD, ids=[w for _, w in BAD])
def test_unsupported_values_raise_sample_error_naming_field(make, words):
    sample = {"sample_id": 42, "ok": torch.zeros(3), "meta": {"boxes": [1, 2, make()]}}
    for fn in (encoded_size, encode_sample, lambda s: encode_samples([{"sample_id": 1}, s])):
        with pytest.raises(SampleError) as info:
            fn(sample)
        assert info.value.sample_id == 42
        assert info.value.field == "meta.boxes[2]"
        assert words in str(info.value)
        assert "42" in str(info.value) and "meta.boxes[2]" in str(info.value)


def test_non_str_dict_key_names_the_dict():
    with pytest.raises(SampleError) as info:
        encoded_size({"sample_id": "abc", "a": {"b": {3: "x"}}})
    assert info.value.sample_id == "abc" and info.value.field == "a.b"
    assert "3" in str(info.value) and "str" in str(info.value)


def test_sample_must_be_a_plain_dict():
    with pytest.raises(SampleError, match="plain dict"):
        encoded_size([("a", 1)])
    with pytest.raises(SampleError, match="plain dict"):
        encoded_size(collections.OrderedDict(a=1))


@FAST
@given(
    path=st.lists(st.one_of(st.text(min_size=1, max_size=4), st.integers(0, 3)), min_size=1, max_size=5),
    sid=st.one_of(st.none(), st.integers(), st.text(max_size=4)),
)
def test_bad_value_anywhere_is_located(path, sid):
    # Build nested containers along ``path`` with a bad value at its end; the error names that path.
    node = Thing()
    for step in reversed(path):
        if isinstance(step, int):
            node = [0] * step + [node]
        else:
            # The sibling first: a key drawn as "~" then replaces it rather than being replaced by it.
            node = {"~": 1, step: node}
    # Keys join with ".", list positions with "[i]" (a key may itself hold "[": it is still a key).
    want = "root" + "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in path)
    sample = {"sample_id": sid, "root": node}
    with pytest.raises(SampleError) as info:
        encoded_size(sample)
    assert info.value.field == want
    assert info.value.sample_id == sid


# ---------------------------------------------------------------------------------------------------
# Corrupt input fails cleanly


def test_corrupt_headers():
    data = encode_sample({"x": torch.arange(4)})
    with pytest.raises(ValueError, match="magic"):
        decode_sample(b"XXXX" + bytes(data[4:]))
    with pytest.raises(ValueError, match="version"):
        decode_sample(bytes(data[:4]) + b"\x09\x00" + bytes(data[6:]))
    with pytest.raises(ValueError):
        decode_sample(bytes(data[:-16]))
    with pytest.raises(ValueError):
        decode_sample(b"")


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_random_corruption_never_crashes_differently(data):
    base = encode_sample({"sample_id": 1, "a": [1, "xy", (None, 2.0)], "t": torch.arange(6).reshape(2, 3),
                        "n": np.ones(2, dtype="<f4"), "b": b"zz", "big": 2**70})
    buf = bytearray(base)
    for _ in range(data.draw(st.integers(1, 4))):
        buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
    try:
        decode_sample(buf)
    except ValueError:
        pass
