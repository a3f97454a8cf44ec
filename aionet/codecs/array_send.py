"""A short road through the serializer for one message shape: ``[SEND, seq, ack, channel,
[*key, array]]`` or ``[SEND, seq, ack, channel, array]``, the array out of band in frame 1 (a
ring collective's segment is ``[seq, tag, src, array]``; ``node.send(peer, channel, array)``
sends a bare one).

Why: a ring allreduce sends and receives one such message per segment, and the general encoder
and decoder spend about 40 Python calls on it (the pre-pack walk, the packer's ``default`` hook,
the array record, the decoder chain, the extension hook, the frame bookkeeping) to produce and
read the very same bytes. Here the sender packs them with one C packer call and the receiver
reads them with two C unpacker calls and a few checks. The bytes on the wire are exactly those of
:meth:`~aionet.codecs.serialize.Serializer.dumps` (a property test holds the two to that), so a
peer on the general path reads them as always, and the link's sequencing, replay and
back-pressure see the same frames.

Both directions take only what they fully understand and answer None for anything else (the
caller then takes the general path, which checks and reports as always). A message that has
exactly this shape but is inconsistent (a bad dtype, a shape that does not match the frame)
raises :class:`~aionet.errors.DecodeError`; nothing here allocates more than the array view
over the frame already received.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np
from msgpack import ExtType

from ..errors import DecodeError
from .envelope import SEND
from .extensions import EXT_NDARRAY

if TYPE_CHECKING:
    from .dtypes import DtypeTable

__all__ = ["ARRAY_PAYLOADS", "MAX_KEY", "MAX_NDIM", "decode_array_send", "encode_array_send", "split_array_send"]

#: the payload types :func:`encode_array_send` may take (a cheap test for its callers)
ARRAY_PAYLOADS = frozenset({list, np.ndarray})

MAX_KEY = 8  # key items the sender's short road takes (a ring segment has 3)
MAX_NDIM = 64  # as the general decoder's bound
_KEY_TYPES = (int, str)
_new_tuple = tuple.__new__  # an ExtType without its Python-level __new__ (its checks hold here)
_pack_meta = msgpack.Packer(use_bin_type=True).pack  # as the encoder's record packer
#: ``(code, data)`` of an extension record as a slice: a C constructor taking two arguments, so
#: unpacking makes no Python call per record (``msgpack.ExtType`` runs a Python ``__new__``).
_ext_record = slice


def encode_array_send(
    pack: Any, seq: int, ack: int, channel: str, payload: list[Any], dtypes: DtypeTable, oob_min: int
) -> list[Any] | None:
    """The frames :meth:`Serializer.dumps` makes of ``[SEND, seq, ack, channel, payload]`` (no
    compression), when ``payload`` is ``[*key, array]`` with 1 to MAX_KEY plain int or str key
    items, or the array alone, the array being a C-contiguous numpy array of at least ``oob_min``
    bytes of a raw-memory dtype; None otherwise. ``pack``: a strict-types, bin-type msgpack
    packer's ``pack`` (the link's)."""
    if type(payload) is np.ndarray:
        a, n = payload, 0
    else:
        n = len(payload)
        if not 2 <= n <= MAX_KEY + 1:
            return None
        a = payload[-1]
        if type(a) is not np.ndarray:
            return None
    nbytes = a.nbytes
    if nbytes < oob_min or not a.flags.c_contiguous:
        return None
    for i in range(n - 1):
        if type(payload[i]) not in _KEY_TYPES:
            return None
    wire = dtypes.to_wire(a.dtype)
    if wire is None:
        return None
    rec = _new_tuple(ExtType, (EXT_NDARRAY, _pack_meta([wire, a.shape, False, 1])))
    try:
        header = pack([SEND, seq, ack, channel, [*payload[:-1], rec] if n else rec])
    except (OverflowError, TypeError, ValueError):  # an int beyond 64 bits, an odd str: the general path
        return None
    return [header, memoryview(a.ravel().view(np.uint8))]


def split_array_send(header: Any) -> tuple[list[Any], list[Any] | None, list[Any]] | None:
    """``(envelope, payload, array record)`` of a header that is a SEND envelope whose payload
    is ``[*key, array record]`` with plain int or str key items (``payload`` is that list, its
    last item still the record's :class:`slice` ``(code, data)``) or the array record alone
    (``payload`` is None); None for anything else (total on hostile bytes: never raises). The
    unpacker's own bounds are the header's length, which the caller bounds."""
    try:
        env = msgpack.unpackb(header, ext_hook=_ext_record, raw=False, strict_map_key=False)
    except Exception:  # malformed: the general path reports it
        return None
    if type(env) is not list or len(env) != 5 or env[0] != SEND or type(env[3]) is not str:
        return None
    payload = env[4]
    if type(payload) is slice:
        ext, payload = payload, None
    elif type(payload) is not list or len(payload) < 2:
        return None
    else:
        ext = payload[-1]
        for i in range(len(payload) - 1):
            if type(payload[i]) not in _KEY_TYPES:
                return None
    if type(ext) is not slice or ext.start != EXT_NDARRAY:
        return None
    try:
        rec = msgpack.unpackb(ext.stop, raw=False)
    except Exception:
        return None
    if type(rec) is not list:
        return None
    return env, payload, rec


def decode_array_send(header: Any, frame: Any, dtypes: DtypeTable, max_frame: int) -> list[Any] | None:
    """The envelope ``[SEND, seq, ack, channel, [*key, array]]`` (or ``[..., channel, array]``)
    of a 2-frame message whose header is ``header`` and whose array is C-ordered in ``frame``
    (the array views ``frame``; copied once if ``frame`` is read-only, as the general decoder
    does); None when the message is not exactly that (the general path decodes it). Raises
    DecodeError when it is that shape but does not add up: an unreceivable dtype, a bad shape, a
    size other than the frame's."""
    t = type(frame)
    if t is memoryview:
        if frame.ndim != 1 or frame.format != "B" or not frame.contiguous:
            return None
        size = frame.nbytes
    elif t is bytearray or t is bytes:
        size = len(frame)
    else:
        return None  # OwnedFrame, device buffers...: the general path
    if size > max_frame:
        return None
    got = split_array_send(header)
    if got is None:
        return None
    env, payload, rec = got
    if len(rec) != 4 or rec[3] != 1 or type(rec[3]) is not int or rec[2] is not False:
        return None  # compressed, Fortran-ordered, a torch tensor, another frame: the general path
    shape = rec[1]
    if type(shape) is not list or len(shape) > MAX_NDIM:
        raise DecodeError("malformed array record")
    for s in shape:
        if type(s) is not int or s < 0:
            raise DecodeError(f"bad array shape {shape[:MAX_NDIM]!r}")
    dt = dtypes.from_wire(rec[0])  # DecodeError for what cannot be received
    if dt.itemsize == 0:
        return None  # zero-size items: the general path's element bound applies
    need = math.prod(shape) * dt.itemsize
    if need != size:
        raise DecodeError(f"array {tuple(shape)} of {dt} needs {need} bytes, its buffer has {size}")
    arr = np.frombuffer(frame, dt)
    if len(shape) != 1:
        arr = arr.reshape(shape)
    if not arr.flags.writeable:
        arr = arr.copy()  # read-only frame: copied once, users get a writable array
    if payload is None:
        env[4] = arr
    else:
        payload[-1] = arr
    return env
