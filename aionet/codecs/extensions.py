"""The serializer's wire vocabulary: msgpack extension codes and the kinds inside their records.

A message header is msgpack; everything msgpack cannot say natively travels as an extension
record whose payload is itself msgpack. Buffer references ("ref") inside records are
``bytes`` (inline data), ``int`` (index of an out-of-band frame) or ``[index, codec,
raw_len]`` (a compressed out-of-band frame). These numbers are the wire format: never
renumber one. Also here: what the encoder and decoder need from their serializer
(:class:`SerializerState`) and from the node for device arrays (:class:`DeviceHook`).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..config import LimitsSection
    from .dtypes import DtypeTable

__all__ = [
    "BUF_BYTEARRAY",
    "BUF_BYTES",
    "BUF_MEMORYVIEW",
    "COMPLEX",
    "DEVICE_FRAMES",
    "DEVICE_INLINE",
    "DEVICE_STAGED",
    "DT_DATE",
    "DT_DATETIME",
    "DT_TIME",
    "DT_TIMEDELTA",
    "EXT_BIGINT",
    "EXT_BUFFER",
    "EXT_COMPLEX",
    "EXT_DATACLASS",
    "EXT_DATETIME",
    "EXT_DEVICE",
    "EXT_FROZENSET",
    "EXT_NDARRAY",
    "EXT_NPSCALAR",
    "EXT_PICKLE",
    "EXT_SET",
    "EXT_TUPLE",
    "Buffer",
    "DecodeDeferred",
    "DeviceHook",
    "SerializerState",
    "qualname",
]

Buffer = bytes | bytearray | memoryview

# Extension codes in the header, with each record's payload.
EXT_TUPLE = 1  # [items...]
EXT_SET = 2  # [items...]
EXT_FROZENSET = 3  # [items...]
EXT_COMPLEX = 4  # struct "<dd"
EXT_BIGINT = 5  # little-endian two's complement
EXT_NPSCALAR = 6  # [dtype, raw bytes]
EXT_NDARRAY = 7  # [dtype, shape, fortran_order, ref] (+ [1]: it was a torch tensor)
EXT_BUFFER = 8  # [kind, ref]
EXT_DATACLASS = 9  # [name, [field values...]]
EXT_DATETIME = 10  # [kind, value...]
EXT_PICKLE = 11  # [pickle bytes, [refs...]]
EXT_DEVICE = 12  # [mode, staging header | None, data]  (see DeviceHook)

# EXT_DEVICE modes: how a device array's bytes travel
DEVICE_INLINE = 0  # data = [refs...]: host copies of the chunks, in this message
DEVICE_STAGED = 1  # data = transfer id: the chunks went ahead as separate link messages
DEVICE_FRAMES = 2  # data = [ref]: one device buffer frame (transport moves device memory)

# EXT_BUFFER kinds: which bytes-like type the receiver rebuilds
BUF_BYTES, BUF_BYTEARRAY, BUF_MEMORYVIEW = 0, 1, 2
# EXT_DATETIME kinds
DT_DATETIME, DT_DATE, DT_TIME, DT_TIMEDELTA = 0, 1, 2, 3

COMPLEX = struct.Struct("<dd")  # EXT_COMPLEX payload: real, imaginary


class DecodeDeferred(Exception):
    """Raised by a :class:`DeviceHook` while decoding when the message cannot be decoded *now*
    (a staged array is still being copied) or not delivered here; :meth:`Serializer.loads`
    passes it through untouched so the node can wait or answer instead of closing the
    connection."""


class DeviceHook(Protocol):
    """What the serializer needs from the node to carry device arrays.

    ``encode(obj)`` returns None when ``obj`` is not a device array, else ``(mode, meta,
    data)`` (see the ``DEVICE_*`` modes; for INLINE and FRAMES ``data`` is a list of frames,
    for STAGED a transfer id), or raises (e.g. to ask the node to stage the array first).
    ``decode(mode, meta, data)`` gets the same back (frames resolved) and returns the array.
    Both run synchronously inside ``dumps``/``loads``."""

    def encode(self, obj: Any) -> tuple[int, Any, Any] | None: ...

    def decode(self, mode: int, meta: Any, data: Any) -> Any: ...


class SerializerState(Protocol):
    """The settings and registries the encoder and decoder read from their
    :class:`~aionet.codecs.serialize.Serializer` (declared here so that neither imports it)."""

    limits: LimitsSection
    allow_pickle: bool
    device_hook: DeviceHook | None
    compress_min_bytes: int
    max_compression_ratio: float
    _oob_min: int
    _max_header: int
    _codec: str
    _meta_kw: dict[str, Any]
    _dtypes: DtypeTable
    _by_type: dict[type, tuple[str, tuple[str, ...]]]
    _by_name: dict[str, tuple[type, tuple[str, ...]]]


def qualname(t: type) -> str:
    """``module.QualName`` of a type, for error messages."""
    return f"{t.__module__}.{t.__qualname__}"
