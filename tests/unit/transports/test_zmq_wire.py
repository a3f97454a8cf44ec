"""The zmq transport's wire layouts, fed frame by frame (sans-I/O, no sockets)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from aionet.errors import FrameTooLarge, ProtocolError, TooManyFrames
from aionet.transports.zmq import wire


def feed_all(reader: wire.MessageReader, parts: list[Any]) -> list[wire.Decoded]:
    """Feed one or more messages' frames; the last frame of each has more=False."""
    out = []
    for i, p in enumerate(parts):
        got = reader.feed(p, i != len(parts) - 1)
        if got is not None:
            out.append(got)
    return out


@pytest.mark.parametrize(
    "frames",
    [[b"hdr"], [b"hdr", b"payload", b""], [], [b""], [b"", b"x"], [bytearray(b"h"), memoryview(b"body")]],
)
def test_data_round_trips(frames: list[Any]) -> None:
    parts = wire.encode(frames)
    assert (parts[:2] == [wire.EMPTY, wire.DATA]) == wire.escaped(frames)
    reader = wire.MessageReader(max_frames=16, max_bytes=1 << 20)
    [(ctl, got, size)] = feed_all(reader, parts)
    assert ctl is None
    assert [bytes(f) for f in got] == [bytes(f) for f in frames]
    assert size == sum(len(bytes(f)) for f in frames)


def test_control_messages() -> None:
    reader = wire.MessageReader(16, 1 << 20)
    assert feed_all(reader, wire.hello()) == [(wire.HELLO, [wire.PROTOCOL], len(wire.PROTOCOL))]
    assert feed_all(reader, wire.welcome())[0][0] == wire.WELCOME
    ctl, args, _ = feed_all(reader, wire.bye(b"shutting down"))[0]
    assert ctl == wire.BYE and wire.bye_reason(args) == "shutting down"
    ctl, args, _ = feed_all(reader, [wire.EMPTY, wire.BYE])[0]  # a dialer's bye has no reason frame
    assert ctl == wire.BYE and wire.bye_reason(args) == ""
    assert wire.version_ok([wire.PROTOCOL]) and wire.version_ok([memoryview(wire.PROTOCOL)])
    assert not wire.version_ok([]) and not wire.version_ok([b"aionet-zmq/2"])


def test_a_lone_empty_frame_is_malformed_and_the_reader_recovers() -> None:
    reader = wire.MessageReader(16, 1 << 20)
    ctl, args, size = reader.feed(b"", False)  # type: ignore[misc]
    assert ctl == wire.MALFORMED and isinstance(args[0], ProtocolError) and size == 0
    assert feed_all(reader, [b"next"]) == [(None, [b"next"], 4)]


def test_too_many_frames_is_counted_and_dropped() -> None:
    reader = wire.MessageReader(max_frames=3, max_bytes=1 << 20)
    [(ctl, args, _)] = feed_all(reader, [b"f"] * 10)
    assert ctl == wire.MALFORMED and isinstance(args[0], TooManyFrames) and "10 frames" in str(args[0])
    assert reader._frames == []  # nothing of the dropped message is kept
    [(ctl, args, _)] = feed_all(reader, [wire.EMPTY, wire.DATA, *[b"f"] * 5])
    assert isinstance(args[0], TooManyFrames)
    assert feed_all(reader, [b"a", b"b", b"c"]) == [(None, [b"a", b"b", b"c"], 3)]


def test_oversized_message_is_dropped() -> None:
    reader = wire.MessageReader(max_frames=100, max_bytes=10)
    [(ctl, args, _)] = feed_all(reader, [b"x" * 8, b"y" * 8])
    assert ctl == wire.MALFORMED and isinstance(args[0], FrameTooLarge)
    [(ctl, args, _)] = feed_all(reader, [b"x" * 11])
    assert isinstance(args[0], FrameTooLarge)
    [(ctl, args, _)] = feed_all(reader, [b"x" * 11, b"y", b"z"])  # discard mode, then the end
    assert isinstance(args[0], FrameTooLarge) and "13 bytes" in str(args[0])
    assert feed_all(reader, [b"x" * 10]) == [(None, [b"x" * 10], 10)]


def test_every_split_point_of_a_stream_of_messages() -> None:
    """Messages of many shapes back to back: each decodes alone, whatever came before it."""
    msgs = [[b"h"], wire.hello(), [b"h", b"", b"p" * 5], wire.bye(b"r"), wire.encode([]), [wire.EMPTY, wire.BYE]]
    for start in range(len(msgs)):
        reader = wire.MessageReader(16, 1 << 20)
        for m in msgs[start:] + msgs[:start]:
            assert len(feed_all(reader, list(m))) == 1


def test_garbage_never_raises() -> None:
    rng = random.Random(1234)
    reader = wire.MessageReader(max_frames=8, max_bytes=64)
    for _ in range(2000):
        frames = [rng.randbytes(rng.choice([0, 0, 1, 3, 40])) for _ in range(rng.randint(1, 12))]
        [(ctl, args, size)] = feed_all(reader, frames)
        if ctl == wire.MALFORMED and isinstance(args[0], ProtocolError):
            assert size == 0
        else:  # data or a control message (a peer may send any control byte, even "?")
            assert len(args) <= 8 and size <= 64
    assert feed_all(reader, [b"ok"]) == [(None, [b"ok"], 2)]
