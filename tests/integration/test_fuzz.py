"""Hostile input: the frame decoder, the handshake parser, the serializer and a live node fed
arbitrary bytes. Only aionet ProtocolError subclasses may escape, memory stays within the
configured limits, and a node keeps serving legitimate peers afterwards.

Hypothesis budgets are small and deadlines bounded so the whole file runs in seconds; the
optional coverage-guided harness for long runs is ``benchmarks/fuzz_atheris.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import struct
import threading
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import lz4.block
import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aionet import Node, PeerUnavailable
from aionet.codecs import handshake
from aionet.codecs.extensions import EXT_BUFFER, EXT_NDARRAY, EXT_TUPLE
from aionet.codecs.framing import MAGIC, VERSION, FrameDecoder, encode
from aionet.codecs.serialize import Serializer
from aionet.config import Config, LimitsSection
from aionet.errors import DecodeError, ProtocolError

# FUZZ_SCALE=20 python3 -m pytest tests/integration/test_fuzz.py  runs 20x the examples (a longer local hunt).
_SCALE = max(1, int(os.environ.get("FUZZ_SCALE", "1")))
FAST = settings(max_examples=150 * _SCALE, deadline=10_000, suppress_health_check=[HealthCheck.too_slow])
LIVE = settings(max_examples=30 * _SCALE, deadline=20_000, suppress_health_check=[HealthCheck.too_slow])

# Small limits so that hostile sizes are reachable and allocations are easy to bound.
LIMITS = LimitsSection(
    max_message_bytes=1 << 20,
    max_frame_bytes=512 << 10,
    max_header_bytes=64 << 10,
    max_frames=16,
    max_str_len=64 << 10,
    max_bin_len=64 << 10,
    max_array_len=4096,
    max_map_len=4096,
    max_depth=16,
)
LARGE = 256  # frames from this size take the allocate-and-receive-in-place path


class RecordingAlloc:
    """A FrameDecoder ``alloc`` that records every size it is asked for."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __call__(self, n: int) -> bytearray:
        self.sizes.append(n)
        assert n <= LIMITS.max_frame_bytes, f"decoder allocated {n} bytes, above max_frame_bytes"
        return bytearray(n)


def _decoder() -> tuple[FrameDecoder, RecordingAlloc]:
    alloc = RecordingAlloc()
    return FrameDecoder(LIMITS, alloc=alloc, large_frame_bytes=LARGE, staging_bytes=1024), alloc


def _chunks(data: bytes, cuts: list[int]) -> Iterator[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    for a, b in itertools.pairwise(points):
        yield data[a:b]


def _feed_all(dec: FrameDecoder, data: bytes, cuts: list[int]) -> list[list[bytes]]:
    """Feed ``data`` split at ``cuts``; returns the messages (as bytes) or raises ProtocolError."""
    out: list[list[bytes]] = []
    for chunk in _chunks(data, cuts):
        for msg in dec.feed(chunk):
            out.append([bytes(f) for f in msg])
        assert dec.pending_bytes <= LIMITS.max_message_bytes + 8 + 8 * LIMITS.max_frames + 2048
    return out


# ---------------------------------------------------------------- frame decoder
frames_st = st.lists(st.one_of(st.binary(max_size=64), st.binary(min_size=LARGE, max_size=2 * LARGE + 7)), max_size=5)
cuts_st = st.lists(st.integers(min_value=0, max_value=1 << 16), max_size=20)


@FAST
@given(data=st.binary(max_size=4096), cuts=cuts_st)
def test_decoder_arbitrary_bytes(data: bytes, cuts: list[int]) -> None:
    dec, alloc = _decoder()
    try:
        _feed_all(dec, data, cuts)
    except ProtocolError:
        with pytest.raises(ProtocolError):  # a failed decoder stays failed
            dec.feed(b"AN")
    assert sum(alloc.sizes) <= len(data) + LIMITS.max_frame_bytes  # at most one frame ahead of the data


@FAST
@given(
    prefix_kind=st.sampled_from(["none", "preamble", "table"]),
    nframes=st.integers(min_value=0, max_value=2**32 - 1),
    lengths=st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=6),
    tail=st.binary(max_size=512),
    cuts=cuts_st,
)
def test_decoder_hostile_headers(prefix_kind: str, nframes: int, lengths: list[int], tail: bytes, cuts: list[int]):
    """Valid magic and version, then arbitrary frame counts and lengths (up to 2**64-1)."""
    data = MAGIC + bytes((VERSION, 0)) + struct.pack("<I", nframes)
    if prefix_kind != "none":
        data += b"".join(struct.pack("<Q", n) for n in lengths)
    data += tail
    dec, alloc = _decoder()
    with contextlib.suppress(ProtocolError):
        _feed_all(dec, data, cuts)
    assert all(n <= LIMITS.max_frame_bytes for n in alloc.sizes)


@FAST
@given(messages=st.lists(frames_st, min_size=1, max_size=6), cuts=cuts_st)
def test_decoder_valid_stream_any_chunking(messages: list[list[bytes]], cuts: list[int]) -> None:
    data = b"".join(b"".join(bytes(p) for p in encode(m)) for m in messages)
    dec, _alloc = _decoder()
    assert _feed_all(dec, data, cuts) == messages
    assert dec.pending_bytes == 0


@FAST
@given(messages=st.lists(frames_st, min_size=1, max_size=4), pos=st.integers(min_value=0), junk=st.binary(max_size=64))
def test_decoder_corrupted_stream(messages: list[list[bytes]], pos: int, junk: bytes) -> None:
    data = bytearray(b"".join(b"".join(bytes(p) for p in encode(m)) for m in messages))
    pos %= len(data) + 1
    data[pos : pos + len(junk)] = junk
    dec, alloc = _decoder()
    with contextlib.suppress(ProtocolError):
        _feed_all(dec, bytes(data), [pos, pos + 1])
    assert all(n <= LIMITS.max_frame_bytes for n in alloc.sizes)


# ---------------------------------------------------------------- handshake parser
msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=20,
)


def _hello_fields() -> list[Any]:
    h = handshake.Hello(handshake.PROTOCOL_VERSION, "a", "id", ["tcp://h:1"], {}, {}, b"n" * 16, b"", {})
    return msgpack.unpackb(h.encode())


def _only_protocol_errors(fn: Any, frames: list[Any]) -> None:
    try:
        fn(frames)
    except ProtocolError:
        pass


@FAST
@given(data=st.binary(max_size=512))
def test_handshake_parsers_on_bytes(data: bytes) -> None:
    _only_protocol_errors(handshake.parse, [data])
    _only_protocol_errors(handshake.parse_confirm, [data])


@FAST
@given(
    value=msgpack_values,
    head=st.sampled_from([handshake.HELLO, handshake.CONFIRM, handshake.REJECT, 3, "x"]),
    index=st.integers(min_value=0, max_value=12),
    nframes=st.integers(min_value=0, max_value=3),
)
def test_handshake_parsers_on_structures(value: Any, head: Any, index: int, nframes: int) -> None:
    # arbitrary structures, with a plausible first element
    raw = msgpack.packb([head, value])
    _only_protocol_errors(handshake.parse, [raw] * nframes)
    _only_protocol_errors(handshake.parse_confirm, [raw])
    # a valid HELLO with one field replaced (or appended)
    fields = _hello_fields()
    if index < len(fields):
        fields[index] = value
    else:
        fields.append(value)
    _only_protocol_errors(handshake.parse, [msgpack.packb(fields)])
    _only_protocol_errors(handshake.parse_confirm, [msgpack.packb([handshake.CONFIRM, value, value])])


# ---------------------------------------------------------------- serializer
SER = Serializer(limits=LIMITS, compression="lz4", oob_min_bytes=64)
ext_st = st.builds(
    lambda code, payload: msgpack.packb(msgpack.ExtType(code, payload)),
    st.integers(min_value=0, max_value=127) | st.sampled_from([EXT_BUFFER, EXT_NDARRAY, EXT_TUPLE]),
    st.binary(max_size=64) | msgpack_values.map(lambda v: msgpack.packb(v)),
)


@FAST
@given(
    frames=st.lists(st.binary(max_size=256) | ext_st | msgpack_values.map(msgpack.packb), max_size=5),
)
def test_serializer_loads_arbitrary_frame_lists(frames: list[bytes]) -> None:
    try:
        SER.loads(frames)
    except ProtocolError:
        pass


@FAST
@given(
    dtype=st.text(max_size=12) | st.sampled_from(["<f8", "|u1", "<i4"]),
    shape=st.lists(st.integers(min_value=-2, max_value=2**62), max_size=6),
    ref=st.integers(min_value=-1, max_value=3) | st.binary(max_size=32),
    nframes=st.integers(min_value=0, max_value=3),
)
def test_serializer_hostile_array_records(dtype: str, shape: list[int], ref: Any, nframes: int) -> None:
    header = msgpack.packb(msgpack.ExtType(EXT_NDARRAY, msgpack.packb([dtype, shape, False, ref])))
    try:
        SER.loads([header] + [bytearray(16)] * nframes)
    except ProtocolError:
        pass


def _peak_alloc(fn: Any) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("claimed", [2**40, 2**63 - 1, LIMITS.max_frame_bytes + 1, 300 * 1024])
def test_lz4_bomb_is_rejected_without_allocating(claimed: int) -> None:
    """A tiny lz4 frame claiming a huge decompressed size (2**40) fails with DecodeError."""
    data = lz4.block.compress(bytes(4096), store_size=False)  # 4 KiB of zeros: a few dozen bytes
    buf = msgpack.packb([0, [1, "lz4", claimed]])  # EXT_BUFFER: kind bytes, compressed frame 1
    header = msgpack.packb(msgpack.ExtType(EXT_BUFFER, buf))

    def go() -> None:
        with pytest.raises(DecodeError):
            SER.loads([header, data])

    assert _peak_alloc(go) < 1 << 20


def test_lz4_real_bomb_over_the_limit() -> None:
    """Highly compressible data whose true size exceeds max_frame_bytes is refused up front."""
    raw = bytes(LIMITS.max_frame_bytes * 2)
    data = lz4.block.compress(raw, store_size=False)
    arr = msgpack.packb(["|u1", [len(raw)], False, [1, "lz4", len(raw)]])
    header = msgpack.packb(msgpack.ExtType(EXT_NDARRAY, arr))
    with pytest.raises(DecodeError, match="exceeds"):
        SER.loads([header, data])
    # a claim smaller than the truth is corrupt data, not an overflow
    arr = msgpack.packb(["|u1", [1024], False, [1, "lz4", 1024]])
    with pytest.raises(DecodeError):
        SER.loads([msgpack.packb(msgpack.ExtType(EXT_NDARRAY, arr)), data])


MSGPACK_BOMBS = {
    "deep array nesting": b"\x91" * 60_000 + b"\xc0",
    "deep map nesting": b"\x81\xa1k" * 20_000 + b"\xc0",
    "array claims 2**32-1 items": b"\xdd\xff\xff\xff\xff",
    "map claims 2**32-1 pairs": b"\xdf\xff\xff\xff\xff",
    "str claims 4 GiB": b"\xdb\xff\xff\xff\xff" + b"x" * 16,
    "bin claims 4 GiB": b"\xc6\xff\xff\xff\xff" + b"x" * 16,
    "ext claims 4 GiB": b"\xc9\xff\xff\xff\xff\x07" + b"x" * 16,
    "array within limit but no items": b"\xdc\x10\x00",
    "deep tuple extension nesting": b"",  # built below
    "array one above max_array_len": b"\xdd\x00\x00\x10\x01" + b"\x90" * 4097,
}


def _deep_tuples(depth: int) -> bytes:
    inner: Any = None
    for _ in range(depth):
        inner = msgpack.ExtType(EXT_TUPLE, msgpack.packb([inner]))
    return msgpack.packb(inner)


@pytest.mark.parametrize("name", sorted(MSGPACK_BOMBS))
def test_msgpack_bombs_are_decode_errors(name: str) -> None:
    bomb = MSGPACK_BOMBS[name] or _deep_tuples(LIMITS.max_depth + 5)

    def go() -> None:
        with pytest.raises(DecodeError):
            SER.loads([bomb])
        with pytest.raises(DecodeError):
            SER.loads([bomb, b"x" * 100])
        with pytest.raises(ProtocolError):
            handshake.parse([bomb])

    assert _peak_alloc(go) < 8 << 20, "a bomb made the decoder allocate far more than its input"


def test_header_above_limit_is_rejected_before_unpacking() -> None:
    with pytest.raises(ProtocolError):
        SER.loads([b"\xc4" + bytes(LIMITS.max_header_bytes + 10)])


# ---------------------------------------------------------------- a live node
class _LiveNode:
    """Node "target" (and a legitimate peer "friend") on a loop in a background thread, so that
    synchronous hypothesis tests can attack it over raw sockets."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop_errors: list[str] = []  # unhandled exceptions in the node's tasks
        self.loop.set_exception_handler(
            lambda _loop, ctx: self.loop_errors.append(f"{ctx.get('message')}: {ctx.get('exception')!r}")
        )
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzz-node", daemon=True)
        self.thread.start()
        cfg = Config.from_dict({"link": {"handshake_timeout": 0.5}, "log": {"level": "error"}}, env={})
        self.target = Node(name="target", listen="tcp://127.0.0.1:0", config=cfg)
        self.friend = Node(name="friend", listen="tcp://127.0.0.1:0")
        self.run(self.target.start())
        self.run(self.friend.start())
        host, port = self.target.address.removeprefix("tcp://").rsplit(":", 1)
        self.addr = (host, int(port))
        self.run(self.friend.connect(self.target.address))

    def run(self, coro: Any, timeout: float = 20) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def echo_ok(self) -> bool:
        token = os.urandom(8)
        return self.run(self.friend.request("target", "aionet.echo", token, timeout=5)) == token

    def close(self) -> None:
        self.run(self.friend.stop())
        self.run(self.target.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def live() -> Iterator[_LiveNode]:
    node = _LiveNode()
    yield node
    node.close()
    import gc

    gc.collect()  # surfaces "Task exception was never retrieved"
    assert not node.loop_errors, node.loop_errors[:5]


def _framed(frames: list[bytes]) -> bytes:
    return b"".join(bytes(p) for p in encode(frames))


def _recv_message(sock: socket.socket, timeout: float = 2.0) -> list[bytes] | None:
    dec = FrameDecoder()
    sock.settimeout(timeout)
    while True:
        try:
            data = sock.recv(65536)
        except (TimeoutError, OSError):
            return None
        if not data:
            return None
        msgs = dec.feed(data)
        if msgs:
            return [bytes(f) for f in msgs[0]]


def _handshake(sock: socket.socket, name: str) -> bool:
    """Do a legitimate (token-less, loopback) handshake as node ``name``."""
    hello = handshake.Hello(handshake.PROTOCOL_VERSION, name, os.urandom(8).hex(), [], {}, {}, handshake.new_nonce())
    sock.sendall(_framed([hello.encode()]))
    reply = _recv_message(sock)
    if reply is None:
        return False
    handshake.parse(reply)
    sock.sendall(_framed([handshake.Confirm(b"").encode()]))
    if _recv_message(sock) is None:  # WELCOME
        return False
    sock.sendall(_framed([handshake.State(handshake.RESUME).encode()]))
    return True


def _attack(addr: tuple[str, int], chunks: list[bytes], name: str | None) -> None:
    with socket.create_connection(addr, timeout=5) as sock:
        if name is not None and not _handshake(sock, name):
            return
        with contextlib.suppress(OSError):
            for c in chunks:
                sock.sendall(c)
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(0.2)
            with contextlib.suppress(TimeoutError, OSError):
                while sock.recv(65536):
                    pass


envelope_st = st.one_of(
    msgpack_values,
    st.tuples(st.integers(min_value=-2, max_value=20), msgpack_values, msgpack_values, msgpack_values).map(list),
    st.tuples(
        st.integers(min_value=1, max_value=7),
        st.integers(min_value=0, max_value=3),
        st.just(0),
        msgpack_values,
        msgpack_values,
        msgpack_values,
    ).map(list),
)
garbage_st = st.one_of(
    st.binary(max_size=300),
    st.binary(max_size=64).map(lambda b: MAGIC + bytes((VERSION, 0)) + b),
    st.lists(st.binary(max_size=100), max_size=4).map(_framed),
    envelope_st.map(lambda v: _framed([msgpack.packb(v)])),
)


# The node's reconnect jitter uses the random module in the background thread.
quiet_random = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")


@quiet_random
@LIVE
@given(chunks=st.lists(garbage_st, min_size=1, max_size=4))
def test_live_node_survives_garbage_before_handshake(live: _LiveNode, chunks: list[bytes]) -> None:
    _attack(live.addr, chunks, name=None)
    assert live.echo_ok()


@quiet_random
@LIVE
@given(chunks=st.lists(garbage_st, min_size=1, max_size=4), n=st.integers(min_value=0, max_value=10**6))
def test_live_node_survives_garbage_after_handshake(live: _LiveNode, chunks: list[bytes], n: int) -> None:
    _attack(live.addr, chunks, name=f"fuzz-{n}")
    assert live.echo_ok()


def test_live_node_survives_bombs_and_floods(live: _LiveNode) -> None:
    attacks = [
        [MAGIC + bytes((VERSION, 0)) + struct.pack("<I", 2**32 - 1)],  # frame count bomb
        [MAGIC + bytes((VERSION, 0)) + struct.pack("<IQ", 1, 2**63)],  # header size bomb
        [MAGIC + bytes((99, 0)) + bytes(8)],  # unknown version
        [_framed([b"\xdd\xff\xff\xff\xff"])],  # msgpack length bomb as a HELLO
        [_framed([b"\x91" * 50_000 + b"\xc0"])],  # msgpack nesting bomb as a HELLO
        [os.urandom(1 << 20)],  # a megabyte of noise
    ]
    for chunks in attacks:
        _attack(live.addr, chunks, name=None)
    for chunks in attacks[3:]:
        _attack(live.addr, chunks, name="fuzz-bomber")
    arr = np.arange(1000)
    bomb = lz4.block.compress(bytes(1 << 16), store_size=False)
    rec = msgpack.packb(["<i8", [1 << 37], False, [1, "lz4", 1 << 40]])
    lz4_bomb = [msgpack.packb([1, 1, 0, "ch", msgpack.ExtType(EXT_NDARRAY, rec)]), bomb]
    _attack(live.addr, [_framed(lz4_bomb)], name="fuzz-lz4")
    # many half-open connections at once (below the unauthenticated cap), then a real request
    socks = [socket.create_connection(live.addr, timeout=5) for _ in range(20)]
    try:
        for s in socks:
            s.sendall(b"AN")
        assert live.echo_ok()
    finally:
        for s in socks:
            s.close()
    assert live.run(live.friend.request("target", "aionet.echo", arr, timeout=5)).tolist() == arr.tolist()


def test_peers_envelope_with_a_non_dict_table_is_a_protocol_error() -> None:
    """Regression: an AttributeError used to escape the reader as an unretrieved task error."""
    node = _LiveNode()
    try:
        _attack(node.addr, [_framed([msgpack.packb([5, 1, 0, [1, 2]])])], name="evil")  # PEERS, seq 1
        assert node.echo_ok()
    finally:
        node.close()
    import gc

    gc.collect()
    assert not node.loop_errors, node.loop_errors


def test_a_peer_cannot_answer_requests_sent_to_another_peer() -> None:
    """A hostile peer forging replies for every plausible request id gets cut off; the request
    to the real peer stays pending (it would time out)."""
    node = _LiveNode()
    try:

        @node.friend.service("test.never")
        async def never(_: Any) -> None:
            await asyncio.Event().wait()

        pending = asyncio.run_coroutine_threadsafe(
            node.target.request("friend", "test.never", None, timeout=1.5), node.loop
        )
        time.sleep(0.2)
        spoofed = [_framed([msgpack.packb([3, seq, 0, seq, "forged"])]) for seq in range(1, 200)]  # REP
        _attack(node.addr, spoofed, name="evil")
        try:
            result = pending.result(10)
        except (TimeoutError, PeerUnavailable):
            return  # only friend may answer, and it never does
        assert result != "forged", "a third peer answered a request sent to friend"
    finally:
        node.close()
