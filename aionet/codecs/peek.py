"""A look at a message's header before its large frames arrive (the receive-into path).

When a stream transport is about to receive a large frame, the core may already know where it
belongs: a collective waiting for segment ``(seq, tag, src)`` of a ring holds that segment's
place in its result array. This module reads just enough of the header frame to say whose frame
it is. It is pure (no I/O) and total on hostile input: anything that is not exactly the shape
it looks for is None, never an exception, and the message then takes the usual path, where the
decoder checks everything as always.
"""

from __future__ import annotations

from typing import Any

from .array_send import split_array_send
from .extensions import Buffer

__all__ = ["peek_send_array"]


def peek_send_array(header: Buffer, index: int) -> tuple[str, tuple[Any, ...]] | None:
    """``(channel, key)`` when ``header`` is a SEND envelope (``[SEND, seq, ack, channel,
    payload]``) whose payload is a list ``[*key, array]`` of plain ints/strings ending in an
    array stored uncompressed in out-of-band frame ``index``; None for anything else.

    The array's dtype and shape are not read here: the consumer's buffer is used only when its
    size is exactly the frame's, and the decoder later checks the array against the frame."""
    got = split_array_send(header)
    if got is None:
        return None
    env, payload, rec = got
    if payload is None or len(rec) not in (4, 5) or rec[3] != index or type(rec[3]) is not int:
        return None
    return env[3], tuple(payload[:-1])
