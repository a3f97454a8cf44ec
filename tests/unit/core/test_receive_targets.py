"""The node's receive-into registry (core/receive_targets.py) against a fake connection: a
registration is used once, only for its peer, channel, key and exact size; ``forget`` removes
it and redirects a frame still arriving into it, so nothing more lands in the caller's memory."""

from __future__ import annotations

from typing import Any

import numpy as np

from aionet.codecs.envelope import SEND
from aionet.codecs.serialize import Serializer
from aionet.core.receive_targets import ReceiveTargets


class FakeConn:
    def __init__(self) -> None:
        self.target: Any = None
        self.released: list[Any] = []

    def set_frame_target(self, fn: Any) -> None:
        self.target = fn

    def release_frame_target(self, buf: Any) -> bool:
        self.released.append(buf)
        return True


def header(key: tuple[Any, ...], n: int = 1000, channel: str = "g") -> tuple[bytes, int]:
    frames = Serializer().dumps([SEND, 3, 2, channel, [*key, np.zeros(n, np.float32)]])
    return bytes(frames[0]), n * 4


def test_a_registration_is_used_once_for_its_peer_channel_key_and_size() -> None:
    reg, conn, other = ReceiveTargets(), FakeConn(), FakeConn()
    reg.attach("left", conn)
    reg.attach("right", other)
    place = np.zeros(1000, np.float32)
    reg.expect("left", "g", (1, 9, 0), place)
    h, n = header((1, 9, 0))
    assert other.target(h, 1, n) is None  # another peer's connection
    assert conn.target(header((1, 9, 1))[0], 1, n) is None  # another key
    assert conn.target(header((1, 9, 0), channel="h")[0], 1, n) is None  # another channel
    assert conn.target(h, 1, n - 4) is None  # another size: the registration stays for the right one
    assert conn.target(h, 1, n) is place
    assert conn.target(h, 1, n) is None  # used: a replayed duplicate goes elsewhere
    assert reg.hits == 1


def test_forget_drops_unused_ones_and_redirects_a_frame_in_flight() -> None:
    reg, conn = ReceiveTargets(), FakeConn()
    reg.attach("left", conn)
    a, b = np.zeros(1000, np.float32), np.zeros(1000, np.float32)
    reg.expect("left", "g", (1, 9, 0), a)
    reg.expect("left", "g", (1, 10, 0), b)
    h, n = header((1, 9, 0))
    assert conn.target(h, 1, n) is a  # handed to the decoder, arriving
    assert reg.pending() == 2
    reg.forget("left", "g", [(1, 9, 0), (1, 10, 0)])
    assert conn.released == [a]  # the frame in flight stops writing into a
    assert reg.pending() == 0
    assert conn.target(header((1, 10, 0))[0], 1, n) is None  # b is no longer offered


def test_a_connection_without_the_hook_is_left_as_it_is() -> None:
    reg = ReceiveTargets()
    reg.attach("p", object())  # inproc and friends: frames arrive as given, consumers copy
    reg.expect("p", "g", (1,), np.zeros(4, np.float32))
    reg.forget("p", "g", [(1,)])
    assert reg.pending() == 0
