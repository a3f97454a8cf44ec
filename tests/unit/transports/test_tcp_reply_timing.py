"""When a reply written from inside a read callback reaches the socket (tcp_connection.py, push mode).

A request/reply exchange (a lone small message read after a lone message) has its reply's
first small write handed to the transport at once, before the rest of the read's
bookkeeping: that bookkeeping is otherwise on the round trip's critical path. Anything else
written during a read still goes out in one write when the callback returns, in order.
No sockets: a fake transport records the writes."""

from __future__ import annotations

import asyncio
from typing import Any

from aionet.codecs.framing import encode_prefix
from aionet.config import LimitsSection
from aionet.transports.tcp import TCPConnection, _options


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def writelines(self, data: Any) -> None:
        self.writes.append(b"".join(bytes(d) for d in data))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name in ("sockname", "peername") else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def is_closing(self) -> bool:
        return False


def wire(*payloads: bytes) -> bytes:
    return b"".join(encode_prefix([p]) + p for p in payloads)


def feed(conn: TCPConnection, data: bytes) -> None:
    buf = conn.get_buffer(len(data))
    buf[: len(data)] = data
    conn.buffer_updated(len(data))


def make(writes_seen: list[int], reply: Any) -> tuple[TCPConnection, FakeTransport]:
    """A connection whose consumer writes ``reply(msgs)`` and then notes how many writes the
    transport had got before the callback returned."""
    conn = TCPConnection(asyncio.new_event_loop(), _options({}), LimitsSection())
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]

    def on_messages(msgs: list[Any]) -> None:
        for frames in reply(msgs):
            conn.write_nowait(frames)
        writes_seen.append(len(t.writes))

    conn.start_receiving(on_messages, lambda exc: None)
    return conn, t


def test_the_reply_to_a_lone_request_goes_out_before_the_read_callback_returns() -> None:
    seen: list[int] = []
    conn, t = make(seen, lambda msgs: [[b"rep-" + msgs[0][0]]])
    feed(conn, wire(b"a"))  # the first lone message: not yet an exchange, written at the end
    assert seen == [0] and len(t.writes) == 1
    feed(conn, wire(b"b"))  # a lone message after a lone message: the reply goes now
    assert seen == [0, 2] and len(t.writes) == 2
    assert t.writes[1] == wire(b"rep-b")
    conn._loop.close()


def test_what_follows_the_first_reply_in_the_same_read_waits_for_its_end_in_order() -> None:
    seen: list[int] = []
    conn, t = make(seen, lambda msgs: [[b"r1"], [b"r2"], [b"r3"]])
    feed(conn, wire(b"a"))
    feed(conn, wire(b"b"))
    assert seen[-1] == 2  # r1 went at once; r2 and r3 only when the callback returned
    assert t.writes[1:] == [wire(b"r1"), wire(b"r2", b"r3")]
    conn._loop.close()


def test_a_read_of_several_messages_or_a_big_one_is_answered_in_one_write() -> None:
    seen: list[int] = []
    conn, t = make(seen, lambda msgs: [[b"r-" + m[0][:1]] for m in msgs])
    feed(conn, wire(b"a"))
    feed(conn, wire(b"b", b"c"))  # two requests in one read: one write for both replies
    assert seen[-1] == 1 and t.writes[-1] == wire(b"r-b", b"r-c")
    feed(conn, wire(b"d"))  # lone again, but the read before was not: batched
    assert seen[-1] == 2
    feed(conn, wire(b"x" * 4096))  # lone after lone, but too big to be a lone request (a batch)
    assert seen[-1] == 3 and len(t.writes) == 4
    conn._loop.close()
