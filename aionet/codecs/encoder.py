"""Objects -> frames: the encoder behind :meth:`Serializer.dumps <aionet.codecs.serialize.Serializer.dumps>`.

One ``msgpack.Packer.pack`` per message with a ``default`` hook for the types msgpack lacks
(see :mod:`aionet.codecs.extensions` for their records). Large buffers (numpy arrays,
bytes-likes of at least ``oob_min_bytes``) leave the header as out-of-band frames that alias
the caller's memory: no copy on the sender, compressed when the connection negotiated it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
from msgpack import ExtType

from ..errors import SerializationError
from .compression import compress_buffer
from .extensions import (
    BUF_BYTEARRAY,
    BUF_BYTES,
    BUF_MEMORYVIEW,
    COMPLEX,
    DEVICE_FRAMES,
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
    qualname,
)
from .pickling import pickle_record

__all__ = ["Encoder"]

# Types the pre-pack walk must look at: containers msgpack packs natively (so ``default``
# never sees their items) and bytes-likes (packed inline by msgpack unless lifted out).
_WALK = frozenset({list, dict, bytes, bytearray, memoryview})
_SCAN_MIN = 16  # lists/dicts longer than this are first scanned at C speed via set(map(type))
_MAX_WALK_DEPTH = 500  # below msgpack's own nesting limit (511), before RecursionError
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1


class Encoder:
    """Encoding state for one message at a time. The serializer keeps one per thread and
    builds a throw-away one on re-entry (user code running inside pickle calling dumps),
    because msgpack packers are neither re-entrant nor thread-safe."""

    __slots__ = (
        "_compress",
        "_depth",
        "_dispatch",
        "_max_depth",
        "_meta",
        "_oob",
        "_oob_min",
        "_packers",
        "_ser",
        "busy",
        "raw_extra",
        "raw_max",
    )

    def __init__(self, ser: SerializerState) -> None:
        self._ser = ser
        self.busy = False
        self._oob_min = ser._oob_min
        self._max_depth = ser.limits.max_depth
        self._oob: list[Buffer] = []
        self._compress = False
        self._depth = 0
        # what compression hid from the frame sizes of the last message: its extra bytes
        # once inflated, and its largest inflated frame (the sender checks limits on these)
        self.raw_extra = 0
        self.raw_max = 0
        # Packer for plain metadata lists: it has no default hook, so it can never be
        # re-entered and is safe to use from inside any other packer's hook.
        self._meta = msgpack.Packer(use_bin_type=True, buf_size=1024)
        # One packer per extension nesting level (a tuple inside a tuple packs its items
        # with the next packer while the outer one is mid-pack).
        self._packers = [self._new_packer(64 * 1024)]
        self._dispatch: dict[type, Callable[[Any], Any]] = {
            tuple: self._tuple,
            set: self._set,
            frozenset: self._set,
            complex: self._complex,
            int: self._bigint,
            np.ndarray: self._ndarray,
            _dt.datetime: self._datetime,
            _dt.date: self._datetime,
            _dt.time: self._datetime,
            _dt.timedelta: self._datetime,
        }

    def _new_packer(self, buf_size: int = 4096) -> msgpack.Packer:
        # strict_types routes tuples and subclasses (np.float64, IntEnum, ...) to _default.
        return msgpack.Packer(
            default=self._default, strict_types=True, use_bin_type=True, datetime=False, buf_size=buf_size
        )

    def encode(self, obj: Any, compress: bool) -> list[Buffer]:
        self.busy = True
        self._compress = compress
        self.raw_extra = self.raw_max = 0
        try:
            t = type(obj)
            if t is list or t is dict:
                if self._has_buffers(obj, 0):
                    obj = self._lift(obj)
            elif t in _WALK:
                obj = self._lift(obj)
            header = self._packers[0].pack(obj)
        except BaseException as exc:
            # Drop the partial frames without binding them to a local: a traceback kept by the
            # caller must not pin this encoder's frame list (it would pin the next messages').
            self._oob = []
            self.busy = False
            if isinstance(exc, SerializationError) or not isinstance(
                exc, (TypeError, ValueError, OverflowError, RecursionError, BufferError)
            ):
                raise
            raise SerializationError(f"cannot serialize {type(obj).__name__} message: {exc}") from exc
        oob = self._oob
        if oob:
            self._oob = []  # hand the frames to the caller, keep no references
        self.busy = False
        if len(header) > self._ser._max_header:
            raise SerializationError(_header_too_big(len(header), self._ser._max_header))
        if not oob:
            return [header]
        if len(oob) > self._ser.limits.max_frames:
            raise SerializationError(
                f"message has {len(oob)} out-of-band buffers, above limits.max_frames "
                f"({self._ser.limits.max_frames}); batch small arrays into one"
            )
        oob.insert(0, header)
        return oob

    # -------------------------------------------------------------- pre-pack walk
    # msgpack packs bytes-likes inline and never shows them to ``default``, so before packing
    # we walk plain lists/dicts and replace large bytes (and every bytearray/memoryview, to
    # keep their type) by buffer records. Containers are copied only along the path to a
    # replacement; when nothing changes the caller's object is packed as is.
    def _has_buffers(self, obj: list[Any] | dict[Any, Any], depth: int) -> bool:
        """Does this plain list/dict hold, at any depth, a bytes-like that must be lifted?

        The cheap question asked of every message; only a yes pays for :meth:`_lift`.
        """
        if depth > _MAX_WALK_DEPTH:
            raise SerializationError(f"message nests deeper than {_MAX_WALK_DEPTH} levels")
        items = obj if type(obj) is list else obj.values()
        if len(obj) > _SCAN_MIN and _WALK.isdisjoint(set(map(type, items))):
            return False  # C-speed scan of long containers of scalars
        oob_min = self._oob_min
        for x in items:
            t = type(x)
            if t is bytes:
                if len(x) >= oob_min:
                    return True
            elif t is list or t is dict:
                if self._has_buffers(x, depth + 1):
                    return True
            elif t is bytearray or t is memoryview:
                return True
        return False

    def _lift(self, obj: Any, depth: int = 0) -> Any:
        """Return ``obj`` with its bytes-likes replaced by buffer records; copies only the
        containers on the path to a replacement (the caller's objects are never modified)."""
        t = type(obj)
        if t is list:
            if depth > _MAX_WALK_DEPTH:
                raise SerializationError(f"message nests deeper than {_MAX_WALK_DEPTH} levels")
            out = None
            for i, x in enumerate(obj):
                if type(x) in _WALK:
                    y = self._lift(x, depth + 1)
                    if y is not x:
                        if out is None:
                            out = obj.copy()
                        out[i] = y
            return obj if out is None else out
        if t is dict:
            if depth > _MAX_WALK_DEPTH:
                raise SerializationError(f"message nests deeper than {_MAX_WALK_DEPTH} levels")
            dout = None
            for k, v in obj.items():
                if type(v) in _WALK:
                    y = self._lift(v, depth + 1)
                    if y is not v:
                        if dout is None:
                            dout = obj.copy()
                        dout[k] = y
            return obj if dout is None else dout
        if t is bytes:
            return obj if len(obj) < self._oob_min else self._buffer(obj, BUF_BYTES)
        if t is bytearray:
            return self._buffer(obj, BUF_BYTEARRAY)
        if t is memoryview:
            return self._buffer(obj, BUF_MEMORYVIEW)
        return obj

    def _lift_owned(self, items: list[Any]) -> list[Any]:
        """Lift the items of a list this encoder built itself (safe to modify in place)."""
        for i, x in enumerate(items):
            if type(x) in _WALK:
                items[i] = self._lift(x)
        return items

    def _nested(self, obj: Any) -> bytes:
        """Pack ``obj`` as the payload of an extension record, one nesting level down."""
        d = self._depth + 1
        if d > self._max_depth:
            raise SerializationError(f"objects nest deeper than limits.max_depth ({self._max_depth})")
        packers = self._packers
        if d == len(packers):
            packers.append(self._new_packer())
        self._depth = d
        try:
            return packers[d].pack(obj)
        finally:
            self._depth = d - 1

    # -------------------------------------------------------------- buffers
    def _add_frame(self, buf: Buffer, nbytes: int) -> int | list[Any]:
        """Append ``buf`` (no copy) or its compressed form as a frame; return the reference."""
        oob = self._oob
        idx = len(oob) + 1
        if self._compress and nbytes >= self._ser.compress_min_bytes:
            packed = compress_buffer(buf, self._ser._codec, self._ser.max_compression_ratio)
            if packed is not None:
                oob.append(packed[1])
                self.raw_extra += nbytes - len(packed[1])
                if nbytes > self.raw_max:
                    self.raw_max = nbytes
                return [idx, packed[0], nbytes]
        oob.append(buf)
        return idx

    def _buffer(self, obj: bytes | bytearray | memoryview, kind: int) -> ExtType:
        if kind == BUF_MEMORYVIEW and (obj.format != "B" or obj.ndim != 1):
            obj = obj.cast("B") if obj.c_contiguous else memoryview(obj.tobytes())
        elif kind == BUF_MEMORYVIEW and not obj.c_contiguous:
            obj = memoryview(obj.tobytes())
        n = len(obj)
        ref: Any = bytes(obj) if n < self._oob_min else self._add_frame(obj, n)
        return ExtType(EXT_BUFFER, self._meta.pack([kind, ref]))

    # -------------------------------------------------------------- msgpack default hook
    def _default(self, o: Any) -> Any:
        fn = self._dispatch.get(type(o))
        if fn is not None:
            return fn(o)
        return self._fallback(o)

    def _tuple(self, o: tuple[Any, ...]) -> ExtType:
        return ExtType(EXT_TUPLE, self._nested(self._lift_owned(list(o))))

    def _set(self, o: set[Any] | frozenset[Any]) -> ExtType:
        code = EXT_SET if type(o) is set else EXT_FROZENSET
        return ExtType(code, self._nested(self._lift_owned(list(o))))

    def _complex(self, o: complex) -> ExtType:
        return ExtType(EXT_COMPLEX, COMPLEX.pack(o.real, o.imag))

    def _bigint(self, o: int) -> Any:
        v = int(o)
        if _INT64_MIN <= v <= _UINT64_MAX:
            return v  # an int subclass (IntEnum ...) that fits: send the plain value
        return ExtType(EXT_BIGINT, v.to_bytes(v.bit_length() // 8 + 1, "little", signed=True))

    def _datetime(self, o: Any) -> ExtType:
        t = type(o)
        if t is _dt.timedelta:
            rec: list[Any] = [DT_TIMEDELTA, o.days, o.seconds, o.microseconds]
        else:
            rec = [DT_DATETIME if t is _dt.datetime else DT_DATE if t is _dt.date else DT_TIME, o.isoformat()]
        return ExtType(EXT_DATETIME, self._meta.pack(rec))

    def _torch(self, t: Any) -> Any:
        """A CPU torch tensor: its memory viewed through DLPack (no copy), sent as an array that
        the receiver turns back into a tensor (or leaves as numpy where torch is not installed).
        A CUDA tensor takes the device path (``__cuda_array_interface__``), like a CuPy array."""
        if t.device.type != "cpu":
            hook = self._ser.device_hook
            rec = hook.encode(t) if hook is not None and t.device.type == "cuda" else None
            if rec is not None:
                return self._device(*rec)
            return self._unsendable(
                t, f"{t.device.type} torch tensors travel only between nodes (CUDA, staged): send t.cpu()"
            )
        try:
            a = np.from_dlpack(t.detach().resolve_conj().resolve_neg())
        except (BufferError, TypeError, RuntimeError) as exc:
            return self._unsendable(t, f"a torch tensor of dtype {t.dtype} has no numpy view ({exc}); convert it first")
        return self._ndarray(a, torch=True)

    def _ndarray(self, a: np.ndarray, torch: bool = False) -> Any:
        wire = self._ser._dtypes.to_wire(a.dtype)
        if wire is None:
            return self._unsendable(a, f"numpy arrays of dtype {a.dtype} cannot be sent as raw memory")
        flags = a.flags
        if flags.c_contiguous:
            order = "C"
        elif flags.f_contiguous:
            order = "F"
        else:
            a = np.ascontiguousarray(a)  # the one copy a strided view needs
            order = "C"
        nbytes = a.nbytes
        if nbytes < self._oob_min or nbytes == 0:
            ref: Any = a.tobytes(order=order)
        else:
            # ravel in the array's own order is a view; viewing as bytes makes any dtype
            # (datetime, structured, ...) exportable through the buffer protocol.
            ref = self._add_frame(memoryview(a.ravel(order=order).view(np.uint8)), nbytes)
        rec = [wire, a.shape, order == "F", ref, 1] if torch else [wire, a.shape, order == "F", ref]
        return ExtType(EXT_NDARRAY, self._meta.pack(rec))

    def _npscalar(self, o: np.generic) -> Any:
        wire = self._ser._dtypes.to_wire(o.dtype)
        if wire is None:
            return self._unsendable(o, f"numpy scalars of dtype {o.dtype} cannot be sent")
        return ExtType(EXT_NPSCALAR, self._meta.pack([wire, o.tobytes()]))

    def _dataclass(self, o: Any, name: str, fields: tuple[str, ...]) -> ExtType:
        values = self._lift_owned([getattr(o, f) for f in fields])
        return ExtType(EXT_DATACLASS, self._nested([name, values]))

    def _pickle(self, o: Any) -> ExtType:
        return ExtType(EXT_PICKLE, self._meta.pack(pickle_record(o, self._oob_min, self._add_frame)))

    def _fallback(self, o: Any) -> Any:
        t = type(o)
        if isinstance(o, np.generic):
            self._dispatch[t] = self._npscalar  # numpy has many scalar types: learn them as seen
            return self._npscalar(o)
        entry = self._ser._by_type.get(t)
        if entry is not None:
            return self._dataclass(o, entry[0], entry[1])
        if isinstance(o, np.memmap):
            return self._ndarray(o.view(np.ndarray))
        if t.__module__.startswith("torch") and hasattr(o, "__dlpack__") and hasattr(o, "detach"):
            self._dispatch[t] = self._torch  # torch imported by the caller: tensors are common, learn the type
            return self._torch(o)
        if isinstance(o, np.ndarray):
            return self._unsendable(o, f"numpy array subclass {qualname(t)} is not supported")
        # Subclasses of plain types travel as their base type (what msgpack would do).
        if isinstance(o, int):
            return self._bigint(o)
        if isinstance(o, float):
            return float(o)
        if isinstance(o, str):
            return str.__str__(o)
        if isinstance(o, bytes):
            return self._lift(bytes(o))
        if isinstance(o, bytearray):
            return self._buffer(bytearray(o), BUF_BYTEARRAY)
        if isinstance(o, list):
            return self._lift(list(o))
        if isinstance(o, dict):
            return self._lift(dict(o))
        if isinstance(o, tuple):
            return self._tuple(o)
        if isinstance(o, (set, frozenset)):
            return ExtType(
                EXT_FROZENSET if isinstance(o, frozenset) else EXT_SET,
                self._nested(self._lift_owned(list(o))),
            )
        hook = self._ser.device_hook
        if hook is not None:
            rec = hook.encode(o)
            if rec is not None:
                return self._device(*rec)
        return self._unsendable(o, None)

    def _device(self, mode: int, meta: Any, data: Any) -> ExtType:
        if mode == DEVICE_STAGED:
            body: Any = int(data)
        elif mode == DEVICE_FRAMES:
            body = []
            for f in data:  # device memory: never compressed, never touched by the host
                self._oob.append(f)
                body.append(len(self._oob))
        else:
            body = []
            for f in data:
                mv = f if type(f) is memoryview else memoryview(f)
                n = mv.nbytes
                body.append(bytes(mv) if n < self._oob_min else self._add_frame(mv, n))
        return ExtType(EXT_DEVICE, self._meta.pack([mode, meta, body]))

    def _unsendable(self, o: Any, why: str | None) -> Any:
        if self._ser.allow_pickle:
            return self._pickle(o)
        t = type(o)
        if why is None and dataclasses.is_dataclass(o):
            raise SerializationError(
                f"cannot serialize {qualname(t)}: it is a dataclass but is not registered; call "
                f"node.register_type({t.__qualname__}) on every node that sends or receives it "
                f"(Serializer.register for a serializer used without a node)"
            )
        if why is None:
            why = f"cannot serialize an object of type {qualname(t)}"
        raise SerializationError(
            f"{why}: aionet sends msgpack types, tuples, sets, complex, datetime, numpy arrays and "
            f"scalars of fixed-size dtypes, bytes-likes and registered dataclasses "
            f"(node.register_type(cls)); convert the value, or let the cluster opt into pickle "
            f"(security.allow_pickle = true)"
        )


def _header_too_big(n: int, limit: int) -> str:
    return (
        f"message header is {n} bytes, above limits.max_header_bytes ({limit}); send bulk data "
        f"as numpy arrays or bytes, which travel out of band"
    )
