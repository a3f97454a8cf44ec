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

import msgpack

from .envelope import SEND
from .extensions import EXT_NDARRAY, Buffer

__all__ = ["peek_send_array"]

_KEY_TYPES = (int, str)


def _ext(code: int, data: bytes) -> msgpack.ExtType:
    return msgpack.ExtType(code, data)


def peek_send_array(header: Buffer, index: int) -> tuple[str, tuple[Any, ...]] | None:
    """``(channel, key)`` when ``header`` is a SEND envelope (``[SEND, seq, ack, channel,
    payload]``) whose payload is a list ``[*key, array]`` of plain ints/strings ending in an
    array stored uncompressed in out-of-band frame ``index``; None for anything else.

    The array's dtype and shape are not read here: the consumer's buffer is used only when its
    size is exactly the frame's, and the decoder later checks the array against the frame."""
    try:
        env = msgpack.unpackb(header, ext_hook=_ext, raw=False, strict_map_key=False)
    except Exception:  # malformed header: the usual path reports it
        return None
    if type(env) is not list or len(env) != 5 or env[0] != SEND or type(env[3]) is not str:
        return None
    payload = env[4]
    if type(payload) is not list or len(payload) < 2:
        return None
    arr = payload[-1]
    if type(arr) is not msgpack.ExtType or arr.code != EXT_NDARRAY:
        return None
    try:
        meta = msgpack.unpackb(arr.data, raw=False)
    except Exception:
        return None
    if type(meta) is not list or len(meta) not in (4, 5) or meta[3] != index or type(meta[3]) is not int:
        return None
    key = tuple(payload[:-1])
    for k in key:
        if type(k) not in _KEY_TYPES:
            return None
    return env[3], key
