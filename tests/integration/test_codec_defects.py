"""Regression tests for issue 11, items 6, 10 and part of 19: attacks through the codecs.

6. lz4 decompression bypassed every memory bound (limits and mailboxes counted compressed
   bytes) and nodes with compression off decompressed too.
10. A structured dtype with 500,000 fields stalled a node's loop for seconds.
19. The unregistered-dataclass error named ``serializer.register`` instead of
    ``node.register_type``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import tracemalloc
from typing import Any

import lz4.block
import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aionet.codecs.compression as compression
import aionet.codecs.extensions as S
from aionet import Node
from aionet.codecs.dtypes import MAX_DTYPE_DEPTH, check_descr_bounds
from aionet.codecs.serialize import Serializer
from aionet.config import Config, LimitsSection
from aionet.errors import ConfigError, DecodeError, FrameTooLarge, ProtocolError, SerializationError
from tests.conftest import wait_for

MiB = 2**20


def _ext(code: int, payload: Any) -> msgpack.ExtType:
    return msgpack.ExtType(code, msgpack.packb(payload, use_bin_type=True))


@pytest.fixture
def no_lz4_decompress(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count lz4 decompressions: a rejected frame must be refused before lz4 runs."""
    calls: list[int] = []
    real = lz4.block.decompress

    def spy(*args: Any, **kw: Any) -> Any:
        calls.append(kw.get("uncompressed_size", -1))
        return real(*args, **kw)

    monkeypatch.setattr(compression.lz4.block, "decompress", spy)
    return calls


def _compressed_zeros(n: int) -> tuple[bytes, bytes]:
    """(header, frame) of a message holding ``n`` zero bytes as one lz4-compressed buffer."""
    frame = lz4.block.compress(bytes(n), store_size=False)
    header = msgpack.packb(_ext(S.EXT_BUFFER, [0, [1, "lz4", n]]))
    return header, frame


# ----------------------------------------------------------------------------- item 6
def test_serializer_without_compression_refuses_compressed_frames(no_lz4_decompress: list[int]) -> None:
    header, frame = _compressed_zeros(MiB)
    with pytest.raises(DecodeError, match="compression was not negotiated"):
        Serializer().loads([header, frame])  # compression "none": nothing to decompress
    with pytest.raises(DecodeError, match="compression was not negotiated"):
        Serializer(compression="lz4").loads([header, frame], decompress=False)  # not negotiated
    assert no_lz4_decompress == []
    assert Serializer(compression="lz4").loads([header, frame]) == bytes(MiB)


def test_bomb_beyond_the_ratio_cap_is_rejected_before_allocation(no_lz4_decompress: list[int]) -> None:
    header, frame = _compressed_zeros(MiB)  # ~254x: legal lz4, above a cap of 10
    ser = Serializer(compression="lz4", max_compression_ratio=10)
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError, match="max_compression_ratio"):
            ser.loads([header, frame])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert no_lz4_decompress == []
    assert peak < MiB // 4  # the 1 MiB result was never allocated

    # The default cap is lz4's own bound: one byte more than 255x is refused, unallocated.
    claim = len(frame) * 255 + 1
    bomb = msgpack.packb(_ext(S.EXT_BUFFER, [0, [1, "lz4", claim]]))
    with pytest.raises(DecodeError, match="decompression bomb"):
        Serializer(compression="lz4").loads([bomb, frame])
    assert no_lz4_decompress == []


def test_sender_keeps_frames_above_its_ratio_cap_raw() -> None:
    zeros = bytes(MiB)
    capped = Serializer(compression="lz4", max_compression_ratio=10)
    frames = capped.dumps(zeros)
    assert frames[1] is zeros  # would compress ~254x: sent as is, never refused by a peer
    assert capped.loads(frames) == zeros
    assert len(Serializer(compression="lz4").dumps(zeros)[1]) < MiB // 100


def test_message_limit_counts_decompressed_bytes(no_lz4_decompress: list[int]) -> None:
    """Two 2 MiB buffers compress to a few KiB each; the message is 4 MiB once decompressed."""
    f = lz4.block.compress(bytes(2 * MiB), store_size=False)
    header = msgpack.packb([_ext(S.EXT_BUFFER, [0, [1, "lz4", 2 * MiB]]), _ext(S.EXT_BUFFER, [0, [2, "lz4", 2 * MiB]])])
    ser = Serializer(compression="lz4", limits=LimitsSection(max_message_bytes=3 * MiB))
    with pytest.raises(FrameTooLarge, match="max_message_bytes"):
        ser.loads([header, f, f])
    assert no_lz4_decompress == [2 * MiB]  # the second frame was refused before decompressing
    obj, nbytes = Serializer(compression="lz4").loads_sized([header, f, f])
    assert obj == [bytes(2 * MiB)] * 2
    assert nbytes == len(header) + 4 * MiB


@settings(max_examples=200, deadline=None)
@given(
    raw=st.binary(max_size=64).map(lambda b: b * 300),
    claim_delta=st.integers(-2, 2) | st.integers(-(2**20), 2**40),
    ratio=st.floats(1, 255),
)
def test_property_compressed_refs_are_accounted_or_refused(raw: bytes, claim_delta: int, ratio: float) -> None:
    """Any claimed size either decodes to exactly that many bytes, counted by loads_sized, or
    fails typed; lz4 only runs for claims within the ratio cap and the frame limit."""
    frame = lz4.block.compress(raw, store_size=False)
    claim = len(raw) + claim_delta
    header = msgpack.packb(_ext(S.EXT_BUFFER, [1, [1, "lz4", claim]]))
    ser = Serializer(compression="lz4", max_compression_ratio=ratio, limits=LimitsSection(max_frame_bytes=2**20))
    try:
        obj, nbytes = ser.loads_sized([header, frame])
    except ProtocolError:
        return
    assert claim <= len(frame) * ratio and claim <= 2**20
    assert obj == bytearray(raw) and nbytes == len(header) + claim


def test_max_compression_ratio_config() -> None:
    cfg = Config.from_dict({"codec": {"compression": "lz4", "max_compression_ratio": 20}}, env={})
    assert Serializer.from_config(cfg).max_compression_ratio == 20.0
    assert Config.from_dict({}, env={}).codec.max_compression_ratio == 255.0
    for bad in (0.5, 256, float("nan")):
        with pytest.raises(ConfigError, match="max_compression_ratio"):
            Config.from_dict({"codec": {"max_compression_ratio": bad}}, env={})


def _node(name: str, compression: str, join: str | None = None, **link: Any) -> Node:
    cfg = Config.from_dict({"codec": {"compression": compression}, "link": link}, env={})
    return Node(name=name, listen="tcp://127.0.0.1:0", join=join, config=cfg)


async def test_compressed_traffic_to_node_without_compression_closes_the_connection() -> None:
    a = _node("a", "none")
    await a.start()
    b = _node("b", "lz4", join=a.address)
    c = _node("c", "none", join=a.address)
    lost: list[str] = []
    a.on_connection_event(lambda peer, event, _d: lost.append(peer) if event == "lost" else None)
    try:
        await b.start()
        await c.start()
        link = b._peers["a"].link
        assert link is not None and not link.compress  # a did not offer lz4
        link.compress = True  # b now behaves as a crafted peer: compresses anyway
        sender = asyncio.create_task(b.send("a", "x", np.zeros(MiB, np.uint8)))
        await wait_for(lambda: "b" in lost, timeout=10)
        assert a.router.mailbox("x").qsize() == 0  # nothing was inflated and delivered
        # the node and its other connections keep working
        await c.send("a", "y", "still here")
        assert await a.recv("y", timeout=5) == "still here"
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
    finally:
        await c.stop()
        await b.stop()
        await a.stop()


async def test_compression_negotiated_between_nodes_round_trips() -> None:
    a = _node("a", "lz4")
    await a.start()
    b = _node("b", "lz4", join=a.address)
    try:
        await b.start()
        assert b._peers["a"].link.compress
        arr = np.zeros(MiB, np.uint8)
        arr[::4096] = 7
        await b.send("a", "x", arr)
        np.testing.assert_array_equal(await a.recv("x", timeout=5), arr)
    finally:
        await b.stop()
        await a.stop()


async def test_unread_mailbox_stays_bounded_with_compressible_messages() -> None:
    """mailbox_bytes counts decompressed bytes: 64 messages of 1 MiB zeros (4 KiB each on the
    wire) must not all land in a 16 MiB mailbox (before the fix they did: 2 GiB in 10 s)."""
    b = _node("b", "lz4", mailbox_bytes=16 * MiB)
    await b.start()
    a = _node("a", "lz4", join=b.address)
    n = 64
    try:
        await a.start()
        assert a._peers["b"].link.compress
        msg = np.zeros(MiB, np.uint8)

        async def produce() -> None:
            for _ in range(n):
                await a.send("b", "big", msg)

        producer = asyncio.create_task(produce())
        mb = b.router.mailbox("big")
        # Either the reader pauses on a full mailbox (a put waits), or everything arrived.
        await wait_for(lambda: bool(mb._putters) or mb.qsize() == n, timeout=30)
        held = mb.qsize()
        assert held <= 16, f"{held} MiB of decompressed messages held by a 16 MiB mailbox"
        assert mb.nbytes >= held * MiB  # the count is of decompressed bytes
        assert mb.nbytes <= 16 * MiB + 4096
        got = [await b.recv("big", timeout=10) for _ in range(n)]  # reading resumes delivery
        assert all(x.nbytes == MiB and not x.any() for x in got)
        await asyncio.wait_for(producer, 10)
    finally:
        await a.stop()
        await b.stop()


# ----------------------------------------------------------------------------- item 10
def _ndarray_header(wire: Any, shape: list[int] | None = None) -> bytes:
    return msgpack.packb(_ext(S.EXT_NDARRAY, [wire, shape or [0], False, b""]))


def _nested(levels: int) -> Any:
    wire: Any = "<u1"
    for _ in range(levels):
        wire = [["n", wire]]
    return wire


def test_dtype_with_500k_fields_is_rejected_quickly() -> None:
    ser = Serializer()
    header = _ndarray_header([[f"f{i}", "<u1"] for i in range(500_000)])
    assert len(header) > 6_000_000
    t = time.perf_counter()
    with pytest.raises(DecodeError):
        ser.loads([header])
    assert time.perf_counter() - t < 0.1


@pytest.mark.parametrize(
    ("wire", "bounds", "seconds"),
    [
        # The fields spread over nested levels, each list short: the total is what counts. The
        # 6 MB of msgpack are still unpacked (linear, like any header that size) before the
        # walk stops at the field limit; numpy never sees it (before: seconds).
        ([[f"g{i}", [[f"f{j}", "<u1"] for j in range(1000)]] for i in range(500)], True, 1.0),
        (_nested(MAX_DTYPE_DEPTH + 1), True, 0.1),  # too deep
        # a subarray whose itemsize overflows (numpy refuses it), or has too many dimensions
        ([["a", "<f8", [2**31 - 1, 2**31 - 1, 2**31 - 1]]], False, 0.1),
        ([["a", "<f8", [1] * 40]], True, 0.1),
        # huge names and titles
        ([["x" * 100_000, "<u1"]], True, 0.1),
        ([[["t" * 100_000, "x"], "<u1"]], True, 0.1),
    ],
    ids=["500k-nested", "too-deep", "itemsize-overflow", "too-many-dims", "long-name", "long-title"],
)
def test_hostile_dtype_descriptions_are_rejected_quickly(wire: Any, bounds: bool, seconds: float) -> None:
    header = _ndarray_header(wire)
    t = time.perf_counter()
    with pytest.raises(DecodeError):
        Serializer().loads([header])
    assert time.perf_counter() - t < seconds
    if bounds:  # what staging.py checks before numpy parses a device array header
        with pytest.raises(DecodeError):
            check_descr_bounds(wire)


def test_itemsize_above_the_frame_limit_is_rejected() -> None:
    ser = Serializer(limits=LimitsSection(max_frame_bytes=MiB))
    with pytest.raises(DecodeError, match="max_frame_bytes"):
        ser.loads([_ndarray_header([["a", "<f8", [1024, 1024]]])])
    with pytest.raises(DecodeError, match="max_frame_bytes"):
        ser.loads([_ndarray_header("|V2000000")])


def test_device_array_header_dtype_is_bounded() -> None:
    """The staging header (XFER chunk 0 / device records) is checked before numpy too."""
    check_descr_bounds([("a", "<f4"), ("b", [("c", "<i2", (2, 3))])])
    check_descr_bounds("<f8")
    with pytest.raises(DecodeError, match="fields"):
        check_descr_bounds([(f"f{i}", "<u1") for i in range(500_000)])


LEGIT_DTYPES = [
    np.dtype([("x", "<f8"), ("y", "<i4")]),
    np.dtype([("pos", "<f4", (3,)), ("id", "<u8"), ("name", "S8")]),
    np.dtype([("outer", [("inner", [("deep", "<i2", (2, 2))]), ("t", "<M8[ns]")]), ("z", "<c16")]),
    np.dtype({"names": ["a", "b"], "formats": ["<i4", "<f8"], "titles": ["Alpha", "Beta"]}),
    np.dtype({"names": ["a", "b"], "formats": ["u1", "<i8"], "offsets": [0, 8], "itemsize": 24}),
    np.dtype([(f"f{i}", "<f4") for i in range(200)]),
]


@pytest.mark.parametrize("dt", LEGIT_DTYPES, ids=range(len(LEGIT_DTYPES)))
def test_legit_structured_dtypes_round_trip(dt: np.dtype) -> None:
    ser = Serializer(oob_min_bytes=64)
    arr = np.zeros(5, dt)
    arr.view(np.uint8)[:] = np.arange(arr.nbytes) % 7 + 1  # small bytes: no float NaN, so == works
    out = ser.loads(ser.dumps(arr))
    assert out.dtype == dt
    assert out.tobytes() == arr.tobytes()
    scalar = ser.loads(ser.dumps(arr[1]))
    assert scalar.dtype == dt and scalar == arr[1]  # compared by field: padding bytes are not kept


_BASES = st.sampled_from(["<f8", "<f4", "<i4", "|u1", "<u2", "|b1", "<c8", "S3", "<U2", "<m8[s]", "<M8[us]", "V4"])
_NAMES = st.text(alphabet="abcdefghij_", min_size=1, max_size=6)


def _fields(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    field = st.tuples(_NAMES, children, st.lists(st.integers(1, 3), max_size=2).map(tuple))
    return st.lists(field, min_size=1, max_size=5, unique_by=lambda f: f[0]).map(
        lambda fs: [(n, t, s) if s else (n, t) for n, t, s in fs]
    )


_DTYPES = st.recursive(_BASES, _fields, max_leaves=12).filter(lambda d: not isinstance(d, str)).map(np.dtype)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dt=_DTYPES, n=st.integers(0, 3))
def test_property_structured_dtypes_round_trip(dt: np.dtype, n: int) -> None:
    ser = Serializer(oob_min_bytes=32)
    arr = np.zeros(n, dt)
    if arr.nbytes:
        arr.view(np.uint8)[:] = np.random.default_rng(n).integers(0, 256, arr.nbytes, dtype=np.uint8)
    out = ser.loads(ser.dumps(arr))
    assert out.dtype == dt and out.shape == arr.shape
    assert out.tobytes() == arr.tobytes()


_WIRE = st.recursive(
    st.one_of(st.text(max_size=8), st.integers(-3, 2**40), st.sampled_from(["<f8", "|u1", "S0", "O", "<M8[xx]"])),
    lambda kids: st.lists(kids, max_size=4),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(wire=_WIRE, shape=st.lists(st.integers(0, 4), max_size=3))
def test_property_hostile_wire_dtypes_fail_typed(wire: Any, shape: list[int]) -> None:
    """Any descr a peer sends yields an array or a ProtocolError, never another exception."""
    try:
        Serializer().loads([_ndarray_header(wire, shape)])
    except ProtocolError:
        pass


# ----------------------------------------------------------------------------- item 19
@dataclasses.dataclass
class Unregistered:
    x: int


def test_unregistered_dataclass_error_names_node_register_type() -> None:
    ser = Serializer()
    with pytest.raises(SerializationError, match=r"node\.register_type\(Unregistered\)"):
        ser.dumps(Unregistered(1))
    sender = Serializer()
    sender.register(Unregistered)
    with pytest.raises(DecodeError, match=r"node\.register_type\(cls\)"):
        ser.loads(sender.dumps(Unregistered(1)))


async def test_unregistered_dataclass_error_from_node_send() -> None:
    a = _node("a", "none")
    await a.start()
    b = _node("b", "none", join=a.address)
    try:
        await b.start()
        with pytest.raises(SerializationError, match=r"node\.register_type\(Unregistered\)"):
            await b.send("a", "x", Unregistered(1))
    finally:
        await b.stop()
        await a.stop()
