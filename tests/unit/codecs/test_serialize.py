"""aionet.codecs.serialize: objects <-> frames, zero-copy buffers, hostile input."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import enum
import math
import os
import pickle
import struct
import threading
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aionet.codecs import extensions as S
from aionet.codecs.serialize import Serializer
from aionet.config import Config, LimitsSection
from aionet.errors import DecodeError, FrameTooLarge, ProtocolError, SerializationError, TooManyFrames

MiB = 2**20


# ----------------------------------------------------------------------------- helpers
def same(a: Any, b: Any) -> bool:
    """Deep equality that also insists on identical types (tuple is not list, bytes is not
    bytearray, np.int64 is not int) and bit-identical floats and arrays."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, complex):
        return struct.pack("<dd", a.real, a.imag) == struct.pack("<dd", b.real, b.imag)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes() and b.flags.writeable
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, memoryview):
        return a.tobytes() == b.tobytes()
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return len(a) == len(b) and all(
            same(ka, kb) and same(va, vb) for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True)
        )
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return bool(a == b)


def as_received(frames: list[Any], how: str) -> list[Any]:
    """What a transport might hand the receiver."""
    if how == "inproc":
        return list(frames)
    if how == "bytes":
        return [bytes(f) for f in frames]
    if how == "bytearray":
        return [frames[0]] + [bytearray(f) for f in frames[1:]]
    if how == "memoryview":
        return [frames[0]] + [memoryview(bytearray(f)) for f in frames[1:]]
    raise AssertionError(how)


def roundtrip(ser: Serializer, obj: Any, how: str = "bytearray", **kw: Any) -> Any:
    return ser.loads(as_received(ser.dumps(obj, **kw), how))


SERIALIZERS = {
    "default": lambda: Serializer(),
    "small-oob": lambda: Serializer(oob_min_bytes=16),
    "lz4": lambda: Serializer(oob_min_bytes=16, compression="lz4", compress_min_bytes=64),
}


@pytest.fixture(params=sorted(SERIALIZERS))
def ser(request: pytest.FixtureRequest) -> Serializer:
    return SERIALIZERS[request.param]()


@dataclasses.dataclass
class Point:
    x: float
    y: float


@dataclasses.dataclass(frozen=True)
class Frozen:
    name: str
    tags: tuple[str, ...] = ()


@dataclasses.dataclass(slots=True)
class Slotted:
    a: int
    data: Any = None
    derived: int = dataclasses.field(init=False, default=0)


@dataclasses.dataclass
class Tree:
    label: str
    children: list[Tree]
    payload: Any = None


class Color(enum.IntEnum):
    RED = 1


class Opaque:
    def __init__(self, v: Any) -> None:
        self.v = v

    def __eq__(self, other: object) -> bool:
        return type(other) is Opaque and same(self.v, other.v)


# ----------------------------------------------------------------------------- basic types
@pytest.mark.parametrize(
    "obj",
    [
        None,
        True,
        0,
        -1,
        2**63 - 1,
        -(2**63),
        2**64 - 1,
        2**64,
        -(2**63) - 1,
        2**300,
        -(2**300),
        1.5,
        -0.0,
        float("inf"),
        float("nan"),
        "",
        "héllo ✓",
        b"",
        b"abc",
        [],
        (),
        (1,),
        [1, (2, [3, (4,)])],
        {"a": 1, 2: "b", (1, 2): [3], None: None, b"k": 1.0, 3.5: True, frozenset({1}): 0},
        {1, 2, 3},
        frozenset({"a", (1, 2)}),
        set(),
        1 + 2j,
        complex(float("nan"), -0.0),
        dt.datetime(2024, 1, 2, 3, 4, 5, 678901),
        dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=-3, minutes=-30))),
        dt.date(1999, 12, 31),
        dt.time(23, 59, 58, 1),
        dt.timedelta(days=-3, seconds=5, microseconds=7),
        np.int8(-3),
        np.uint64(2**64 - 1),
        np.float16(1.5),
        np.float32(2.5),
        np.float64(3.25),
        np.longdouble(1.5),
        np.complex64(1 - 2j),
        np.bool_(True),
        np.datetime64("2024-01-02T03:04:05.123456789"),
        np.timedelta64(5, "ms"),
        np.str_("numpy str"),
        np.bytes_(b"numpy bytes"),
        [2, 17, "echo", {"k": [1, 2, (3, 4)], "v": b"x" * 100}],
    ],
    ids=lambda v: repr(sorted(v, key=repr)) if isinstance(v, (set, frozenset)) else repr(v),  # hash-seed stable
)
def test_round_trip_values(ser: Serializer, obj: Any) -> None:
    out = roundtrip(ser, obj)
    assert same(obj, out), (obj, out)


def test_tuples_stay_tuples_and_lists_stay_lists() -> None:
    ser = Serializer()
    out = roundtrip(ser, [(1, [2, (3,)]), [(4,)]])
    assert type(out) is list and type(out[0]) is tuple and type(out[0][1]) is list
    assert type(out[0][1][1]) is tuple and type(out[1][0]) is tuple


def test_small_message_is_a_single_header_frame() -> None:
    ser = Serializer()
    frames = ser.dumps([1, "chan", b"x" * 64])
    assert len(frames) == 1 and type(frames[0]) is bytes
    assert frames[0] == msgpack.packb([1, "chan", b"x" * 64])  # plain msgpack on the wire


def test_subclasses_travel_as_base_types() -> None:
    ser = Serializer()
    Pair = collections.namedtuple("Pair", "a b")
    out = roundtrip(ser, [Color.RED, collections.OrderedDict(a=1), Pair(1, 2), collections.defaultdict(int)])
    assert out == [1, {"a": 1}, (1, 2), {}]
    assert [type(x) for x in out] == [int, dict, tuple, dict]


def test_deep_tuple_nesting_limit() -> None:
    ser = Serializer(limits=LimitsSection(max_depth=8))
    obj: Any = 1
    for _ in range(8):
        obj = (obj,)
    assert roundtrip(ser, obj) == obj
    with pytest.raises(SerializationError, match="max_depth"):
        ser.dumps((obj,))


def test_unsupported_type_message() -> None:
    ser = Serializer()
    with pytest.raises(SerializationError, match="Opaque.*allow_pickle") as exc:
        ser.dumps({"x": [Opaque(1)]})
    assert isinstance(exc.value, TypeError)  # SerializationError is a TypeError too
    with pytest.raises(SerializationError, match="dtype object"):
        ser.dumps(np.array([1, "a"], dtype=object))


def test_header_too_big_is_refused_on_the_sender() -> None:
    ser = Serializer(limits=LimitsSection(max_header_bytes=1000))
    with pytest.raises(SerializationError, match="max_header_bytes"):
        ser.dumps(list(range(1000)))
    ser.dumps(np.arange(1000))  # the array leaves the header: fine


def test_from_config() -> None:
    cfg = Config.from_dict(
        {
            "codec": {"compression": "lz4", "compress_min_bytes": 1000, "oob_min_bytes": 10},
            "security": {"allow_pickle": True},
            "limits": {"max_depth": 7},
        },
        env={},
    )
    ser = Serializer.from_config(cfg)
    assert (ser.compression, ser.compress_min_bytes, ser.oob_min_bytes) == ("lz4", 1000, 10)
    assert ser.allow_pickle and ser.limits.max_depth == 7
    with pytest.raises(ValueError):
        Serializer(compression="zip")


# ----------------------------------------------------------------------------- numpy
DTYPES = [
    "?", "i1", "u1", ">i2", "<u4", "i8", ">u8", "f2", ">f4", "f8", "c8", ">c16",
    "M8[ns]", "M8[D]", "m8[us]", "S7", "U5", ">U3", "V6",
    [("a", "<f4"), ("b", "S2", (2,)), ("c", [("d", ">i2")])],
]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (5,), (4, 3), (2, 3, 4)], ids=str)
@pytest.mark.parametrize("how", ["inproc", "bytes", "bytearray", "memoryview"])
def test_arrays(dtype: Any, shape: tuple[int, ...], how: str) -> None:
    ser = Serializer(oob_min_bytes=8)
    a = np.frombuffer(os.urandom(int(np.prod(shape)) * np.dtype(dtype).itemsize), dtype=dtype).reshape(shape)
    for variant in (a, np.asfortranarray(a), a.T, a[::2] if a.ndim else a):
        out = roundtrip(ser, variant, how)
        assert same(variant, out)
        assert out.flags.writeable


def test_object_arrays_need_pickle() -> None:
    with pytest.raises(SerializationError, match="object"):
        Serializer().dumps(np.array([None]))
    with pytest.raises(SerializationError):
        Serializer().dumps(np.array(["a"], dtype=np.dtypes.StringDType()))
    a = np.array([{"a": 1}, None], dtype=object)
    out = roundtrip(Serializer(allow_pickle=True), a)
    assert out.dtype == object and out[0] == {"a": 1}


def test_large_array_is_out_of_band_without_copy_on_either_side() -> None:
    ser = Serializer()
    a = np.arange(MiB, dtype=np.float64).reshape(1024, 1024)
    frames = ser.dumps(a)
    assert len(frames) == 2 and len(frames[0]) < 100
    assert isinstance(frames[1], memoryview)
    assert np.shares_memory(np.frombuffer(frames[1], np.uint8), a)  # sender: no copy
    received = [frames[0], bytearray(frames[1])]  # what a socket transport delivers
    out = ser.loads(received)
    assert np.shares_memory(out, np.frombuffer(received[1], np.uint8))  # receiver: no copy
    assert out.flags.writeable and out.flags.c_contiguous
    np.testing.assert_array_equal(out, a)


def test_fortran_array_sent_without_copy_and_arrives_fortran() -> None:
    ser = Serializer()
    a = np.asfortranarray(np.arange(512 * 256, dtype=np.int32).reshape(512, 256))
    frames = ser.dumps(a)
    assert np.shares_memory(np.frombuffer(frames[1], np.uint8), a)
    out = ser.loads([frames[0], bytearray(frames[1])])
    assert out.flags.f_contiguous and not out.flags.c_contiguous
    np.testing.assert_array_equal(out, a)


def test_strided_view_is_copied_once_on_the_sender() -> None:
    ser = Serializer()
    base = np.arange(4096 * 4, dtype=np.float64).reshape(4096, 4)
    view = base[:, 1]
    frames = ser.dumps(view)
    assert not np.shares_memory(np.frombuffer(frames[1], np.uint8), base)
    np.testing.assert_array_equal(ser.loads(frames), view)


def test_read_only_frame_gives_a_writable_copy() -> None:
    ser = Serializer()
    a = np.arange(10000, dtype=np.int64)
    frames = ser.dumps(a)
    raw = bytes(frames[1])
    out = ser.loads([frames[0], raw])
    assert out.flags.writeable
    assert not np.shares_memory(out, np.frombuffer(raw, np.uint8))
    out[0] = 42  # no error
    # read-only memoryview too
    out2 = ser.loads([frames[0], memoryview(raw)])
    assert out2.flags.writeable


def test_small_arrays_are_inlined() -> None:
    ser = Serializer()
    frames = ser.dumps([np.arange(10), np.float32(1)])
    assert len(frames) == 1
    out = ser.loads(frames)
    assert out[0].flags.writeable and type(out[1]) is np.float32


def test_gib_array_decodes_without_copy() -> None:
    ser = Serializer()
    a = np.zeros(2**30, dtype=np.uint8)  # calloc'd: pages are never touched below
    frames = ser.dumps(a)
    assert np.shares_memory(np.frombuffer(frames[1], np.uint8), a)
    out = ser.loads(frames)  # frame is a writable memoryview over `a`
    assert out.nbytes == 2**30 and np.shares_memory(out, a) and out.flags.writeable


def test_memmap_travels_as_ndarray(tmp_path: Any) -> None:
    m = np.memmap(tmp_path / "m.bin", dtype=np.float32, mode="w+", shape=(1000,))
    m[:] = 3
    out = roundtrip(Serializer(), m)
    assert type(out) is np.ndarray and (out == 3).all()


def test_many_arrays_keep_their_frames_straight() -> None:
    ser = Serializer(oob_min_bytes=1)
    arrays = [np.full(i + 1, i, dtype=np.int16) for i in range(50)]
    out = roundtrip(ser, {"a": arrays, "t": tuple(arrays[:5])})
    assert all(same(x, y) for x, y in zip(arrays, out["a"], strict=True))
    assert type(out["t"]) is tuple


# ----------------------------------------------------------------------------- buffers
def test_bytes_out_of_band_no_copy_on_sender() -> None:
    ser = Serializer()
    payload = os.urandom(10000)
    ba = bytearray(os.urandom(10000))
    mv = memoryview(os.urandom(10000))
    frames = ser.dumps([payload, {"ba": ba}, (mv,)])
    assert len(frames) == 4
    assert frames[1] is payload and frames[2] is ba
    assert frames[3].obj is mv.obj


def test_bytearray_frame_is_returned_without_copy() -> None:
    ser = Serializer()
    frames = ser.dumps(bytearray(b"z" * 5000))
    frame = bytearray(frames[1])
    out = ser.loads([frames[0], frame])
    assert out is frame


def test_memoryview_is_a_view_over_the_received_frame() -> None:
    ser = Serializer()
    frames = ser.dumps(memoryview(b"q" * 5000))
    frame = bytearray(frames[1])
    out = ser.loads([frames[0], frame])
    assert type(out) is memoryview and out.obj is frame and not out.readonly


def test_bytes_from_a_bytes_frame_is_not_copied() -> None:
    ser = Serializer()
    frames = ser.dumps(b"y" * 5000)
    frame = bytes(frames[1])
    assert ser.loads([frames[0], frame]) is frame
    assert ser.loads([frames[0], bytearray(frame)]) == frame  # one copy, still bytes
    assert type(ser.loads([frames[0], bytearray(frame)])) is bytes


def test_typed_memoryview_arrives_as_flat_bytes() -> None:
    ser = Serializer()
    a = np.arange(1000, dtype=np.float64).reshape(10, 100)
    out = roundtrip(ser, memoryview(a))
    assert type(out) is memoryview and out.format == "B" and out.tobytes() == a.tobytes()
    nc = memoryview(a[:, ::2])
    assert roundtrip(ser, nc).tobytes() == nc.tobytes()


def test_small_bytearray_and_memoryview_keep_their_types() -> None:
    out = roundtrip(Serializer(), [bytearray(b"ab"), memoryview(b"cd"), b"ef"])
    assert [type(x) for x in out] == [bytearray, memoryview, bytes]


def test_caller_objects_are_not_modified() -> None:
    ser = Serializer()
    inner = [b"x" * 5000]
    obj = {"k": inner, "t": [1, 2]}
    ser.dumps(obj)
    assert obj == {"k": [b"x" * 5000], "t": [1, 2]} and obj["k"] is inner


# ----------------------------------------------------------------------------- compression
def test_compression_round_trip_and_skip_random() -> None:
    ser = Serializer(compression="lz4", compress_min_bytes=65536)
    zeros = np.zeros(4 * MiB, dtype=np.uint8)
    noise = np.frombuffer(os.urandom(4 * MiB), dtype=np.uint8)
    frames = ser.dumps([zeros, noise])
    assert len(frames[1]) < zeros.nbytes // 100  # compressed
    assert np.shares_memory(np.frombuffer(frames[2], np.uint8), noise)  # random: sent raw
    out = ser.loads(as_received(frames, "bytes"))
    assert out[0].flags.writeable  # decompressed into a fresh bytearray, no extra copy
    np.testing.assert_array_equal(out[0], zeros)
    np.testing.assert_array_equal(out[1], noise)


def test_compress_flag_overrides_config() -> None:
    data = b"a" * 200000
    assert len(Serializer().dumps(data, compress=True)[1]) < 10000
    ser = Serializer(compression="lz4")
    assert ser.dumps(data, compress=False)[1] is data
    assert len(ser.dumps(data)[1]) < 10000
    assert len(ser.dumps(b"a" * 1000)) == 1  # below oob_min_bytes: inline, untouched
    assert roundtrip(ser, data, "bytes") == data
    assert type(roundtrip(ser, bytearray(data))) is bytearray


def _ext(code: int, payload: Any) -> msgpack.ExtType:
    return msgpack.ExtType(code, msgpack.packb(payload))


def test_lz4_bomb_through_loads() -> None:
    import lz4.block

    ser = Serializer()
    small = lz4.block.compress(bytes(1000), store_size=False)
    for raw_len, why in ((2**40, "max_frame_bytes"), (10**9, "decompression bomb"), (-5, "bad decompressed length")):
        header = msgpack.packb(_ext(S.EXT_NDARRAY, ["|u1", [max(raw_len, 0)], False, [1, "lz4", raw_len]]))
        with pytest.raises(DecodeError, match=why):
            ser.loads([header, small], decompress=True)
    limited = Serializer(limits=LimitsSection(max_frame_bytes=500))
    header = msgpack.packb(_ext(S.EXT_BUFFER, [0, [1, "lz4", 1000]]))
    with pytest.raises(DecodeError, match="max_frame_bytes"):
        limited.loads([header, small], decompress=True)
    assert Serializer().loads([header, small], decompress=True) == bytes(1000)
    assert Serializer(compression="lz4").loads([header, small]) == bytes(1000)


# ----------------------------------------------------------------------------- dataclasses
def test_registered_dataclasses_round_trip() -> None:
    ser = Serializer(oob_min_bytes=16)
    assert ser.register(Point) is Point
    ser.register(Frozen, name="frozen")
    ser.register(Slotted)
    ser.register(Tree)
    s = Slotted(1, np.arange(100))
    s.derived = 9
    tree = Tree("root", [Tree("a", [], Point(1.0, 2.0)), Tree("b", [], (Frozen("f", ("x",)), b"z" * 100))])
    out = roundtrip(ser, [tree, s, {"p": Point(3.0, 4.0)}])
    assert same(out[0], tree) and type(out[0].children[1].payload[0]) is Frozen
    assert out[1].derived == 9 and same(out[1].data, s.data)
    assert out[2]["p"] == Point(3.0, 4.0)


def test_register_as_decorator() -> None:
    ser = Serializer()

    @ser.register
    @dataclasses.dataclass
    class A:
        v: int

    @ser.register(name="bee")
    @dataclasses.dataclass
    class B:
        v: int

    assert roundtrip(ser, [A(1), B(2)]) == [A(1), B(2)]
    assert ser._by_type[A][0] == f"{__name__}:test_register_as_decorator.<locals>.A"
    assert ser._by_type[B][0] == "bee"


def test_unregistered_dataclass_error_names_type_and_fix() -> None:
    with pytest.raises(SerializationError) as exc:
        Serializer().dumps({"p": Point(1, 2)})
    msg = str(exc.value)
    assert "Point" in msg and "register" in msg


def test_register_rejects_non_dataclasses_and_name_clashes() -> None:
    ser = Serializer()
    with pytest.raises(SerializationError):
        ser.register(Opaque)
    ser.register(Point, name="p")
    with pytest.raises(SerializationError, match="already registered"):
        ser.register(Frozen, name="p")


def test_unknown_registered_name_on_decode() -> None:
    sender = Serializer()
    sender.register(Point, name="geo.Point")
    frames = sender.dumps(Point(1, 2))
    with pytest.raises(DecodeError, match="geo.Point"):
        Serializer().loads(frames)


def test_field_count_mismatch_is_a_decode_error() -> None:
    @dataclasses.dataclass
    class V1:
        a: int

    @dataclasses.dataclass
    class V2:
        a: int
        b: int

    sender, receiver = Serializer(), Serializer()
    sender.register(V1, name="v")
    receiver.register(V2, name="v")
    with pytest.raises(DecodeError, match="fields"):
        receiver.loads(sender.dumps(V1(1)))


# ----------------------------------------------------------------------------- pickle
def test_pickle_disabled_refuses_to_send() -> None:
    with pytest.raises(SerializationError, match="allow_pickle"):
        Serializer().dumps(Opaque(1))


def test_pickle_enabled_round_trip_with_out_of_band_buffers() -> None:
    ser = Serializer(allow_pickle=True)
    big = np.arange(100000, dtype=np.float64)
    obj = Opaque(big)
    frames = ser.dumps([obj, Opaque("small")])
    assert len(frames) == 2 and np.shares_memory(np.frombuffer(frames[1], np.uint8), big)
    out = ser.loads(as_received(frames, "bytearray"))
    assert out == [obj, Opaque("small")]


def test_received_pickle_is_never_unpickled_when_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    frames = Serializer(allow_pickle=True).dumps(Opaque([1, 2]))
    calls: list[Any] = []

    def spy(*a: Any, **k: Any) -> Any:
        calls.append(a)
        raise AssertionError("pickle.loads called")

    monkeypatch.setattr(pickle, "loads", spy)
    monkeypatch.setattr(pickle, "Unpickler", spy)
    with pytest.raises(DecodeError, match="pickle"):
        Serializer().loads(frames)
    assert calls == []


def test_reentrant_dumps_from_pickle_hook() -> None:
    ser = Serializer(allow_pickle=True)

    class Nested:
        def __reduce__(self) -> Any:
            inner = ser.dumps((1, [b"x" * 5000]))  # re-enters the encoder mid-message
            return (bytes, (len(inner),))

    out = roundtrip(ser, [(1, 2), Nested(), (3,)])
    assert out[0] == (1, 2) and out[2] == (3,) and type(out[1]) is bytes


# ----------------------------------------------------------------------------- threads
def test_threads_share_one_serializer() -> None:
    ser = Serializer(oob_min_bytes=64)
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(300):
                obj = [k, i, (k, "x" * (i % 7)), np.full(i % 40 + 1, k, dtype=np.int32), b"y" * (i % 100)]
                out = ser.loads(ser.dumps(obj))
                assert same(obj, out)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors


# ----------------------------------------------------------------------------- hostile input
def test_frame_level_errors() -> None:
    ser = Serializer(limits=LimitsSection(max_frames=2, max_header_bytes=100))
    with pytest.raises(DecodeError):
        ser.loads([])
    with pytest.raises(FrameTooLarge):
        ser.loads([b"\x00" * 101])
    with pytest.raises(FrameTooLarge):
        ser.loads([b"\x00" * 101, b"x"])
    with pytest.raises(TooManyFrames):
        ser.loads([b"\x90", b"", b"", b""])
    with pytest.raises(DecodeError, match="not a buffer"):
        ser.loads([b"\x90", "text"])  # type: ignore[list-item]
    with pytest.raises(DecodeError):
        ser.loads(["text"])  # type: ignore[list-item]
    with pytest.raises(DecodeError):
        ser.loads([None])  # type: ignore[list-item]


def _buf(ref: Any, kind: int = 0) -> bytes:
    return msgpack.packb(_ext(S.EXT_BUFFER, [kind, ref]))


def _arr(dtype: Any, shape: Any, ref: Any, fortran: Any = False) -> bytes:
    return msgpack.packb(_ext(S.EXT_NDARRAY, [dtype, shape, fortran, ref]))


@pytest.mark.parametrize(
    "frames",
    [
        [b"\xc1"],  # never-used msgpack byte
        [b"\x92\x01"],  # truncated array
        [b"\x01\x02"],  # trailing data
        [msgpack.packb(msgpack.ExtType(99, b""))],  # unknown extension code
        [_buf(1)],  # frame 1 does not exist
        [_buf(5), b"x"],
        [_buf(0), b"x"],
        [_buf(-1), b"x"],
        [_buf("1"), b"x"],
        [_buf(1, kind=9), b"x"],
        [_buf([1, 2, 3]), b"x"],
        [msgpack.packb([_ext(S.EXT_BUFFER, [0, 1]), _ext(S.EXT_BUFFER, [0, 1])]), b"x"],  # used twice
        [msgpack.packb(1), b"unreferenced"],
        [_buf(1), b"x", b"unreferenced"],
        [_arr("|O", [1], b"\x00" * 8)],  # object dtype: pointers from the network
        [_arr("O", [1], b"\x00" * 8)],
        [_arr("T", [1], b"\x00" * 16)],
        [_arr([["a", "|O"]], [1], b"\x00" * 8)],
        [_arr([["a", [["b", "|O"]]]], [1], b"\x00" * 8)],
        [_arr("<f8", [3], b"\x00" * 8)],  # shape/dtype do not match the buffer
        [_arr("<f8", [-1], b"")],
        [_arr("<f8", [2**62, 2**62], b"")],
        [_arr("<f8", [0, 2**62], b"", fortran="yes")],
        [_arr("<f8", [1] * 100, b"\x00" * 8)],
        [_arr("<f8", "3", b"\x00" * 24)],
        [_arr("not a dtype", [1], b"\x00")],
        [_arr("<U99999999999", [1], b"\x00")],
        [_arr([], [1], b"")],
        [_arr("|S0", [5], b"")],  # numpy would widen to S1 and read past the buffer
        [_arr("<U0", [5], b"")],
        [_arr([["a", "|S0"]], [5], b"")],
        [_arr("|V0", [2**40], b"")],  # zero-size items: no bytes, but 2**40 loop iterations
        [_arr([["a"]], [1], b"")],
        [_arr("<f8", [1], b"\x00" * 8)[:-1]],
        [msgpack.packb(_ext(S.EXT_NDARRAY, ["<f8", [1]]))],
        [msgpack.packb(msgpack.ExtType(S.EXT_COMPLEX, b"\x00" * 3))],
        [msgpack.packb(msgpack.ExtType(S.EXT_BIGINT, b""))],
        [msgpack.packb(msgpack.ExtType(S.EXT_TUPLE, b"\xc1"))],
        [msgpack.packb(msgpack.ExtType(S.EXT_TUPLE, msgpack.packb({"a": 1})))],
        [msgpack.packb(_ext(S.EXT_SET, [[1]]))],  # unhashable member
        [msgpack.packb(_ext(S.EXT_NPSCALAR, ["<f8", b"\x00" * 3]))],
        [msgpack.packb(_ext(S.EXT_NPSCALAR, ["|O", b"\x00" * 8]))],
        [msgpack.packb(_ext(S.EXT_DATETIME, [0, "not a date"]))],
        [msgpack.packb(_ext(S.EXT_DATETIME, [7, "2020-01-01"]))],
        [msgpack.packb(_ext(S.EXT_DATACLASS, ["nope", []]))],
        [msgpack.packb(_ext(S.EXT_DATACLASS, [1, 2, 3]))],
        [msgpack.packb(_ext(S.EXT_PICKLE, [pickle.dumps(1), []]))],
        [b"\x81\x91\x01\x02"],  # {[1]: 2}: unhashable key
    ],
)
def test_malformed_messages_raise_decode_error(frames: list[bytes]) -> None:
    with pytest.raises(ProtocolError):
        Serializer().loads(frames)


def test_str_and_container_limits() -> None:
    ser = Serializer(limits=LimitsSection(max_str_len=10, max_bin_len=10, max_array_len=10, max_map_len=10))
    for bad in ("x" * 11, b"x" * 11, list(range(11)), dict.fromkeys(range(11))):
        with pytest.raises(DecodeError):
            ser.loads(Serializer().dumps(bad))
    assert ser.loads(Serializer().dumps("x" * 10)) == "x" * 10


@pytest.mark.parametrize(
    "record",
    [
        b"\xdb\x7f\xff\xff\xffabc",  # str32 announcing 2 GiB
        b"\xc6\x7f\xff\xff\xffabc",  # bin32 announcing 2 GiB
        b"\xdd\xff\xff\xff\xff\x01",  # array32 announcing 4 billion items
        b"\xdf\xff\xff\xff\xff\x01\x02",  # map32 announcing 4 billion pairs
        b"\xc9\x7f\xff\xff\xff\x05abc",  # ext32 announcing 2 GiB
        b"\x93\x01\x02",  # array of 3 with 2 present
    ],
)
def test_short_records_announcing_more_than_they_hold_raise_decode_error(record: bytes) -> None:
    """Short headers are unpacked with msgpack's default bounds (the record's own length),
    which must refuse every announcement longer than the record, before allocating."""
    with pytest.raises(DecodeError):
        Serializer().loads([record])


def test_ext_nesting_limit_on_decode() -> None:
    payload = msgpack.packb(1)
    for _ in range(100):
        payload = msgpack.packb(msgpack.ExtType(S.EXT_TUPLE, msgpack.packb([msgpack.ExtType(S.EXT_TUPLE, payload)])))
    with pytest.raises(DecodeError, match="max_depth"):
        Serializer().loads([payload])


def test_deep_plain_nesting_is_rejected_cleanly() -> None:
    deep = b"\x91" * 100000 + b"\x01"
    with pytest.raises(DecodeError):
        Serializer().loads([deep])
    obj: Any = 1
    for _ in range(2000):
        obj = [obj]
    with pytest.raises(SerializationError):
        Serializer().dumps(obj)


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _loads_or_protocol_error(ser: Serializer, frames: list[Any]) -> None:
    try:
        ser.loads(frames)
    except ProtocolError:
        pass


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_header_bytes(data: bytes) -> None:
    _loads_or_protocol_error(Serializer(), [data])


@FUZZ
@given(st.lists(st.binary(max_size=64), min_size=0, max_size=5))
def test_fuzz_frame_lists(frames: list[bytes]) -> None:
    _loads_or_protocol_error(Serializer(), frames)


plain = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=8), st.binary(max_size=16)),
    lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=4), c, max_size=3)),
    max_leaves=8,
)


@st.composite
def ext_records(draw: st.DrawFn) -> bytes:
    """Structurally plausible extension records with hostile contents."""
    code = draw(st.integers(0, 15))
    body = draw(st.one_of(st.binary(max_size=40), plain.map(msgpack.packb)))
    return msgpack.packb([msgpack.ExtType(code, body)])


@FUZZ
@given(ext_records(), st.lists(st.binary(max_size=64), max_size=3))
def test_fuzz_extension_records(header: bytes, rest: list[bytes]) -> None:
    _loads_or_protocol_error(Serializer(), [header, *rest])


@FUZZ
@given(st.data())
def test_fuzz_mutated_valid_messages(data: st.DataObject) -> None:
    ser = Serializer(oob_min_bytes=8, compression="lz4", compress_min_bytes=16)
    ser.register(Point)
    obj = [1, (2.5, "s"), np.arange(6, dtype="<i4").reshape(2, 3), b"q" * 40, {3: Point(1, 2)}, bytes(64)]
    frames = [bytearray(f) for f in ser.dumps(obj)]
    i = data.draw(st.integers(0, len(frames) - 1))
    f = frames[i]
    op = data.draw(st.sampled_from(["flip", "truncate", "extend", "drop", "swap"]))
    if op == "flip" and f:
        pos = data.draw(st.integers(0, len(f) - 1))
        f[pos] ^= data.draw(st.integers(1, 255))
    elif op == "truncate":
        del f[data.draw(st.integers(0, len(f))) :]
    elif op == "extend":
        f += data.draw(st.binary(min_size=1, max_size=8))
    elif op == "drop":
        del frames[i]
    elif op == "swap" and len(frames) > 2:
        frames[1], frames[-1] = frames[-1], frames[1]
    _loads_or_protocol_error(ser, frames)


# ----------------------------------------------------------------------------- property round trips
def _dtypes() -> st.SearchStrategy[np.dtype]:
    scalar = st.one_of(
        hnp.boolean_dtypes(),
        hnp.integer_dtypes(endianness="?"),
        hnp.unsigned_integer_dtypes(endianness="?"),
        hnp.floating_dtypes(endianness="?"),
        hnp.complex_number_dtypes(endianness="?"),
        hnp.datetime64_dtypes(endianness="?"),
        hnp.timedelta64_dtypes(endianness="?"),
        hnp.byte_string_dtypes(max_len=6),
        hnp.unicode_string_dtypes(endianness="?", max_len=6),
    )
    return st.one_of(scalar, hnp.array_dtypes(scalar, max_size=3))


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    dtype = draw(_dtypes())
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6))
    size = int(np.prod(shape)) * dtype.itemsize
    a = np.frombuffer(draw(st.binary(min_size=size, max_size=size)), dtype=dtype).reshape(shape).copy()
    view = draw(st.sampled_from(["c", "f", "t", "step"]))
    if view == "f":
        return np.asfortranarray(a)
    if view == "t":
        return a.T
    if view == "step" and a.ndim:
        return a[::2]
    return a


np_scalars = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    st.integers(0, 255).map(np.uint8),
    st.floats(width=32).map(np.float32),
    st.floats().map(np.float64),
    st.booleans().map(np.bool_),
    st.integers(-(10**15), 10**15).map(lambda v: np.datetime64(v, "us")),
)

hashables = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False),
        st.text(max_size=6),
        st.binary(max_size=6),
    ),
    lambda c: st.one_of(st.lists(c, max_size=3).map(tuple), st.frozensets(c, max_size=3)),
    max_leaves=4,
)

leaves = st.one_of(
    hashables,
    st.integers(min_value=-(2**200), max_value=2**200),
    st.floats(),
    st.complex_numbers(),
    st.binary(max_size=80),
    st.binary(max_size=80).map(bytearray),
    st.binary(max_size=80).map(memoryview),
    st.datetimes(),
    st.timedeltas(),
    np_scalars,
    arrays(),
)

objects = st.recursive(
    leaves,
    lambda c: st.one_of(
        st.lists(c, max_size=4),
        st.lists(c, max_size=4).map(tuple),
        st.dictionaries(hashables, c, max_size=4),
        st.sets(hashables, max_size=3),
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    obj=objects,
    kind=st.sampled_from(sorted(SERIALIZERS)),
    how=st.sampled_from(["inproc", "bytes", "bytearray", "memoryview"]),
)
def test_property_round_trip(obj: Any, kind: str, how: str) -> None:
    ser = SERIALIZERS[kind]()
    out = roundtrip(ser, obj, how)
    assert same(obj, out)


@settings(max_examples=60, deadline=None)
@given(a=arrays(), oob=st.sampled_from([1, 64, 2048]))
def test_property_arrays_zero_copy(a: np.ndarray, oob: int) -> None:
    ser = Serializer(oob_min_bytes=oob)
    frames = ser.dumps(a)
    if len(frames) == 2 and (a.flags.c_contiguous or a.flags.f_contiguous):
        assert np.shares_memory(np.frombuffer(frames[1], np.uint8), a)
    received = as_received(frames, "bytearray")
    out = ser.loads(received)
    assert same(a, out)
    if len(frames) == 2:
        assert np.shares_memory(out, np.frombuffer(received[1], np.uint8))


def test_float_nan_and_signed_zero_in_same_helper() -> None:
    # guard the helper itself: it must tell these apart
    assert not same(0.0, -0.0) and same(math.nan, math.nan) and not same([1], (1,))
