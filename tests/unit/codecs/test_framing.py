"""Sans-I/O framing: round trips, every split point, garbage, limits, large-frame placement."""

from __future__ import annotations

import ast
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aionet.codecs import framing
from aionet.codecs.framing import MAGIC, VERSION, FrameDecoder, encode
from aionet.config import LimitsSection
from aionet.errors import (
    BadMagic,
    FrameTooLarge,
    ProtocolError,
    SerializationError,
    TooManyFrames,
    UnsupportedVersion,
)

LARGE = 64  # small large-frame threshold so the large path is exercised by small data


class RecordingAlloc:
    """An ``alloc`` that remembers every buffer it handed out."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.buffers: list[bytearray] = []

    def __call__(self, n: int) -> bytearray:
        self.sizes.append(n)
        buf = bytearray(n)
        self.buffers.append(buf)
        return buf


def wire(messages: list[list[Any]]) -> bytes:
    return b"".join(bytes(part) for m in messages for part in encode(m))


def frames_of(messages: list[list[Any]]) -> list[list[bytes]]:
    return [[bytes(f) for f in m] for m in messages]


def decoder(**kw: Any) -> FrameDecoder:
    kw.setdefault("large_frame_bytes", LARGE)
    kw.setdefault("staging_bytes", 256)
    return FrameDecoder(kw.pop("limits", None), **kw)


def preamble(nframes: int, magic: bytes = MAGIC, version: int = VERSION, flags: int = 0) -> bytes:
    return struct.pack("<2sBBI", magic, version, flags, nframes)


frame_st = st.one_of(
    st.binary(max_size=40),
    st.binary(min_size=LARGE - 2, max_size=3 * LARGE),
    st.binary(max_size=300).map(bytearray),
    st.binary(max_size=300).map(memoryview),
)
message_st = st.lists(frame_st, max_size=6)
messages_st = st.lists(message_st, min_size=1, max_size=8)


# ------------------------------------------------------------------------- round trips
@given(messages_st)
@settings(max_examples=200, deadline=None)
def test_round_trip_arbitrary_messages(messages: list[list[Any]]) -> None:
    dec = decoder()
    assert frames_of(dec.feed(wire(messages))) == frames_of(messages)
    assert dec.pending_bytes == 0


@given(messages_st, st.data())
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_chunkings_give_the_same_messages(messages: list[list[Any]], data: st.DataObject) -> None:
    stream = wire(messages)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    dec = decoder()
    out = []
    prev = 0
    for cut in [*cuts, len(stream)]:
        out += dec.feed(stream[prev:cut])
        prev = cut
    assert frames_of(out) == frames_of(messages)


def test_every_split_point_gives_the_same_messages() -> None:
    messages: list[list[Any]] = [
        [],
        [b""],
        [b"small"],
        [b"h" * 10, b"L" * 200, b"", b"t" * 7],  # a large frame between small ones
        [b"x" * 100],  # a 1-frame large message
        [b"a"] * 5,
        [b"z" * 63, b"q" * 64],  # just below / at the threshold
    ]
    stream = wire(messages)
    expect = frames_of(messages)
    for i in range(len(stream) + 1):
        for j in (i, min(len(stream), i + 17)):
            dec = decoder()
            out = dec.feed(stream[:i]) + dec.feed(stream[i:j]) + dec.feed(stream[j:])
            assert frames_of(out) == expect, (i, j)


def test_byte_by_byte() -> None:
    messages = [[b"abc", b"D" * 150], [], [b"x"] * 3]
    dec = decoder()
    out = []
    for b in wire(messages):
        out += dec.feed(bytes([b]))
    assert frames_of(out) == frames_of(messages)


@pytest.mark.parametrize(
    "message",
    [[], [b""], [b"only"], [bytes([i]) * i for i in range(256)], [b""] * 256],
    ids=["0-frames", "1-empty-frame", "1-frame", "256-frames", "256-empty-frames"],
)
def test_edge_shapes(message: list[bytes]) -> None:
    dec = decoder()
    assert frames_of(dec.feed(wire([message, message]))) == [message, message]


def test_many_small_messages_in_one_buffer_default_sizes() -> None:
    messages = [[i.to_bytes(4, "little") * 16] for i in range(20000)]
    dec = FrameDecoder()
    out = dec.feed(wire(messages))
    assert out == messages
    assert all(type(m[0]) is bytes for m in out)
    assert dec.delivered_bytes == 64 * 20000


def read_into(dec: FrameDecoder, data: bytes) -> list[list[Any]]:
    """One kernel read of ``data`` (it must fit where get_buffer points)."""
    buf = dec.get_buffer(len(data))
    buf[: len(data)] = data
    return dec.buffer_updated(len(data))


def test_reads_of_one_message_each_as_in_a_request_reply_exchange() -> None:
    """A read holding exactly one small message (the request/reply case, taken by a shorter
    path) gives it as ``bytes``, counts its bytes, and still enforces the limits."""
    limits = LimitsSection(max_header_bytes=2000, max_frame_bytes=10_000, max_message_bytes=20_000)
    dec = FrameDecoder(limits, large_frame_bytes=4096, staging_bytes=16384)
    sizes = [0, 1, 64, 1023, 1024, 2000]
    for n in sizes:
        payload = bytes([n % 251]) * n
        out = read_into(dec, wire([[payload]]))
        assert out == [[payload]] and type(out[0][0]) is bytes
    assert dec.delivered_bytes == sum(sizes)
    # a large message, then single small ones again: each read still one whole message
    assert frames_of(read_into(dec, wire([[b"h", b"L" * 5000]]))) == [[b"h", b"L" * 5000]]
    for i in range(3):
        assert read_into(dec, wire([[b"m%d" % i]])) == [[b"m%d" % i]]
    # over max_header_bytes in one frame: refused, not taken by the short path
    with pytest.raises(FrameTooLarge):
        read_into(dec, wire([[b"x" * 2001]]))


def test_small_frames_are_bytes_and_large_frames_are_writable() -> None:
    dec = decoder()
    (msg,) = dec.feed(wire([[b"hdr", b"x" * 500]]))
    assert type(msg[0]) is bytes
    assert not memoryview(msg[1]).readonly
    memoryview(msg[1])[0] = 0  # owned by the receiver


def test_pending_bytes_and_eof() -> None:
    stream = wire([[b"a" * 10, b"b" * 100]])
    dec = decoder()
    assert dec.feed(stream[:-5]) == []
    assert dec.pending_bytes == len(stream) - 5 - 8 - 16  # payload received so far
    with pytest.raises(ProtocolError, match="middle of a message"):
        dec.eof()
    clean = decoder()
    clean.feed(stream)
    clean.eof()  # between messages: fine


# ------------------------------------------------------------------------- encode
def test_encode_never_copies_large_frames() -> None:
    big = bytearray(5000)
    arr = np.arange(1000, dtype=np.float64)
    out = encode([b"header", big, arr])
    assert out[1] is big
    assert isinstance(out[2], memoryview) and out[2].nbytes == arr.nbytes and out[2].format == "B"
    assert bytes(out[2]) == arr.tobytes()
    assert out[0].endswith(b"header")  # small header merged into the prefix
    one = encode([b"y" * 5000])
    assert len(one) == 2 and one[1] == b"y" * 5000


def test_encode_merges_small_single_frames() -> None:
    (only,) = encode([b"x" * 64])
    assert len(only) == 16 + 64


def test_encode_rejects_non_contiguous() -> None:
    with pytest.raises(SerializationError):
        encode([np.arange(10)[::2]])
    with pytest.raises(SerializationError):
        encode([object()])


def test_multidimensional_frames_are_sent_as_bytes() -> None:
    arr = np.arange(12, dtype=np.int32).reshape(3, 4)
    (msg,) = decoder().feed(wire([[b"h", arr]]))
    assert bytes(msg[1]) == arr.tobytes()


# ------------------------------------------------------------------------- bad input
def check_fails(dec: FrameDecoder, data: bytes, err: type[Exception]) -> ProtocolError:
    with pytest.raises(err) as info:
        dec.feed(data)
    exc = info.value
    assert isinstance(exc, ProtocolError)
    # failed for good: every later call raises the same error
    for call in (lambda: dec.feed(wire([[b"ok"]])), dec.get_buffer, lambda: dec.buffer_updated(0), dec.eof):
        with pytest.raises(err) as again:
            call()
        assert again.value is exc
    return exc


def test_wrong_magic() -> None:
    exc = check_fails(decoder(), b"GET / HTTP/1.1\r\n\r\n", BadMagic)
    assert "GET" in str(exc)


def test_wrong_magic_detected_from_the_first_bytes() -> None:
    check_fails(decoder(), b"X", BadMagic)
    check_fails(decoder(), b"AX", BadMagic)


def test_wrong_version() -> None:
    check_fails(decoder(), preamble(1, version=VERSION + 1), UnsupportedVersion)
    check_fails(decoder(), MAGIC + bytes([VERSION + 7]), UnsupportedVersion)


def test_reserved_flags() -> None:
    check_fails(decoder(), preamble(1, flags=1), ProtocolError)


def test_bad_message_after_good_ones() -> None:
    dec = decoder()
    assert dec.feed(wire([[b"fine"]] * 3)) == [[b"fine"]] * 3
    check_fails(dec, b"\x00" * 16, BadMagic)


@given(st.binary(min_size=1, max_size=200))
@settings(max_examples=300, deadline=None)
def test_garbage_never_crashes_or_allocates(data: bytes) -> None:
    alloc = RecordingAlloc()
    limits = LimitsSection(max_message_bytes=4096, max_frame_bytes=2048, max_header_bytes=1024, max_frames=16)
    dec = FrameDecoder(limits, alloc=alloc, large_frame_bytes=LARGE, staging_bytes=256)
    try:
        dec.feed(data)
    except ProtocolError:
        pass
    assert all(n <= 2048 for n in alloc.sizes)


def test_huge_announcement_raises_before_allocating() -> None:
    import tracemalloc

    alloc = RecordingAlloc()
    dec = FrameDecoder(alloc=alloc)  # default limits: 16 GiB frames, 16 MiB header
    tracemalloc.start()
    try:
        check_fails(dec, preamble(2) + struct.pack("<QQ", 10, 2**40), FrameTooLarge)
        check_fails(FrameDecoder(alloc=alloc), preamble(1) + struct.pack("<Q", 2**40), FrameTooLarge)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert alloc.sizes == []
    assert peak < 2**20


def test_message_total_limit() -> None:
    limits = LimitsSection(max_message_bytes=1000, max_frame_bytes=800)
    exc = check_fails(decoder(limits=limits), preamble(3) + struct.pack("<QQQ", 10, 600, 600), FrameTooLarge)
    assert "max_message_bytes" in str(exc)


def test_frame_limit() -> None:
    limits = LimitsSection(max_frame_bytes=100)
    exc = check_fails(decoder(limits=limits), preamble(2) + struct.pack("<QQ", 10, 101), FrameTooLarge)
    assert "max_frame_bytes" in str(exc)


def test_oversized_header() -> None:
    limits = LimitsSection(max_header_bytes=32)
    exc = check_fails(decoder(limits=limits), preamble(1) + struct.pack("<Q", 33), FrameTooLarge)
    assert "max_header_bytes" in str(exc)
    # the same size is fine for a non-header frame
    ok = decoder(limits=limits).feed(wire([[b"h", b"x" * 33]]))
    assert frames_of(ok) == [[b"h", b"x" * 33]]


def test_too_many_frames() -> None:
    limits = LimitsSection(max_frames=8)
    check_fails(decoder(limits=limits), preamble(9), TooManyFrames)
    check_fails(decoder(), preamble(2**32 - 1), TooManyFrames)  # default limit 4096


def test_limits_checked_as_soon_as_each_length_arrives() -> None:
    dec = decoder(limits=LimitsSection(max_frame_bytes=100))
    assert dec.feed(preamble(1000) + struct.pack("<Q", 5)) == []
    with pytest.raises(FrameTooLarge):
        dec.feed(struct.pack("<Q", 2**40))  # 998 lengths still to come: no waiting for them


def test_truncated_stream_is_not_a_message() -> None:
    stream = wire([[b"a" * 30, b"b" * 300]])
    for cut in range(1, len(stream)):
        dec = decoder()
        assert dec.feed(stream[:cut]) == []
        with pytest.raises(ProtocolError):
            dec.eof()


# ------------------------------------------------------------------------- large frames
def test_large_frame_is_received_in_place() -> None:
    """After the initial part, the kernel writes straight into the allocated frame."""
    alloc = RecordingAlloc()
    payload = bytes(range(256)) * 4096  # 1 MiB
    stream = wire([[b"hdr", payload], [b"after"]])
    dec = FrameDecoder(alloc=alloc, large_frame_bytes=65536, staging_bytes=262144)
    src = memoryview(stream)
    pos = 0
    out: list[list[Any]] = []
    into_staging_during_frame = 0
    chunk = 4096
    while pos < len(stream):
        buf = dec.get_buffer(-1)
        k = min(len(buf), chunk, len(stream) - pos)
        if alloc.buffers and buf.obj is not alloc.buffers[0] and not out:
            into_staging_during_frame += k
        elif alloc.buffers and buf.obj is alloc.buffers[0]:
            assert len(buf) == len(payload) - (pos - 8 - 16 - 3)  # exactly the rest of the frame
        buf[:k] = src[pos : pos + k]
        pos += k
        out += dec.buffer_updated(k)
    assert alloc.sizes == [len(payload)]
    assert out[0][1] is alloc.buffers[0]
    assert bytes(out[0][1]) == payload
    assert out[1] == [b"after"]
    # the frame was allocated after the first chunk: the rest went straight into it
    assert into_staging_during_frame <= chunk


def test_frame_allocator_hook_chooses_where_large_frames_land() -> None:
    """set_frame_allocator: frames land in the hook's buffers; None from the hook or removing
    it falls back to the decoder's own allocation; small frames never ask."""
    target = bytearray(1 << 20)
    asked: list[int] = []

    def hook(n: int) -> Any:
        asked.append(n)
        return memoryview(target)[:n] if len(asked) == 1 else None

    dec = FrameDecoder(large_frame_bytes=65536)
    dec.set_frame_allocator(hook)
    a, b = b"a" * 100_000, b"b" * 200_000
    out = dec.feed(wire([[b"small"], [a], [b]]))
    assert asked == [len(a), len(b)]  # the small frame did not ask
    assert out[0] == [b"small"]
    assert out[1][0].obj is target and bytes(out[1][0]) == a  # landed in the hook's buffer
    assert bytes(out[2][0]) == b and getattr(out[2][0], "obj", None) is not target
    dec.set_frame_allocator(None)
    out = dec.feed(wire([[a]]))
    assert len(asked) == 2 and bytes(out[0][0]) == a


def test_large_frame_initial_part_from_staging_is_copied_once() -> None:
    alloc = RecordingAlloc()
    payload = b"p" * 10000
    dec = FrameDecoder(alloc=alloc, large_frame_bytes=1000, staging_bytes=4096)
    stream = wire([[b"h", payload]])
    out = dec.feed(stream[:3000])  # part of the frame lands in staging first
    assert out == [] and alloc.sizes == [10000]
    buf = dec.get_buffer()
    assert buf.obj is alloc.buffers[0]
    assert len(buf) == len(stream) - 3000
    buf[:] = stream[3000:]
    (msg,) = dec.buffer_updated(len(buf))
    assert msg[1] is alloc.buffers[0] and bytes(msg[1]) == payload


def test_back_to_back_large_messages_skip_staging() -> None:
    """Once a large frame arrived, the next message's start is read into a small window, so a
    stream of large messages is not copied through staging (25% of each 1 MiB frame was)."""
    payload = bytes(range(256)) * 4096  # 1 MiB
    stream = wire([[b"hdr", payload]] * 4 + [[b"small"], [b"after"]])
    dec = FrameDecoder(large_frame_bytes=65536, staging_bytes=262144)
    src = memoryview(stream)
    pos = 0
    staged: list[int] = []  # bytes each read put into staging (not into a frame's own buffer)
    out: list[list[Any]] = []
    while pos < len(stream):
        buf = dec.get_buffer(-1)
        k = min(len(buf), len(stream) - pos)  # a kernel with everything queued fills the buffer
        if len(buf.obj) == 262144:  # the staging buffer, not a frame's own
            staged.append(k)
        buf[:k] = src[pos : pos + k]
        pos += k
        out += dec.buffer_updated(k)
    assert [len(m) for m in out] == [2, 2, 2, 2, 1, 1]
    assert all(bytes(m[1]) == payload for m in out[:4]) and out[4:] == [[b"small"], [b"after"]]
    assert staged[0] == 262144  # the first message: no way to know it is large
    assert max(staged[1:]) <= framing.PEEK_BYTES  # then only its start: the rest lands in place


def test_alloc_may_return_other_buffers() -> None:
    dec = FrameDecoder(alloc=lambda n: np.empty(n + 10, dtype=np.uint8), large_frame_bytes=100)
    (msg,) = dec.feed(wire([[b"h", b"x" * 500]]))
    assert isinstance(msg[1], memoryview) and bytes(msg[1]) == b"x" * 500


def test_alloc_failure_is_a_protocol_error() -> None:
    def no_memory(n: int) -> bytearray:
        raise MemoryError

    dec = FrameDecoder(alloc=no_memory, large_frame_bytes=100)
    check_fails(dec, wire([[b"h", b"x" * 500]]), FrameTooLarge)


def test_default_alloc_large_and_small() -> None:
    small = framing.default_alloc(1000)
    big = framing.default_alloc(framing.MMAP_ALLOC_BYTES)
    for b in (small, big):
        mv = memoryview(b)
        assert not mv.readonly and mv.format == "B"
    assert len(memoryview(big)) == framing.MMAP_ALLOC_BYTES


def test_frame_buffers_are_bytearrays_allocated_without_zero_fill() -> None:
    """Large frames below the mmap size are bytearrays (a bytearray payload stays zero-copy)
    allocated without the zero fill on CPython (it cost 108 of 114 us per 1 MiB frame)."""
    for n in (1, 65536, 1 << 20):
        b = framing.default_alloc(n)
        assert type(b) is bytearray and len(b) == n
        b[-1] = 7  # writable, exactly n bytes
    if sys.implementation.name == "cpython":
        assert framing.new_frame_bytearray is not bytearray
    dec = FrameDecoder(large_frame_bytes=1024)
    payload = bytes(range(256)) * 40
    (msg,) = dec.feed(wire([[b"h", payload]]))
    assert type(msg[1]) is bytearray and bytes(msg[1]) == payload  # every byte written by the receive


# ------------------------------------------------------------------------- no I/O
def test_module_imports_no_asyncio_or_socket() -> None:
    tree = ast.parse(Path(framing.__file__).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    assert not names & {"asyncio", "socket", "selectors", "ssl"}, names


def test_module_loads_without_asyncio_in_sys_modules() -> None:
    # Load aionet.codecs.framing without running the package __init__ files (which may import
    # the rest of aionet), then check what it pulled in.
    root = Path(framing.__file__).resolve().parents[2]
    code = textwrap.dedent(
        f"""
        import sys, types
        for name, sub in (("aionet", ""), ("aionet.codecs", "codecs")):
            mod = types.ModuleType(name)
            mod.__path__ = [str(__import__("pathlib").Path({str(root)!r}) / "aionet" / sub)]
            sys.modules[name] = mod
        import aionet.codecs.framing as f
        dec = f.FrameDecoder()
        assert dec.feed(b"".join(f.encode([b"x"]))) == [[b"x"]]
        bad = sorted(m for m in ("asyncio", "socket", "selectors") if m in sys.modules)
        assert not bad, bad
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ------------------------------------------------------------------------- buffer reuse
def large_stream(n: int = 5000) -> bytes:
    return wire([[b"h", bytes([7]) * n]])


def test_dropped_large_buffer_is_reused() -> None:
    dec = FrameDecoder(large_frame_bytes=1000)
    stream = large_stream()
    (first,) = dec.feed(stream)
    first_buf = first[1]
    first_id = id(first_buf)
    del first, first_buf
    (second,) = dec.feed(stream)
    assert id(second[1]) == first_id  # the very same buffer, refilled
    assert bytes(second[1]) == bytes([7]) * 5000


def test_reuse_keeps_four_small_frames_but_only_two_beyond_the_budget() -> None:
    """A consumer holding the last message or two while the next arrives still gets a
    recycled buffer; remembered memory beyond two frames stays within REUSE_BUDGET_BYTES."""
    dec = FrameDecoder(large_frame_bytes=1000)
    stream = large_stream()
    held = [dec.feed(stream)[0] for _ in range(4)]  # four buffers in use at once
    ids = {id(m[1]) for m in held}
    del held[:2]  # the consumer drops the two oldest while two are still queued
    again = [dec.feed(stream)[0] for _ in range(2)]
    assert {id(m[1]) for m in again} <= ids  # both came from the remembered ones
    big = FrameDecoder(large_frame_bytes=1000)
    size = framing.REUSE_BUDGET_BYTES // 2
    payload = bytes(size)
    kept = [big.feed(wire([[b"h", payload]])) for _ in range(3)]  # all three held
    assert len(kept) == 3 and big.spare_bytes == 2 * size  # the third would break the budget: only two kept


def test_the_most_recently_filled_free_buffer_is_reused_first() -> None:
    """After a burst held many frames at once, a consumer that then drops each message at once
    keeps getting the one buffer filled last (still in cache), not a rotation through all the
    remembered ones: reading into 16 rotating 1 MiB buffers cost the receiver ~40 % more
    kernel time per byte than into 2 (BENCHMARKS.md, branch ``big``)."""
    dec = FrameDecoder(large_frame_bytes=1000, reuse_frames=16)
    stream = large_stream()
    burst = [dec.feed(stream)[0] for _ in range(8)]  # eight frames alive at once
    newest = id(burst[-1][1])
    del burst
    got = []
    for _ in range(5):
        (msg,) = dec.feed(stream)
        got.append(id(msg[1]))
        del msg  # dropped before the next one arrives
    assert got == [newest] * 5
    assert dec.spare_bytes == 8 * 5000  # the others stay remembered for the next burst


@pytest.mark.parametrize("hold", ["object", "memoryview", "slice", "numpy"])
def test_buffer_still_referenced_is_never_reused(hold: str) -> None:
    dec = FrameDecoder(large_frame_bytes=1000, reuse_frames=4)
    stream = large_stream()
    (msg,) = dec.feed(stream)
    buf = msg[1]
    keep: Any = {
        "object": buf,
        "memoryview": memoryview(buf),
        "slice": memoryview(buf)[10:20],
        "numpy": np.frombuffer(buf, dtype=np.uint8),
    }[hold]
    del msg, buf
    for _ in range(3):
        (again,) = dec.feed(stream)
        memoryview(again[1])[:] = b"\x00" * 5000  # scribble over every fresh buffer
    assert bytes(memoryview(keep)[:10]) == bytes([7]) * 10


def test_reuse_needs_the_same_size_and_trim_forgets() -> None:
    dec = FrameDecoder(large_frame_bytes=1000)
    (a,) = dec.feed(large_stream(5000))
    ida = id(a[1])
    del a
    (b,) = dec.feed(large_stream(6000))
    assert id(b[1]) != ida
    assert dec.spare_bytes == 11000
    dec.trim()
    assert dec.spare_bytes == 0


def test_custom_alloc_disables_reuse() -> None:
    alloc = RecordingAlloc()
    dec = FrameDecoder(alloc=alloc, large_frame_bytes=1000)
    for _ in range(3):
        dec.feed(large_stream())
    assert len(alloc.sizes) == 3 and dec.spare_bytes == 0


@pytest.mark.parametrize("enabled", [True, False])
def test_gc_state_is_restored(enabled: bool) -> None:
    import gc

    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        dec = decoder()
        dec.feed(wire([[b"x"]] * 100))
        assert gc.isenabled() is enabled
        with pytest.raises(BadMagic):
            dec.feed(b"junk")
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()
