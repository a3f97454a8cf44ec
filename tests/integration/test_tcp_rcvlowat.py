"""tcp:// with a receive low-water mark (``rcvlowat_bytes``) over real sockets, on both loops.

What a user relies on: the mark never holds a message back. A peer that sends one large frame
and then nothing until it gets a reply (the tail of the frame shorter than the mark), a small
message right after a large one, and frames of every size around the mark all arrive intact.
A mark that outlived its frame is caught here (the socket's mark is read back); one above the
bytes still to come rarely stalls on loopback (reads are large, and the kernel wakes a reader
anyway once the receive window closes), so that rule is checked deterministically in
tests/unit/transports/test_rcvlowat.py."""

from __future__ import annotations

import asyncio
import hashlib
import socket
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.integration.test_tcp import pair, run  # noqa: F401 (run is a fixture)

MARK = 256 * 1024


@pytest.mark.parametrize("tail", [0, 1, MARK - 1, MARK + 7])
def test_a_frame_then_silence_until_the_reply_arrives(run: Callable[..., Any], tail: int) -> None:  # noqa: F811
    n = 4 * MARK + tail
    big = np.random.default_rng(tail).integers(0, 256, n, dtype=np.uint8)

    async def main() -> None:
        async with pair({"rcvlowat_bytes": MARK}) as p:
            for _ in range(3):  # a request/reply exchange: each side waits for the other
                await p.client.send([b"req", big])
                got = await asyncio.wait_for(p.server.recv(), 20)
                assert got[0] == b"req" and hashlib.sha256(got[1]).digest() == hashlib.sha256(big).digest()
                await p.server.send([b"ok"])
                assert await asyncio.wait_for(p.client.recv(), 20) == [b"ok"]

    run(main(), timeout=60)


def test_small_messages_around_large_ones_and_the_mark_falls_back(run: Callable[..., Any]) -> None:  # noqa: F811
    sizes = [2 * MARK - 1, 2 * MARK, 3 * MARK + 5, 10, 8 * 2**20 + 3, 70_000, 2 * MARK]

    async def main() -> None:
        async with pair({"rcvlowat_bytes": MARK}) as p:
            for i, n in enumerate(sizes):
                await p.client.send([b"%d" % i, bytes([i]) * n])
                await p.client.send([b"small %d" % i])  # a lone small message after each
                got = await asyncio.wait_for(p.server.recv(), 20)
                assert got[0] == b"%d" % i and len(got[1]) == n and bytes(got[1][-1:]) == bytes([i])
                assert await asyncio.wait_for(p.server.recv(), 20) == [b"small %d" % i]
            assert p.server._transport is not None
            sock = p.server._transport.get_extra_info("socket")
            # between messages the kernel's default again: a small message is never held back
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1

    run(main(), timeout=60)
