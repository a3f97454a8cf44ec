"""Objects <-> messages: frame 0 is a msgpack header, frames 1..N are out-of-band buffers.

The node calls :meth:`Serializer.dumps` / :meth:`Serializer.loads` once per message, mostly on
small envelopes such as ``[2, 17, "echo", payload]``, so the common case is one
``msgpack.Packer.pack`` and one ``msgpack.unpackb`` with extension hooks and no per-message
objects beyond the header itself. Large payloads take the other road: numpy arrays and
bytes-likes of at least ``oob_min_bytes`` leave the header as separate frames that alias the
caller's memory (no copy on the sender), and the receiver builds arrays directly on the
received frames (no copy on the receiver).

What round-trips, and what it costs on the receiver:

* msgpack types; ``tuple``, ``set``, ``frozenset``, ``complex``, integers beyond 64 bits,
  ``datetime``/``date``/``time``/``timedelta`` (time zones travel as fixed UTC offsets),
  numpy scalars (as the same numpy type) and dict keys of any of these hashable types.
* ``numpy.ndarray`` of any fixed-size dtype (no object or StringDType fields), any shape and
  memory order. The array aliases the received frame and is writable when the frame is
  (``bytearray`` or a writable ``memoryview``); a read-only frame (``bytes``) is copied once
  so users always get a writable array.
* ``bytearray`` (zero-copy when the frame is a ``bytearray``), ``memoryview`` (a flat
  unsigned-byte view over the received frame) and ``bytes``. Producing ``bytes`` from a
  frame that is not already ``bytes`` costs one copy on the receiver: numpy arrays,
  ``bytearray`` and ``memoryview`` are the zero-copy types.
* dataclasses registered with :meth:`Serializer.register` on both ends (restored like
  pickle restores objects: fields are set without calling ``__init__``).
* anything else only with ``allow_pickle=True`` (pickle protocol 5, large buffers still out of
  band). With pickle off, a pickle record from the network is rejected without unpickling.
* device arrays (CuPy, ``__cuda_array_interface__``, CUDA DLPack) when a :class:`DeviceHook`
  is installed (the node installs one, see ``aionet/core/device_transfer.py``): unknown types are
  offered to the hook *after* every other check fails, so plain messages never pay for it.

Subclasses of ``int``/``float``/``str``/``bytes``/``list``/``dict``/``tuple`` (enums with a
value mixin, named tuples, ``OrderedDict``...) travel as their base type.

Every decoding failure raises :class:`~aionet.errors.DecodeError` (a
:class:`~aionet.errors.ProtocolError`): the input is treated as hostile. A serializer is safe
to share between threads (a busy or re-entered encoder falls back to a fresh one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import gc
import math
import pickle
import re
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

import msgpack
import numpy as np
from msgpack import ExtType

from ..config import LimitsSection
from ..errors import ConfigError, DecodeError, FrameTooLarge, ProtocolError, SerializationError, TooManyFrames
from .compression import CODECS, LZ4, LZ4_MAX_EXPANSION, check_decompressed_size, compress_buffer, decompress

if TYPE_CHECKING:
    from ..config import Config

__all__ = ["Buffer", "DecodeDeferred", "DeviceHook", "Serializer", "check_descr_bounds"]

Buffer = bytes | bytearray | memoryview
T = TypeVar("T", bound=type)

# ---------------------------------------------------------------- wire format
# Extension codes in the header. Each record's payload is msgpack; buffer references ("ref")
# are ``bytes`` (inline data), ``int`` (index of an out-of-band frame) or
# ``[index, codec, raw_len]`` (a compressed out-of-band frame).
EXT_TUPLE = 1  # [items...]
EXT_SET = 2  # [items...]
EXT_FROZENSET = 3  # [items...]
EXT_COMPLEX = 4  # struct "<dd"
EXT_BIGINT = 5  # little-endian two's complement
EXT_NPSCALAR = 6  # [dtype, raw bytes]
EXT_NDARRAY = 7  # [dtype, shape, fortran_order, ref]
EXT_BUFFER = 8  # [kind, ref]
EXT_DATACLASS = 9  # [name, [field values...]]
EXT_DATETIME = 10  # [kind, value...]
EXT_PICKLE = 11  # [pickle bytes, [refs...]]
EXT_DEVICE = 12  # [mode, staging header | None, data]  (see DeviceHook)

# EXT_DEVICE modes: how a device array's bytes travel
DEVICE_INLINE = 0  # data = [refs...]: host copies of the chunks, in this message
DEVICE_STAGED = 1  # data = transfer id: the chunks went ahead as separate link messages
DEVICE_FRAMES = 2  # data = [ref]: one device buffer frame (transport moves device memory)

_BYTES, _BYTEARRAY, _MEMORYVIEW = 0, 1, 2
_DATETIME, _DATE, _TIME, _TIMEDELTA = 0, 1, 2, 3

# Types the pre-pack walk must look at: containers msgpack packs natively (so ``default``
# never sees their items) and bytes-likes (packed inline by msgpack unless lifted out).
_WALK = frozenset({list, dict, bytes, bytearray, memoryview})
_SCAN_MIN = 16  # lists/dicts longer than this are first scanned at C speed via set(map(type))
_MAX_WALK_DEPTH = 500  # below msgpack's own nesting limit (511), before RecursionError
_MAX_NDIM = 64
_COMPLEX = struct.Struct("<dd")
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1

# Array dtypes that may travel: fixed-size plain data only. Object fields hold pointers and
# StringDType ("T") holds arena pointers; both would be memory-unsafe to rebuild from bytes.
_SENDABLE_KINDS = frozenset("biufcmMSUV")
_DTYPE_STR = re.compile(r"[<>|=][biufcmMSUV]\d{1,10}(\[\d{0,10}[a-zA-Z]{1,3}\])?")
_DTYPE_CACHE_MAX = 256
#: Bounds on a structured dtype a peer may describe (checked before numpy parses it).
MAX_DTYPE_FIELDS = 4096  # fields in all, nested ones included (numpy: ~1 us each)
MAX_DTYPE_DEPTH = 8  # nesting of structured fields
MAX_DTYPE_NAME = 1024  # characters in a field name or title
MAX_DTYPE_SUBARRAY_NDIM = 32  # dimensions of a field's subarray shape (numpy's own limit)
_INT32_MAX = 2**31 - 1
_GC_PAUSE_BYTES = 256 * 1024  # headers at least this big are unpacked with the cyclic GC paused


# ---------------------------------------------------------------- dtypes
def _descr_to_wire(descr: Any) -> Any:
    """numpy's descr (lists of tuples) -> plain nested lists msgpack packs without hooks."""
    if isinstance(descr, str):
        return descr
    return [
        [_descr_to_wire(x) if isinstance(x, list) else (list(x) if isinstance(x, tuple) else x) for x in field]
        for field in descr
    ]


def _descr_from_wire(w: Any) -> Any:
    """Validate a hostile wire descr and rebuild numpy's tuple form.

    Everything numpy's cost depends on is bounded first (fields in all, nesting depth, name
    length, subarray dimensions): building a dtype costs time linear in its fields, and an
    unbounded description (500,000 fields in a 6 MB header) stalled a node for seconds.
    """
    budget = [MAX_DTYPE_FIELDS]
    return _descr_walk(w, 0, budget)


def _descr_walk(w: Any, depth: int, budget: list[int]) -> Any:
    if type(w) is str:
        if not _DTYPE_STR.fullmatch(w):
            raise DecodeError(f"bad dtype {w[:80]!r}")
        return w
    if type(w) is not list or not w:
        raise DecodeError("bad structured dtype description")
    if depth >= MAX_DTYPE_DEPTH:
        raise DecodeError(f"structured dtype nests deeper than {MAX_DTYPE_DEPTH} levels")
    budget[0] -= len(w)
    if budget[0] < 0:
        raise DecodeError(f"structured dtype has more than {MAX_DTYPE_FIELDS} fields")
    out = []
    for field in w:
        if type(field) is not list or len(field) not in (2, 3):
            raise DecodeError("bad structured dtype field")
        name = field[0]
        if type(name) is list:
            if len(name) != 2 or not all(type(x) is str and len(x) <= MAX_DTYPE_NAME for x in name):
                raise DecodeError("bad structured dtype field title")
            name = tuple(name)
        elif type(name) is not str or len(name) > MAX_DTYPE_NAME:
            raise DecodeError(f"bad structured dtype field name (a str of at most {MAX_DTYPE_NAME} characters)")
        item: tuple[Any, ...] = (name, _descr_walk(field[1], depth + 1, budget))
        if len(field) == 3:
            shape = field[2]
            if type(shape) is not list or len(shape) > MAX_DTYPE_SUBARRAY_NDIM:
                raise DecodeError("bad structured dtype field shape")
            for s in shape:
                if type(s) is not int or not 0 <= s <= _INT32_MAX:
                    raise DecodeError("bad structured dtype field shape")
            item += (tuple(shape),)
        out.append(item)
    return out


def check_descr_bounds(descr: Any) -> None:
    """Raise DecodeError unless a dtype description from the network (a typestr, or numpy's
    ``descr`` as lists or tuples) stays within the bounds above: call it before handing the
    description to numpy (``np.dtype`` costs time linear in the fields, and more)."""
    _bounds_walk(descr, 0, [MAX_DTYPE_FIELDS])


def _bounds_walk(w: Any, depth: int, budget: list[int]) -> None:
    t = type(w)
    if t is str:
        if len(w) > 64:
            raise DecodeError(f"bad dtype {w[:80]!r}")
        return
    if t is not list and t is not tuple:
        raise DecodeError("bad dtype description")
    if depth >= MAX_DTYPE_DEPTH:
        raise DecodeError(f"structured dtype nests deeper than {MAX_DTYPE_DEPTH} levels")
    budget[0] -= len(w)
    if budget[0] < 0:
        raise DecodeError(f"structured dtype has more than {MAX_DTYPE_FIELDS} fields")
    for field in w:
        if type(field) not in (list, tuple) or len(field) not in (2, 3):
            raise DecodeError("bad structured dtype field")
        names = field[0] if type(field[0]) in (list, tuple) else (field[0],)
        if len(names) > 2 or not all(type(x) is str and len(x) <= MAX_DTYPE_NAME for x in names):
            raise DecodeError(f"bad structured dtype field name (a str of at most {MAX_DTYPE_NAME} characters)")
        _bounds_walk(field[1], depth + 1, budget)
        if len(field) == 3:
            shape = field[2]
            if type(shape) is int:
                shape = (shape,)
            if type(shape) not in (list, tuple) or len(shape) > MAX_DTYPE_SUBARRAY_NDIM:
                raise DecodeError("bad structured dtype field shape")
            if not all(type(x) is int and 0 <= x <= _INT32_MAX for x in shape):
                raise DecodeError("bad structured dtype field shape")


def _dtype_ok(dt: np.dtype) -> bool:
    if dt.hasobject:
        return False
    if dt.fields is not None:
        return all(_dtype_ok(f[0]) for f in dt.fields.values())
    if dt.subdtype is not None:
        return _dtype_ok(dt.subdtype[0])
    if dt.kind in "SU" and dt.itemsize == 0:
        return False  # numpy silently widens S0/U0 to one char: it would read past the buffer
    return dt.kind in _SENDABLE_KINDS and type(dt) is np.dtype(dt.str).__class__


def _dtype_from_wire_uncached(w: Any, max_itemsize: int = 2**62) -> np.dtype:
    descr = _descr_from_wire(w)
    try:
        dt = np.dtype(descr) if type(descr) is str else np.lib.format.descr_to_dtype(descr)
    except (TypeError, ValueError, OverflowError, KeyError, IndexError) as exc:
        raise DecodeError(f"bad dtype description: {exc}") from None
    if dt.itemsize > max_itemsize:
        raise DecodeError(f"dtype {str(dt)[:80]} has {dt.itemsize}-byte items, above limits.max_frame_bytes")
    if not _dtype_ok(dt):
        raise DecodeError(f"dtype {dt} cannot be received (object or variable-size fields)")
    return dt


# ---------------------------------------------------------------- device arrays
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


# ---------------------------------------------------------------- encoder
class _Encoder:
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

    def __init__(self, ser: Serializer) -> None:
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
            return obj if len(obj) < self._oob_min else self._buffer(obj, _BYTES)
        if t is bytearray:
            return self._buffer(obj, _BYTEARRAY)
        if t is memoryview:
            return self._buffer(obj, _MEMORYVIEW)
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
        if kind == _MEMORYVIEW and (obj.format != "B" or obj.ndim != 1):
            obj = obj.cast("B") if obj.c_contiguous else memoryview(obj.tobytes())
        elif kind == _MEMORYVIEW and not obj.c_contiguous:
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
        return ExtType(EXT_COMPLEX, _COMPLEX.pack(o.real, o.imag))

    def _bigint(self, o: int) -> Any:
        v = int(o)
        if _INT64_MIN <= v <= _UINT64_MAX:
            return v  # an int subclass (IntEnum ...) that fits: send the plain value
        return ExtType(EXT_BIGINT, v.to_bytes(v.bit_length() // 8 + 1, "little", signed=True))

    def _datetime(self, o: Any) -> ExtType:
        t = type(o)
        if t is _dt.timedelta:
            rec: list[Any] = [_TIMEDELTA, o.days, o.seconds, o.microseconds]
        else:
            rec = [_DATETIME if t is _dt.datetime else _DATE if t is _dt.date else _TIME, o.isoformat()]
        return ExtType(EXT_DATETIME, self._meta.pack(rec))

    def _ndarray(self, a: np.ndarray) -> Any:
        wire = self._ser._dtype_wire(a.dtype)
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
        return ExtType(EXT_NDARRAY, self._meta.pack([wire, a.shape, order == "F", ref]))

    def _npscalar(self, o: np.generic) -> Any:
        wire = self._ser._dtype_wire(o.dtype)
        if wire is None:
            return self._unsendable(o, f"numpy scalars of dtype {o.dtype} cannot be sent")
        return ExtType(EXT_NPSCALAR, self._meta.pack([wire, o.tobytes()]))

    def _dataclass(self, o: Any, name: str, fields: tuple[str, ...]) -> ExtType:
        values = self._lift_owned([getattr(o, f) for f in fields])
        return ExtType(EXT_DATACLASS, self._nested([name, values]))

    def _pickle(self, o: Any) -> ExtType:
        refs: list[Any] = []

        def out_of_band(pb: pickle.PickleBuffer) -> bool:
            try:
                raw = pb.raw()
            except BufferError:
                return True  # not contiguous: let pickle keep it in-band
            if raw.nbytes < self._oob_min:
                return True
            refs.append(self._add_frame(raw, raw.nbytes))
            return False

        try:
            data = pickle.dumps(o, protocol=5, buffer_callback=out_of_band)
        except Exception as exc:
            raise SerializationError(f"cannot pickle {_qualname(type(o))}: {exc}") from exc
        return ExtType(EXT_PICKLE, self._meta.pack([data, refs]))

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
        if isinstance(o, np.ndarray):
            return self._unsendable(o, f"numpy array subclass {_qualname(t)} is not supported")
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
            return self._buffer(bytearray(o), _BYTEARRAY)
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
                f"cannot serialize {_qualname(t)}: it is a dataclass but is not registered; call "
                f"node.register_type({t.__qualname__}) on every node that sends or receives it "
                f"(Serializer.register for a serializer used without a node)"
            )
        if why is None:
            why = f"cannot serialize an object of type {_qualname(t)}"
        raise SerializationError(
            f"{why}: aionet sends msgpack types, tuples, sets, complex, datetime, numpy arrays and "
            f"scalars of fixed-size dtypes, bytes-likes and registered dataclasses "
            f"(node.register_type(cls)); convert the value, or let the cluster opt into pickle "
            f"(security.allow_pickle = true)"
        )


def _qualname(t: type) -> str:
    return f"{t.__module__}.{t.__qualname__}"


def _header_too_big(n: int, limit: int) -> str:
    return (
        f"message header is {n} bytes, above limits.max_header_bytes ({limit}); send bulk data "
        f"as numpy arrays or bytes, which travel out of band"
    )


# ---------------------------------------------------------------- decoder
class _Message:
    """Per-message decoding state shared by a multi-frame decoder chain: whether compressed
    frames are allowed here (only on a connection that negotiated compression) and the
    message's size as it grows by decompression, checked against the limits before each
    frame is inflated (every limit counts decompressed bytes)."""

    __slots__ = ("allow", "nbytes")

    def __init__(self, nbytes: int, allow: bool) -> None:
        self.nbytes = nbytes
        self.allow = allow

    def inflate(self, data: Buffer, codec: Any, raw_len: Any, ser: Serializer) -> bytearray:
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


class _Decoder:
    """Decoding state at one extension nesting level. The frameless root (single-frame
    messages) and its children are immutable and shared; a multi-frame message builds its own
    chain so that it can track which frames the header referenced."""

    __slots__ = ("_child", "_frames", "_msg", "_ser", "_used", "depth", "hook_kw")

    def __init__(
        self,
        ser: Serializer,
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
        self._child: _Decoder | None = None

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
            c = self._child = _Decoder(self._ser, self._frames, self._used, self.depth + 1, self._msg)
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
            if len(data) != _COMPLEX.size:
                raise DecodeError("malformed complex record")
            return complex(*_COMPLEX.unpack(data))
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
        if kind == _BYTES:
            return buf if type(buf) is bytes else bytes(buf)
        if kind == _BYTEARRAY:
            return buf if type(buf) is bytearray else bytearray(buf)
        if kind == _MEMORYVIEW:
            return buf if type(buf) is memoryview else memoryview(buf)
        raise DecodeError(f"unknown buffer kind {kind!r}")

    def _ndarray(self, data: bytes) -> np.ndarray:
        m = self._meta(data)
        if type(m) is not list or len(m) != 4:
            raise DecodeError("malformed array record")
        wire, shape, fortran, ref = m
        dt = self._ser._dtype_from_wire(wire)
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
        arr = np.ndarray(shape, dt, buffer=buf, order="F" if fortran else "C")
        if not arr.flags.writeable:
            arr = arr.copy(order="K")  # read-only frame (bytes): copy once, users get a writable array
        return arr

    def _npscalar(self, data: bytes) -> np.generic:
        m = self._meta(data)
        if type(m) is not list or len(m) != 2 or type(m[1]) is not bytes:
            raise DecodeError("malformed numpy scalar record")
        dt = self._ser._dtype_from_wire(m[0])
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
        if not self._ser.allow_pickle:
            raise DecodeError("received a pickled object but pickle is disabled (security.allow_pickle)")
        m = self._meta(data)
        if type(m) is not list or len(m) != 2 or type(m[0]) is not bytes or type(m[1]) is not list:
            raise DecodeError("malformed pickle record")
        buffers = [self._take(r) for r in m[1]]
        return pickle.loads(m[0], buffers=buffers)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
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


def _meta_limits(lim: LimitsSection, max_header: int) -> dict[str, Any]:
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
    if kind == _TIMEDELTA and len(m) == 4 and all(type(x) is int for x in m[1:]):
        return _dt.timedelta(days=m[1], seconds=m[2], microseconds=m[3])
    if len(m) != 2 or type(m[1]) is not str or len(m[1]) > 64:
        raise DecodeError("malformed datetime record")
    if kind == _DATETIME:
        return _dt.datetime.fromisoformat(m[1])
    if kind == _DATE:
        return _dt.date.fromisoformat(m[1])
    if kind == _TIME:
        return _dt.time.fromisoformat(m[1])
    raise DecodeError(f"unknown datetime kind {kind!r}")


def _frame_len(f: Any, i: int) -> tuple[Buffer, int]:
    """Check one received frame's type; return it as a flat byte buffer and its size."""
    t = type(f)
    if t is bytes or t is bytearray:
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
            return f, int(f.nbytes)
        except (AttributeError, TypeError, ValueError):
            raise DecodeError(f"frame {i} is a device buffer without a size") from None
    raise DecodeError(f"frame {i} is a {t.__name__}, not a buffer")


# ---------------------------------------------------------------- public API
class Serializer:
    """Turns Python objects into messages (lists of frames) and back.

    Keep one per node and reuse it: it caches its encoder, dtype translations and the
    dataclass registry. Safe to share between threads.
    """

    def __init__(
        self,
        *,
        oob_min_bytes: int = 2048,
        compression: str = "none",
        compress_min_bytes: int = 65536,
        allow_pickle: bool = False,
        limits: LimitsSection | None = None,
        device_hook: DeviceHook | None = None,
        max_compression_ratio: float = LZ4_MAX_EXPANSION,
    ) -> None:
        if compression != "none" and compression not in CODECS:
            raise ConfigError(f"compression must be 'none' or one of {sorted(CODECS)}, not {compression!r}")
        if oob_min_bytes < 0 or compress_min_bytes < 0:
            raise ConfigError("oob_min_bytes and compress_min_bytes must not be negative")
        if not 1.0 <= max_compression_ratio <= LZ4_MAX_EXPANSION:
            raise ConfigError(f"max_compression_ratio must be between 1 and {LZ4_MAX_EXPANSION}")
        #: compressed frames that claim to grow more than this are refused (decompression bombs)
        self.max_compression_ratio = float(max_compression_ratio)
        self.oob_min_bytes = oob_min_bytes
        self.compression = compression
        self.compress_min_bytes = compress_min_bytes
        self.allow_pickle = allow_pickle
        self.limits = limits if limits is not None else LimitsSection()
        # device arrays: offered to this hook when nothing else knows the type (node-provided)
        self.device_hook: DeviceHook | None = device_hook
        self._oob_min = max(1, oob_min_bytes)  # empty buffers always stay inline
        self._max_header = self.limits.max_header_bytes
        self._meta_kw = _meta_limits(self.limits, self._max_header)
        self._codec = compression if compression != "none" else LZ4
        self._compress_default = compression != "none"
        self._by_type: dict[type, tuple[str, tuple[str, ...]]] = {}
        self._by_name: dict[str, tuple[type, tuple[str, ...]]] = {}
        self._dtype_out: dict[np.dtype, Any] = {}
        self._dtype_in: dict[str, np.dtype] = {}
        # msgpack packers are neither thread-safe nor re-entrant: one encoder per thread.
        self._tls = threading.local()
        self._root = _Decoder(self, (), None, 0)

    @classmethod
    def from_config(cls, cfg: Config) -> Serializer:
        """Build from the ``[codec]``, ``[limits]`` and ``[security]`` sections."""
        return cls(
            oob_min_bytes=cfg.codec.oob_min_bytes,
            compression=cfg.codec.compression,
            compress_min_bytes=cfg.codec.compress_min_bytes,
            allow_pickle=cfg.security.allow_pickle,
            limits=cfg.limits,
            max_compression_ratio=cfg.codec.max_compression_ratio,
        )

    @overload
    def register(self, cls: T, name: str | None = None) -> T: ...
    @overload
    def register(self, cls: None = None, name: str | None = None) -> Callable[[T], T]: ...
    def register(self, cls: T | None = None, name: str | None = None) -> Any:
        """Let dataclass ``cls`` travel under ``name`` (default ``module:qualname``).

        Both ends must register the same name. Usable as ``@ser.register`` or
        ``@ser.register(name="geo.Point")``; returns the class.
        """
        if cls is None:
            return lambda c: self.register(c, name)
        if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
            raise SerializationError(f"only dataclasses can be registered, not {cls!r}")
        key = name if name is not None else f"{cls.__module__}:{cls.__qualname__}"
        other = self._by_name.get(key)
        if other is not None and other[0] is not cls:
            raise SerializationError(f"name {key!r} is already registered for {_qualname(other[0])}")
        fields = tuple(f.name for f in dataclasses.fields(cls))
        old = self._by_type.get(cls)
        if old is not None and old[0] != key:
            del self._by_name[old[0]]
        self._by_type[cls] = (key, fields)
        self._by_name[key] = (cls, fields)
        return cls

    def dumps(self, obj: Any, *, compress: bool | None = None) -> list[Buffer]:
        """Encode ``obj`` into frames. Large buffers in the result alias ``obj``'s memory:
        do not mutate them until the transport is done sending.

        ``compress=None`` follows the configured compression; True/False force it.
        Raises :class:`~aionet.errors.SerializationError` for unsupported objects.
        """
        try:
            enc = self._tls.encoder
        except AttributeError:
            enc = self._tls.encoder = _Encoder(self)
        if enc.busy:  # re-entered from user code running inside this encoder (pickle hooks)
            enc = _Encoder(self)
        return enc.encode(obj, self._compress_default if compress is None else compress)

    def dumps_sized(self, obj: Any, *, compress: bool) -> tuple[list[Buffer], int, int]:
        """:meth:`dumps`, plus what compression hid: the bytes the frames gain once
        inflated and the largest inflated frame. Receivers enforce their limits on inflated
        sizes, so a sender checks those, not the wire sizes, before a message is sequenced."""
        try:
            enc = self._tls.encoder
        except AttributeError:
            enc = self._tls.encoder = _Encoder(self)
        if enc.busy:
            enc = _Encoder(self)
        frames = enc.encode(obj, compress)
        return frames, enc.raw_extra, enc.raw_max

    def loads(self, frames: Sequence[Buffer], *, decompress: bool | None = None) -> Any:
        """Decode a message produced by :meth:`dumps` (on any node).

        Arrays and buffers alias the given frames where possible, so hand over ownership.
        ``decompress``: may the message hold compressed frames? None follows this serializer's
        ``compression`` setting; a node passes what the connection negotiated.
        Raises :class:`~aionet.errors.ProtocolError` (normally DecodeError) on any bad input.
        """
        if len(frames) == 1:  # the hot path (small messages): no tuple, no accounting
            try:
                header = frames[0]
                n = len(header)
                if n < _GC_PAUSE_BYTES and n <= self._max_header:
                    return self._root.unpack(header)
            except (ProtocolError, DecodeDeferred):
                raise
            except Exception as exc:
                raise DecodeError(f"cannot decode message: {type(exc).__name__}: {exc}") from exc
        return self.loads_sized(frames, decompress=decompress)[0]

    def loads_sized(self, frames: Sequence[Buffer], *, decompress: bool | None = None) -> tuple[Any, int]:
        """:meth:`loads`, plus the message's size in bytes once decompressed: what mailboxes
        and receive accounting must count (the wire size of a compressed message says
        nothing about the memory it takes)."""
        try:
            if len(frames) == 1:
                header = frames[0]
                n = len(header)
                if n > self._max_header:
                    raise FrameTooLarge(f"header of {n} bytes exceeds limits.max_header_bytes ({self._max_header})")
                if n < _GC_PAUSE_BYTES:
                    return self._root.unpack(header), n
                with _gc_paused():
                    return self._root.unpack(header), n
            allow = self._compress_default if decompress is None else decompress
            if len(frames) > 1 and len(frames[0]) >= _GC_PAUSE_BYTES:
                with _gc_paused():
                    return self._loads_frames(frames, allow)
            return self._loads_frames(frames, allow)
        except (ProtocolError, DecodeDeferred):
            raise
        except Exception as exc:
            raise DecodeError(f"cannot decode message: {type(exc).__name__}: {exc}") from exc

    def _loads_frames(self, frames: Sequence[Buffer], allow_compressed: bool) -> tuple[Any, int]:
        n = len(frames)
        if n == 0:
            raise DecodeError("empty message (no header frame)")
        lim = self.limits
        if n - 1 > lim.max_frames:
            raise TooManyFrames(f"message has {n - 1} buffers, above limits.max_frames ({lim.max_frames})")
        header, hlen = _frame_len(frames[0], 0)
        if hlen > self._max_header:
            raise FrameTooLarge(f"header of {hlen} bytes exceeds limits.max_header_bytes ({self._max_header})")
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
        obj = _Decoder(self, flat, used, 0, msg).unpack(header)
        if 0 in used:
            raise DecodeError(f"frame {used.index(0)} is not referenced by the header (corrupt message?)")
        return obj, msg.nbytes

    # -------------------------------------------------------------- dtype translation
    def _dtype_wire(self, dt: np.dtype) -> Any:
        """Wire form of ``dt``, or None when it cannot travel as raw memory (cached)."""
        try:
            return self._dtype_out[dt]
        except KeyError:
            pass
        except TypeError:  # unhashable exotic dtype
            return None
        wire: Any = None
        try:
            if _dtype_ok(dt):
                if dt.fields is None and dt.subdtype is None:
                    cand: Any = dt.str
                else:
                    cand = _descr_to_wire(np.lib.format.dtype_to_descr(dt))
                if _dtype_from_wire_uncached(cand, self.limits.max_frame_bytes) == dt:
                    wire = cand
        except (DecodeError, TypeError, ValueError):
            wire = None
        if len(self._dtype_out) >= _DTYPE_CACHE_MAX:
            self._dtype_out.clear()
        self._dtype_out[dt] = wire
        return wire

    def _dtype_from_wire(self, wire: Any) -> np.dtype:
        if type(wire) is str:
            dt = self._dtype_in.get(wire)
            if dt is None:
                dt = _dtype_from_wire_uncached(wire, self.limits.max_frame_bytes)
                if len(self._dtype_in) >= _DTYPE_CACHE_MAX:
                    self._dtype_in.clear()
                self._dtype_in[wire] = dt
            return dt
        return _dtype_from_wire_uncached(wire, self.limits.max_frame_bytes)
