"""Receive-into at the codec layer: the frame decoder's FrameTarget hook and the header peek.

What a user relies on: a frame lands in the buffer a consumer named only when that buffer fits
it exactly; anything else takes the usual path with the message intact; a consumer that gives
up (``release_frame_target``) gets not one more byte written into its memory; the header peek
never raises on hostile bytes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.codecs.envelope import REQ, SEND
from aionet.codecs.framing import FrameDecoder, encode
from aionet.codecs.peek import peek_send_array
from aionet.codecs.serialize import Serializer

LARGE = 64


def wire(frames: list[Any]) -> bytes:
    return b"".join(bytes(p) for p in encode(frames))


def message(n: int = 1000, key: tuple[Any, ...] = (7, 5, 1), channel: str = "chan") -> tuple[list[Any], np.ndarray]:
    arr = (np.arange(n, dtype=np.float32) * 3 + 1).astype(np.float32)
    return Serializer().dumps([SEND, 11, 10, channel, [*key, arr]]), arr


class Targets:
    """A FrameTarget that answers with ``buf`` for ``(channel, key)`` and records what it was asked."""

    def __init__(self, buf: Any, want: tuple[str, tuple[Any, ...]] = ("chan", (7, 5, 1))) -> None:
        self.buf = buf
        self.want = want
        self.asked: list[tuple[int, int]] = []

    def __call__(self, header: Any, index: int, n: int) -> Any:
        self.asked.append((index, n))
        return self.buf if peek_send_array(header, index) == self.want else None


def feed_split(dec: FrameDecoder, data: bytes, step: int) -> list[list[Any]]:
    out: list[list[Any]] = []
    for i in range(0, len(data), step):
        out.extend(dec.feed(data[i : i + step]))
    return out


@pytest.mark.parametrize("step", [1, 7, 64, 333, 4096, 1 << 20])
def test_the_frame_lands_in_the_named_buffer_at_every_split(step: int) -> None:
    frames, arr = message()
    place = np.full(arr.size, -1.0, np.float32)
    dec = FrameDecoder(large_frame_bytes=LARGE, staging_bytes=256)
    dec.set_frame_target(Targets(place))
    (got,) = feed_split(dec, wire(frames), step)
    assert np.array_equal(place, arr)
    assert np.shares_memory(np.frombuffer(got[1], np.uint8), place)  # delivered as the buffer itself
    assert Serializer().loads(got)[4][3].__array_interface__["data"][0] == place.ctypes.data


@pytest.mark.parametrize(
    "buf",
    [
        np.zeros(999, np.float32),  # one element short
        np.zeros(1001, np.float32),  # one element long: never a prefix write
        np.zeros(2000, np.float32)[::2],  # not contiguous
        b"\0" * 4000,  # read-only
        None,  # not expected
        object(),  # not a buffer at all
    ],
    ids=["short", "long", "strided", "readonly", "none", "object"],
)
def test_a_buffer_that_does_not_fit_exactly_is_left_alone_and_the_message_is_intact(buf: Any) -> None:
    frames, arr = message()
    before = buf.copy() if isinstance(buf, np.ndarray) else None
    dec = FrameDecoder(large_frame_bytes=LARGE, staging_bytes=256)
    dec.set_frame_target(lambda header, index, n: buf)
    (got,) = dec.feed(wire(frames))
    env = Serializer().loads(got)
    assert np.array_equal(env[4][3], arr)
    if before is not None:
        assert np.array_equal(buf, before)  # untouched


def test_unknown_key_channel_or_frame_takes_the_usual_path() -> None:
    place = np.full(1000, -1.0, np.float32)
    for frames in (message(key=(7, 5, 2))[0], message(channel="other")[0]):
        dec = FrameDecoder(large_frame_bytes=LARGE, staging_bytes=256)
        dec.set_frame_target(Targets(place))
        (got,) = dec.feed(wire(frames))
        assert np.array_equal(Serializer().loads(got)[4][3], message()[1])
    assert (place == -1).all()


def test_release_mid_frame_stops_writes_into_the_buffer_and_the_message_completes() -> None:
    frames, arr = message(n=4096)
    place = np.full(arr.size, -1.0, np.float32)
    dec = FrameDecoder(large_frame_bytes=LARGE, staging_bytes=256)
    dec.set_frame_target(Targets(place))
    data = wire(frames)
    half = len(data) // 2
    assert dec.feed(data[:half]) == []
    landed = place.copy()
    assert (landed != -1).any()  # some of it arrived in place
    assert dec.release_frame_target(place) is True
    assert dec.release_frame_target(place) is False  # once
    (got,) = dec.feed(data[half:])
    assert np.array_equal(place, landed)  # not one byte more
    assert np.array_equal(Serializer().loads(got)[4][3], arr)  # the message is whole elsewhere


def test_release_of_a_buffer_not_in_use_is_a_no_op() -> None:
    frames, arr = message()
    place = np.zeros(arr.size, np.float32)
    dec = FrameDecoder(large_frame_bytes=LARGE, staging_bytes=256)
    dec.set_frame_target(Targets(place))
    assert dec.release_frame_target(place) is False
    assert len(dec.feed(wire(frames))) == 1
    assert dec.release_frame_target(place) is False  # done: nothing to redirect
    assert np.array_equal(place, arr)


def test_peek_reads_channel_and_key_of_a_send_with_an_out_of_band_array() -> None:
    frames, _arr = message()
    header = bytes(frames[0])
    assert peek_send_array(header, 1) == ("chan", (7, 5, 1))
    assert peek_send_array(header, 2) is None  # the array is frame 1, not 2
    req = Serializer().dumps([REQ, 1, 0, 5, "svc", np.zeros(1000, np.float32)])
    assert peek_send_array(bytes(req[0]), 1) is None  # not a SEND
    inline = Serializer().dumps([SEND, 1, 0, "chan", [1, 2, 3, np.zeros(3, np.float32)]])
    assert peek_send_array(bytes(inline[0]), 1) is None  # packed inline: no out-of-band frame
    odd = Serializer().dumps([SEND, 1, 0, "chan", [1.5, np.zeros(1000, np.float32)]])
    assert peek_send_array(bytes(odd[0]), 1) is None  # keys are ints and strings only


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(-2, 5))
def test_peek_never_raises_on_garbage(data: bytes, index: int) -> None:
    assert peek_send_array(data, index) is None or isinstance(peek_send_array(data, index), tuple)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 60))
def test_peek_never_raises_on_truncated_headers(cut: int) -> None:
    header = bytes(message()[0][0])
    assert peek_send_array(header[:cut], 1) is None or cut >= len(header)
