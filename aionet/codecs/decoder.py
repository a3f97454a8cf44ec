"""Frames -> objects: the decoder behind :meth:`Serializer.loads <aionet.codecs.serialize.Serializer.loads>`.

Input is hostile: every record is checked before it is used, every size against the limits
(compressed frames by their inflated size, before inflating), and every failure raises
:class:`~aionet.errors.DecodeError`. Arrays and buffers alias the received frames where the
frame allows it (no copy on the receiver).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gc
import importlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import msgpack
import numpy as np

from ..config import LimitsSection
from ..errors import DecodeError, FrameTooLarge, TooManyFrames
from .compression import check_decompressed_size, decompress
from .dtypes import MAX_DTYPE_FIELDS
from .extensions import (
    BUF_BYTEARRAY,
    BUF_BYTES,
    BUF_MEMORYVIEW,
    COMPLEX,
    DEVICE_FRAMES,
    DEVICE_INLINE,
    DEVICE_STAGED,
    DT_DATE,
    DT_DATETIME,
    DT_TIME,
    DT_TIMEDELTA,
    EXT_BIGINT,
    EXT_BUFFER,
    EXT_COMPLEX,
    EXT_DATACLASS,
    EXT_DATETIME,
    EXT_DEVICE,
    EXT_FROZENSET,
    EXT_NDARRAY,
    EXT_NPSCALAR,
    EXT_PICKLE,
    EXT_SET,
    EXT_TUPLE,
    Buffer,
    SerializerState,
)
from .framing import OwnedFrame, frame_nbytes
from .pickling import unpickle_record

__all__ = ["GC_PAUSE_BYTES", "Decoder", "decode_frames", "gc_paused", "meta_limits", "short_record_max"]

_MAX_NDIM = 64
GC_PAUSE_BYTES = 256 * 1024  # headers at least this big are unpacked with the cyclic GC paused


class _Message:
    """Per-message decoding state shared by a multi-frame decoder chain: whether compressed
    frames are allowed here (only on a connection that negotiated compression) and the
    message's size as it grows by decompression, checked against the limits before each
    frame is inflated (every limit counts decompressed bytes)."""

    __slots__ = ("allow", "nbytes")

    def __init__(self, nbytes: int, allow: bool) -> None:
        self.nbytes = nbytes
        self.allow = allow

    def inflate(self, data: Buffer, codec: Any, raw_len: Any, ser: SerializerState) -> bytearray:
        if not self.allow:
            raise DecodeError(
                "peer sent a compressed frame, but compression was not negotiated on this connection "
                "(codec.compression is 'none' here or on the peer)"
            )
        t = type(data)
        if t is not bytes and t is not bytearray and t is not memoryview:
            raise DecodeError(f"compressed frame is a {t.__name__}, not a host buffer")
        lim = ser.limits
        n = data.nbytes if t is memoryview else len(data)
        check_decompressed_size(codec, n, raw_len, lim.max_frame_bytes, ser.max_compression_ratio)
        total = self.nbytes - n + raw_len
        if total > lim.max_message_bytes:
            raise FrameTooLarge(
                f"message decompresses to at least {total} bytes, above limits.max_message_bytes "
                f"({lim.max_message_bytes})"
            )
        out = decompress(codec, data, raw_len, lim.max_frame_bytes, ser.max_compression_ratio)
        self.nbytes = total
        return out


def short_record_max(limits: LimitsSection, max_header: int) -> int:
    """Records up to this many bytes can be unpacked with msgpack's default length limits.

    Those defaults are the record's own length (``unpackb`` sets them from ``len(data)``):
    no string, bytes, array, map or extension in a valid record can be longer, and on a
    record no longer than any of ``limits``' bounds they are at least as strict. Passing
    five limits fewer per call saves about a fifth of a small envelope's decode."""
    return min(
        max_header,
        limits.max_str_len,
        limits.max_bin_len,
        limits.max_array_len,
        limits.max_map_len,
        GC_PAUSE_BYTES - 1,
    )


class Decoder:
    """Decoding state at one extension nesting level. The frameless root (single-frame
    messages) and its children are immutable and shared; a multi-frame message builds its own
    chain so that it can track which frames the header referenced."""

    __slots__ = ("_child", "_frames", "_msg", "_ser", "_used", "depth", "hook_kw")

    def __init__(
        self,
        ser: SerializerState,
        frames: Sequence[Buffer],
        used: bytearray | None,
        depth: int,
        msg: _Message | None = None,
    ) -> None:
        self._ser = ser
        self._frames = frames
        self._used = used
        self._msg = msg
        self.depth = depth
        self._child: Decoder | None = None

    def _meta(self, data: bytes) -> Any:
        """Unpack a plain metadata record (bounded, no extensions allowed inside)."""
        try:
            return msgpack.unpackb(data, **self._ser._meta_kw)
        except ValueError as exc:  # msgpack's limits, malformed data, trailing bytes
            raise DecodeError(f"malformed or oversized metadata record: {exc}") from None

    def unpack(self, data: Any) -> Any:
        lim = self._ser.limits
        return msgpack.unpackb(
            data,
            ext_hook=self.hook,
            raw=False,
            strict_map_key=False,
            max_str_len=lim.max_str_len,
            max_bin_len=lim.max_bin_len,
            max_array_len=lim.max_array_len,
            max_map_len=lim.max_map_len,
            max_ext_len=self._ser._max_header,
        )

    def _child_unpack(self, data: bytes) -> list[Any]:
        c = self._child
        if c is None:
            if self.depth >= self._ser.limits.max_depth:
                raise DecodeError(f"objects nest deeper than limits.max_depth ({self._ser.limits.max_depth})")
            c = self._child = Decoder(self._ser, self._frames, self._used, self.depth + 1, self._msg)
        items = c.unpack(data)
        if type(items) is not list:
            raise DecodeError("malformed container record")
        return items

    def _frame(self, idx: Any) -> Buffer:
        frames = self._frames
        if type(idx) is not int or not 0 < idx < len(frames):
            raise DecodeError(f"header references frame {idx!r}, message has {max(len(frames), 1)} frame(s)")
        used = self._used
        assert used is not None  # frames is non-empty only for multi-frame decoders
        if used[idx]:
            raise DecodeError(f"header references frame {idx} twice")
        used[idx] = 1
        return frames[idx]

    def _take(self, ref: Any) -> Buffer:
        t = type(ref)
        if t is bytes:
            return ref
        if t is int:
            return self._frame(ref)
        if t is list and len(ref) == 3:
            idx, codec, raw_len = ref
            data = self._frame(idx)
            msg = self._msg
            assert msg is not None  # _frame succeeded: a multi-frame decoder
            return msg.inflate(data, codec, raw_len, self._ser)
        raise DecodeError("malformed buffer reference")

    def hook(self, code: int, data: bytes) -> Any:
        if code == EXT_BUFFER:
            return self._buffer(data)
        if code == EXT_NDARRAY:
            return self._ndarray(data)
        if code == EXT_TUPLE:
            return tuple(self._child_unpack(data))
        if code == EXT_NPSCALAR:
            return self._npscalar(data)
        if code == EXT_SET:
            return set(self._child_unpack(data))
        if code == EXT_FROZENSET:
            return frozenset(self._child_unpack(data))
        if code == EXT_COMPLEX:
            if len(data) != COMPLEX.size:
                raise DecodeError("malformed complex record")
            return complex(*COMPLEX.unpack(data))
        if code == EXT_BIGINT:
            if not data:
                raise DecodeError("empty integer record")
            return int.from_bytes(data, "little", signed=True)
        if code == EXT_DATACLASS:
            return self._dataclass(data)
        if code == EXT_DATETIME:
            return _decode_datetime(self._meta(data))
        if code == EXT_PICKLE:
            return self._pickle(data)
        if code == EXT_DEVICE:
            return self._device(data)
        raise DecodeError(f"unknown extension type {code}")

    def _buffer(self, data: bytes) -> Buffer:
        m = self._meta(data)
        if type(m) is not list or len(m) != 2:
            raise DecodeError("malformed buffer record")
        kind, ref = m
        buf = self._take(ref)
        if kind == BUF_BYTES:
            return buf if type(buf) is bytes else bytes(buf)
        if kind == BUF_BYTEARRAY:
            return buf if type(buf) is bytearray else bytearray(buf)
        if kind == BUF_MEMORYVIEW:
            return buf if type(buf) is memoryview else memoryview(buf)
        raise DecodeError(f"unknown buffer kind {kind!r}")

    def _ndarray(self, data: bytes) -> np.ndarray:
        m = self._meta(data)
        if type(m) is not list or len(m) not in (4, 5) or (len(m) == 5 and m[4] != 1):
            raise DecodeError("malformed array record")
        wire, shape, fortran, ref = m[:4]
        dt = self._ser._dtypes.from_wire(wire)
        if type(shape) is not list or len(shape) > _MAX_NDIM or type(fortran) is not bool:
            raise DecodeError("malformed array record")
        for s in shape:
            if type(s) is not int or s < 0:
                raise DecodeError(f"bad array shape {shape[:_MAX_NDIM]!r}")
        count = math.prod(shape)
        if dt.itemsize == 0 and count > self._ser.limits.max_array_len:
            # zero-size items take no buffer, but numpy still loops over every element
            raise DecodeError(f"array of {count} zero-size items exceeds limits.max_array_len")
        buf = self._take(ref)
        need = count * dt.itemsize
        if len(buf) != need:
            raise DecodeError(f"array {tuple(shape)} of {dt} needs {need} bytes, its buffer has {len(buf)}")
        if type(buf) is bytes and dt.itemsize:
            # packed inline (small): read-only, so copy once (users get writable arrays); a
            # bytearray copy plus frombuffer is the cheapest way there for the 1-D case
            if len(shape) == 1:
                arr = np.frombuffer(bytearray(buf), dt)
            else:
                arr = np.ndarray(shape, dt, buffer=bytearray(buf), order="F" if fortran else "C")
        else:
            arr = np.ndarray(shape, dt, buffer=buf, order="F" if fortran else "C")
            if not arr.flags.writeable:
                arr = arr.copy(order="K")  # read-only frame: copy once, users get a writable array
        if len(m) == 5:  # sent as a torch tensor: one again, sharing the memory, where torch is installed
            try:
                torch = importlib.import_module("torch")
            except ImportError:
                return arr
            return torch.from_dlpack(arr)
        return arr

    def _npscalar(self, data: bytes) -> np.generic:
        m = self._meta(data)
        if type(m) is not list or len(m) != 2 or type(m[1]) is not bytes:
            raise DecodeError("malformed numpy scalar record")
        dt = self._ser._dtypes.from_wire(m[0])
        if len(m[1]) != dt.itemsize or dt.itemsize == 0 or dt.subdtype is not None:
            raise DecodeError(f"numpy scalar of {dt} with {len(m[1])} bytes")
        arr = np.frombuffer(m[1], dt)
        return (arr if dt.fields is None else arr.copy())[0]

    def _dataclass(self, data: bytes) -> Any:
        m = self._child_unpack(data)
        if len(m) != 2 or type(m[0]) is not str or type(m[1]) is not list:
            raise DecodeError("malformed dataclass record")
        name, values = m
        entry = self._ser._by_name.get(name)
        if entry is None:
            raise DecodeError(
                f"unknown registered type {name[:200]!r}: call node.register_type(cls) for it on this node "
                f"too (every node that sends or receives it must register it)"
            )
        cls, fields = entry
        if len(values) != len(fields):
            raise DecodeError(f"{name}: sender has {len(values)} fields, this node's class has {len(fields)}")
        # Restore the way pickle does: no __init__ runs on data from the network.
        obj = cls.__new__(cls)
        for f, v in zip(fields, values, strict=True):
            object.__setattr__(obj, f, v)
        return obj

    def _device(self, data: bytes) -> Any:
        hook = self._ser.device_hook
        if hook is None:
            raise DecodeError("received a device array but this serializer has no device hook (not a node?)")
        m = self._meta(data)
        if type(m) is not list or len(m) != 3 or type(m[0]) is not int:
            raise DecodeError("malformed device array record")
        mode, meta, body = m
        if mode == DEVICE_STAGED:
            if type(body) is not int:
                raise DecodeError("malformed staged device array reference")
            return hook.decode(mode, meta, body)
        if type(body) is not list or len(body) > self._ser.limits.max_frames:
            raise DecodeError("malformed device array record")
        if mode == DEVICE_FRAMES:
            return hook.decode(mode, meta, [self._frame(r) for r in body])
        if mode == DEVICE_INLINE:
            return hook.decode(mode, meta, [self._take(r) for r in body])
        raise DecodeError(f"unknown device array mode {mode!r}")

    def _pickle(self, data: bytes) -> Any:
        return unpickle_record(data, self._ser.allow_pickle, self._meta, self._take)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector while one large header is unpacked.

    A header of many small containers (a peer controls that) creates millions of objects
    that cannot form cycles, yet every 700 allocations trigger a collection that also walks
    the survivors: measured, a 16 MB header of empty lists took 4.0 s with the collector on
    and 2.3 s with it paused. Re-enabled afterwards, and never enabled if it was off.
    """
    was = gc.isenabled()
    if was:
        gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def meta_limits(lim: LimitsSection, max_header: int) -> dict[str, Any]:
    """msgpack bounds for metadata records: they hold a few scalars, a shape, a dtype
    description (at most MAX_DTYPE_FIELDS fields) or frame references (at most max_frames),
    never extensions; a peer must not make one cost more than that."""
    return {
        "raw": False,
        "max_array_len": max(lim.max_frames, MAX_DTYPE_FIELDS) + 8,
        "max_map_len": 256,
        "max_str_len": min(lim.max_str_len, max_header),
        "max_bin_len": max_header,
        "max_ext_len": 0,
    }


def _decode_datetime(m: Any) -> Any:
    if type(m) is not list or not m:
        raise DecodeError("malformed datetime record")
    kind = m[0]
    if kind == DT_TIMEDELTA and len(m) == 4 and all(type(x) is int for x in m[1:]):
        return _dt.timedelta(days=m[1], seconds=m[2], microseconds=m[3])
    if len(m) != 2 or type(m[1]) is not str or len(m[1]) > 64:
        raise DecodeError("malformed datetime record")
    if kind == DT_DATETIME:
        return _dt.datetime.fromisoformat(m[1])
    if kind == DT_DATE:
        return _dt.date.fromisoformat(m[1])
    if kind == DT_TIME:
        return _dt.time.fromisoformat(m[1])
    raise DecodeError(f"unknown datetime kind {kind!r}")


def _frame_len(f: Any, i: int) -> tuple[Buffer, int]:
    """Check one received frame's type; return it as a flat byte buffer and its size."""
    t = type(f)
    if t is bytes or t is bytearray or t is OwnedFrame:  # OwnedFrame: a sender's copy, shared by inproc://
        return f, len(f)
    if t is memoryview:
        if f.format != "B" or f.ndim != 1:
            if not f.c_contiguous:
                raise DecodeError(f"frame {i} is a non-contiguous memoryview")
            f = f.cast("B")
        elif not f.contiguous:
            raise DecodeError(f"frame {i} is a non-contiguous memoryview")
        return f, len(f)
    if hasattr(f, "__cuda_array_interface__"):  # a device frame (the transport moves device memory)
        try:
            return f, frame_nbytes(f)
        except (AttributeError, TypeError, ValueError, KeyError, IndexError):
            raise DecodeError(f"frame {i} is a device buffer without a size") from None
    raise DecodeError(f"frame {i} is a {t.__name__}, not a buffer")


def decode_frames(ser: SerializerState, frames: Sequence[Buffer], allow_compressed: bool) -> tuple[Any, int]:
    """Decode a multi-frame message (or a single frame too large for the fast path); return
    the object and the message's size once decompressed."""
    n = len(frames)
    if n == 0:
        raise DecodeError("empty message (no header frame)")
    lim = ser.limits
    if n - 1 > lim.max_frames:
        raise TooManyFrames(f"message has {n - 1} buffers, above limits.max_frames ({lim.max_frames})")
    header, hlen = _frame_len(frames[0], 0)
    if hlen > ser._max_header:
        raise FrameTooLarge(f"header of {hlen} bytes exceeds limits.max_header_bytes ({ser._max_header})")
    flat: list[Buffer] = [header]
    total = hlen
    for i in range(1, n):
        f, size = _frame_len(frames[i], i)
        if size > lim.max_frame_bytes:
            raise FrameTooLarge(f"frame {i} of {size} bytes exceeds limits.max_frame_bytes")
        total += size
        flat.append(f)
    if total > lim.max_message_bytes:
        raise FrameTooLarge(f"message of {total} bytes exceeds limits.max_message_bytes")
    used = bytearray(n)
    used[0] = 1
    msg = _Message(total, allow_compressed)
    obj = Decoder(ser, flat, used, 0, msg).unpack(header)
    if 0 in used:
        raise DecodeError(f"frame {used.index(0)} is not referenced by the header (corrupt message?)")
    return obj, msg.nbytes
