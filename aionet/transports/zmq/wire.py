"""The zmq transport's own message layouts, sans-I/O: frames in, decoded messages out.

aionet data never has an empty frame 0 (frame 0 is a header), so an empty first frame marks
a control message: ``["", "H", version]`` hello, ``["", "W", version]`` welcome,
``["", "B", reason?]`` bye, and ``["", "D", *frames]`` for the rare data message with zero
frames or an empty frame 0. Every other message travels exactly as sent.

No zmq, no sockets, no asyncio here: the transport receives each frame and feeds it to a
:class:`MessageReader`, which enforces the frame-count and size limits and reports a
malformed message as a :class:`~aionet.errors.ProtocolError` value (never by raising).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import FrameTooLarge, ProtocolError, TooManyFrames

PROTOCOL = b"aionet-zmq/1"

EMPTY = b""
HELLO = b"H"
WELCOME = b"W"
BYE = b"B"
DATA = b"D"
MALFORMED = b"?"  # internal marker: a message that cannot be decoded (frames = [the error])

#: (control or None for data, frames, payload bytes); control MALFORMED carries [ProtocolError]
Decoded = tuple[bytes | None, list[Any], int]


def hello() -> list[bytes]:
    return [EMPTY, HELLO, PROTOCOL]


def welcome() -> list[bytes]:
    return [EMPTY, WELCOME, PROTOCOL]


def bye(reason: bytes = b"") -> list[bytes]:
    return [EMPTY, BYE, reason]


def escaped(frames: Sequence[Any]) -> bool:
    """True when a data message needs the ``["", "D", ...]`` escape (no frames, or frame 0 empty)."""
    return not frames or not memoryview(frames[0]).nbytes


def encode(frames: Sequence[Any]) -> list[Any]:
    """A data message as zmq parts."""
    if escaped(frames):
        return [EMPTY, DATA, *frames]
    return list(frames)


def version_ok(args: Sequence[Any]) -> bool:
    """A hello's or welcome's arguments name this protocol version."""
    return bool(args) and bytes(args[0]) == PROTOCOL


def bye_reason(args: Sequence[Any]) -> str:
    """The human-readable reason a bye carries ("" when none)."""
    return bytes(args[0]).decode(errors="replace") if args and len(args[0]) else ""


_START, _CONTROL, _BODY, _DISCARD = range(4)


class MessageReader:
    """Decodes one multipart message at a time, fed frame by frame.

    ``feed(frame, more)`` returns None while the message continues (``more`` is zmq's
    "another frame follows" flag), and the :data:`Decoded` message at its last frame; the
    reader is then ready for the next message. Limits are checked as frames arrive, so an
    oversized message is counted and dropped, not held in memory."""

    __slots__ = ("_count", "_ctl", "_frames", "_size", "_state", "max_bytes", "max_frames")

    def __init__(self, max_frames: int, max_bytes: int) -> None:
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self._state = _START
        self._ctl: bytes | None = None
        self._frames: list[Any] = []
        self._size = 0
        self._count = 0

    def feed(self, frame: Any, more: bool) -> Decoded | None:
        state = self._state
        n = len(frame)
        if state == _START:
            if n:  # data as sent
                self._ctl = None
                self._frames = [frame]
                self._size = n
                self._state = _BODY
                return self._end() if not more else None
            if not more:
                return MALFORMED, [ProtocolError("a lone empty frame")], 0
            self._state = _CONTROL
            return None
        if state == _CONTROL:
            self._ctl = bytes(frame)
            self._frames = []
            self._size = 0
            self._state = _BODY
            return self._end() if not more else None
        if state == _BODY:
            if len(self._frames) >= self.max_frames or self._size > self.max_bytes:
                self._count = len(self._frames) + 1
                self._frames = []
                self._state = _DISCARD
            else:
                self._frames.append(frame)
            self._size += n
            return self._end() if not more else None
        self._count += 1  # _DISCARD
        self._size += n
        return self._end() if not more else None

    def _end(self) -> Decoded:
        state, size = self._state, self._size
        self._state = _START
        frames, self._frames = self._frames, []
        if state == _DISCARD or size > self.max_bytes:
            count = self._count if state == _DISCARD else len(frames)
            if count > self.max_frames:
                return MALFORMED, [TooManyFrames(f"message has {count} frames, limit {self.max_frames}")], 0
            return MALFORMED, [FrameTooLarge(f"message of {size} bytes, limit {self.max_bytes}")], 0
        ctl = self._ctl
        return (None if ctl == DATA else ctl), frames, size
