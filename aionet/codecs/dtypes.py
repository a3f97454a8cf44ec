"""numpy dtypes on the wire: their msgpack form, and bounds on descriptions from the network.

Only fixed-size plain-data dtypes travel (object fields hold pointers, StringDType holds arena
pointers: both would be memory-unsafe to rebuild from bytes). A peer controls the structured
dtype descriptions the decoder hands to numpy, whose cost grows with their fields and nesting,
so every description is bounded before numpy sees it.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..config import LimitsSection
from ..errors import DecodeError

__all__ = [
    "MAX_DTYPE_DEPTH",
    "MAX_DTYPE_FIELDS",
    "MAX_DTYPE_NAME",
    "MAX_DTYPE_SUBARRAY_NDIM",
    "DtypeTable",
    "check_descr_bounds",
]

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


class DtypeTable:
    """Translates dtypes to and from their wire form, caching both directions (a node sends
    and receives the same few dtypes over and over). One per serializer."""

    __slots__ = ("_in", "_limits", "_out")

    def __init__(self, limits: LimitsSection) -> None:
        self._limits = limits  # no item may exceed limits.max_frame_bytes
        self._out: dict[np.dtype, Any] = {}
        self._in: dict[str, np.dtype] = {}

    def to_wire(self, dt: np.dtype) -> Any:
        """Wire form of ``dt``, or None when it cannot travel as raw memory (cached)."""
        try:
            return self._out[dt]
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
                if _dtype_from_wire_uncached(cand, self._limits.max_frame_bytes) == dt:
                    wire = cand
        except (DecodeError, TypeError, ValueError):
            wire = None
        if len(self._out) >= _DTYPE_CACHE_MAX:
            self._out.clear()
        self._out[dt] = wire
        return wire

    def from_wire(self, wire: Any) -> np.dtype:
        """The dtype a (hostile) wire form describes; raises DecodeError when it is malformed,
        out of bounds or not receivable."""
        if type(wire) is str:
            dt = self._in.get(wire)
            if dt is None:
                dt = _dtype_from_wire_uncached(wire, self._limits.max_frame_bytes)
                if len(self._in) >= _DTYPE_CACHE_MAX:
                    self._in.clear()
                self._in[wire] = dt
            return dt
        return _dtype_from_wire_uncached(wire, self._limits.max_frame_bytes)
