"""The opt-in pickle fallback: the one place aionet pickles and unpickles.

Pickle runs only when the cluster opts in (``security.allow_pickle``): the encoder falls back
to it for types nothing else knows, and the decoder refuses an ``EXT_PICKLE`` record without
unpickling it when pickle is off. Pickle protocol 5 keeps large contiguous buffers out of band,
as frames beside the header, like every other large buffer.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

from ..errors import DecodeError, SerializationError
from .extensions import Buffer, qualname

__all__ = ["pickle_record", "unpickle_record"]


def pickle_record(o: Any, oob_min: int, add_frame: Callable[[Buffer, int], Any]) -> list[Any]:
    """``[pickle bytes, [refs...]]`` for ``o``: contiguous buffers of at least ``oob_min``
    bytes go to ``add_frame(buffer, nbytes)``, which returns their reference."""
    refs: list[Any] = []

    def out_of_band(pb: pickle.PickleBuffer) -> bool:
        try:
            raw = pb.raw()
        except BufferError:
            return True  # not contiguous: let pickle keep it in-band
        if raw.nbytes < oob_min:
            return True
        refs.append(add_frame(raw, raw.nbytes))
        return False

    try:
        data = pickle.dumps(o, protocol=5, buffer_callback=out_of_band)
    except Exception as exc:
        raise SerializationError(f"cannot pickle {qualname(type(o))}: {exc}") from exc
    return [data, refs]


def unpickle_record(data: bytes, allowed: bool, unpack: Callable[[bytes], Any], take: Callable[[Any], Buffer]) -> Any:
    """Unpickle an ``EXT_PICKLE`` record's payload if pickle is ``allowed`` here, else raise
    DecodeError before reading it. ``unpack`` decodes the bounded metadata record and
    ``take`` resolves its buffer references."""
    if not allowed:
        raise DecodeError("received a pickled object but pickle is disabled (security.allow_pickle)")
    m = unpack(data)
    if type(m) is not list or len(m) != 2 or type(m[0]) is not bytes or type(m[1]) is not list:
        raise DecodeError("malformed pickle record")
    buffers = [take(r) for r in m[1]]
    return pickle.loads(m[0], buffers=buffers)
