"""The tcp:// receive low-water mark (``rcvlowat_bytes``): while a large frame arrives the
connection asks the kernel to wake it per that many bytes, never for more than the frame still
owes, and drops the mark to 1 as soon as the frame is complete.

What a user relies on: no message is ever held back by the mark (a mark above the bytes still
to come would wait for bytes the peer never sends), and every message arrives intact. Driven
through the protocol interface (``connection_made``, ``get_buffer``, ``buffer_updated``) with a
socket double that records the mark; the real kernel is in tests/integration/test_tcp_rcvlowat.py.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.codecs.framing import encode
from aionet.config import LimitsSection
from aionet.transports.tcp import DEFAULT_OPTIONS
from aionet.transports.tcp_connection import TCPConnection

MARK = 4096
LARGE = 1024  # large_frame_bytes: frames from this size are received into their own buffer


class MarkSocket:
    """Records SO_RCVLOWAT as the connection sets it."""

    def __init__(self) -> None:
        self.mark = 1
        self.sets = 0

    def setsockopt(self, level: int, opt: int, value: int) -> None:
        if (level, opt) == (socket.SOL_SOCKET, socket.SO_RCVLOWAT):
            assert value >= 1
            self.mark = value
            self.sets += 1

    def fileno(self) -> int:
        return -1


class FakeTransport:
    def __init__(self, sock: MarkSocket, ssl: bool = False) -> None:
        self.sock = sock
        self.ssl = ssl

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {
            "socket": self.sock,
            "sockname": ("127.0.0.1", 1),
            "peername": ("127.0.0.1", 2),
            "ssl_object": object() if self.ssl else None,
        }.get(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


def connection(
    loop: asyncio.AbstractEventLoop, mark: int = MARK, ssl: bool = False
) -> tuple[TCPConnection, MarkSocket]:
    opts = {**DEFAULT_OPTIONS, "rcvlowat_bytes": mark, "large_frame_bytes": LARGE, "staging_bytes": 4 * LARGE}
    conn = TCPConnection(loop, opts, LimitsSection())
    sock = MarkSocket()
    conn.connection_made(FakeTransport(sock, ssl))  # type: ignore[arg-type]
    return conn, sock


def wire(frames: list[bytes]) -> bytes:
    return b"".join(bytes(p) for p in encode(frames))


def deliver(conn: TCPConnection, sock: MarkSocket, stream: bytes, cuts: list[int]) -> None:
    """Feed ``stream`` as the kernel would, in reads of at most the given sizes (never fewer bytes
    than the mark asks for unless the stream has no more), checking the mark after every read."""
    pos = 0
    i = 0
    while pos < len(stream):
        buf = conn.get_buffer(-1)
        left = len(stream) - pos
        # the kernel wakes the reader only once `mark` bytes are queued, or the stream is done
        k = min(len(buf), left, max(cuts[i % len(cuts)], min(sock.mark, left)))
        i += 1
        buf[:k] = stream[pos : pos + k]
        pos += k
        conn.buffer_updated(k)
        owed = conn._decoder.frame_remaining
        assert sock.mark <= max(1, owed), "the mark asks for more than the frame in progress still owes"
        assert sock.mark <= max(1, len(stream) - pos), "the mark asks for bytes the peer never sends"
        if not owed:
            assert sock.mark == 1, "between frames the mark is back at 1 (a small message must not wait)"


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 20 * MARK), min_size=1, max_size=6),
    cuts=st.lists(st.integers(1, 3 * MARK), min_size=1, max_size=8),
)
def test_the_mark_never_exceeds_what_the_frame_still_owes(sizes: list[int], cuts: list[int]) -> None:
    lp = asyncio.new_event_loop()
    try:
        conn, sock = connection(lp)
        msgs = [[b"h%d" % i, bytes([i % 251]) * n] for i, n in enumerate(sizes)]
        deliver(conn, sock, b"".join(wire(m) for m in msgs), cuts)
        got = [[bytes(f) for f in m] for m in conn._queue]
        assert got == msgs
        assert sock.mark == 1
    finally:
        lp.close()


def test_a_frame_of_several_marks_raises_it_and_the_tail_lowers_it(loop: asyncio.AbstractEventLoop) -> None:
    conn, sock = connection(loop)
    n = 5 * MARK + 123
    stream = wire([b"head", b"x" * n]) + wire([b"after"])
    deliver(conn, sock, stream, [512])
    assert [bytes(f) for f in conn._queue[0]] == [b"head", b"x" * n]
    assert [bytes(f) for f in conn._queue[1]] == [b"after"]
    # raised to the mark at the frame's start, lowered to the tail (123 bytes), back to 1 at its end
    assert sock.sets == 3
    assert sock.mark == 1


def test_small_and_one_mark_frames_never_touch_the_socket(loop: asyncio.AbstractEventLoop) -> None:
    conn, sock = connection(loop)
    deliver(conn, sock, wire([b"a", b"y" * (2 * MARK - 1)]) + wire([b"b" * 100]), [700])
    assert len(conn._queue) == 2
    assert sock.sets == 0


def test_off_at_zero_and_under_tls(loop: asyncio.AbstractEventLoop) -> None:
    for mark, ssl in ((0, False), (MARK, True)):
        conn, sock = connection(loop, mark=mark, ssl=ssl)
        deliver(conn, sock, wire([b"h", b"z" * (10 * MARK)]), [MARK // 2])
        assert len(conn._queue) == 1
        assert sock.sets == 0
