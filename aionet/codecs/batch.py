"""Many SEND payloads in one envelope (sans-I/O).

A SEND envelope is ``[SEND, seq, ack, channel, payload, *more payloads]``: to a peer that
advertises the handshake feature ``"batch"``, a link coalesces the small messages queued for
one channel within one event-loop iteration into one envelope, so they share one sequence
number, one frame, one write and one decode. Each payload is packed once, when it is sent
(so errors surface at the call), and the envelope is assembled from the packed bytes: a
msgpack array header for ``4 + n`` items, then the four packed envelope fields, then the
payloads. The result is ordinary msgpack that the receiver decodes with one ``unpackb``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .envelope import SEND

#: handshake feature: the most payloads this node accepts in one SEND envelope (absent: one)
FEATURE = "batch"


def array_header(n: int) -> bytes:
    """msgpack's header for an array of ``n`` items."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    if n < 0x100000000:
        return b"\xdd" + n.to_bytes(4, "big")
    raise ValueError(f"a msgpack array holds at most 2**32 - 1 items, not {n}")


def encode_send_batch(pack: Callable[[Any], bytes], seq: int, ack: int, channel: str, packed: Sequence[bytes]) -> bytes:
    """``[kind, seq, ack, channel, *payloads]`` as one msgpack array, from payloads already
    packed (``packed``: one msgpack value each). ``pack`` packs the envelope fields."""
    return b"".join((array_header(4 + len(packed)), pack(SEND), pack(seq), pack(ack), pack(channel), *packed))


__all__ = ["FEATURE", "array_header", "encode_send_batch"]
