"""Small allreduce by recursive doubling, driven from the group's channel callback.

Why a path of its own: an allreduce of a few bytes is two to four tiny messages per rank, and on a
machine with fewer cores than ranks its time is set by the CPU each rank burns and by how often it
sleeps and wakes, not by bytes. The generic driver makes a future per message and resumes its
coroutine after every round (a loop iteration and a task step between receiving round ``k`` and
sending round ``k + 1``). Here the message of each round is handed, as it arrives, to the call's
:class:`DoublingRun`, which reduces it and posts the next round's message from inside the
callback: one future and one coroutine wake-up per call, whatever the number of rounds.

The messages are the generic recursive doubling's (same tags, signature included, raw bytes of
the same dtype and shape, same operand order), so ranks on either path agree, bit for bit.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np

from ..errors import CollectiveError
from .algorithms import DoublingPlan
from .wire import Tag, tag

#: arrays below this many bytes travel as their raw bytes in the latency-bound algorithms
#: (short ``bytes`` are packed by the link itself, inline, without the serializer)
RAW_MAX = 1023  # + the dtype byte: 1024 at most, what the link packs inline
# the generic doubling's phases and tags (bucket 0), before the call's signature is OR'd in
FOLD, ROUND, UNFOLD = tag(0, 0, 0), 1, tag(0, 2, 0)
Key = tuple[int, Tag, int]


class Post(Protocol):
    """Send ``payload`` to rank ``dst`` as message ``(seq, t)`` of this rank, without waiting."""

    def __call__(self, dst: int, seq: int, t: Tag, payload: Any) -> Any: ...


class Expect(Protocol):
    """The message ``key`` if it is already here, else MISSING, and ``step`` gets it on arrival."""

    def __call__(self, key: Key, step: Callable[[Any], None]) -> Any: ...


MISSING = object()  # what _expect returns when the message is not here yet (step registered)


class DoublingRun:
    """One small allreduce on one rank: a state machine fed the payload it waits for. ``done``
    gets the flat result (a fresh writable array) or the exception that ended the call."""

    __slots__ = ("_acc", "_dec", "_expect", "_fn", "_k", "_plan", "_post", "_rank", "_seq", "_tags", "done", "waiting")

    def __init__(
        self,
        post: Post,
        expect: Expect,
        rank: int,
        seq: int,
        acc: np.ndarray,
        fn: Any,
        plan: DoublingPlan,
        tags: tuple[Tag, ...],
        done: asyncio.Future[np.ndarray],
    ) -> None:
        self._post, self._expect, self._rank = post, expect, rank  # the group's, narrowed
        self._seq = seq
        self._acc = acc
        self._fn = fn
        self._plan = plan
        self._tags = tags  # fold, unfold, then one per round (round_tags), computed once per group and op
        self._dec = RawDecoder(acc.dtype, acc.shape)
        self._k = -1  # -2: folded away, waiting for the result; -1: folding in; >= 0: round k
        self.done = done
        self.waiting: Key | None = None  # the message the run waits for, if any

    def start(self) -> None:
        """Post what this rank sends first; run on at once if the answer is already here."""
        try:
            got = self._begin()
            if got is not MISSING:
                self._step(got)
        except Exception as exc:
            self._fail(exc)

    def _begin(self) -> Any:
        plan, seq = self._plan, self._seq
        if plan.fold_to is not None:
            self._post(plan.fold_to, seq, self._tags[0], self._acc.tobytes() + self._dec.suffix)
            self._k = -2
            return self._wait((seq, self._tags[1], plan.fold_to))
        self._acc = self._acc.copy()  # reduced in place by the fold, kept as the partner saw it
        if plan.fold_from is not None:
            return self._wait((seq, self._tags[0], plan.fold_from))
        return self._next_round()

    def on_message(self, payload: Any) -> None:
        """The awaited message arrived (from the channel callback, or was already here)."""
        try:
            self._step(payload)
        except Exception as exc:  # never into the transport's callback: the call fails instead
            self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(exc)

    def _step(self, payload: Any) -> None:
        while True:
            self.waiting = None
            got = self._dec(payload)
            k, plan = self._k, self._plan
            if k == -2:
                self._finish(np.array(got))
                return
            if k == -1:
                self._fn(self._acc, got, out=self._acc)
            else:
                # the same operand order on both sides: results agree bit for bit (floats too)
                partner = plan.partners[k]
                self._acc = self._fn(self._acc, got) if self._rank < partner else self._fn(got, self._acc)
            payload = self._next_round()
            if payload is MISSING:
                return

    def _next_round(self) -> Any:
        """Post the next round's message and take its answer if it is already here (MISSING
        otherwise: then it is handed to :meth:`on_message` when it comes), or finish."""
        k = self._k = self._k + 1
        plan, seq = self._plan, self._seq
        if k < len(plan.partners):
            partner = plan.partners[k]
            t = self._tags[k + 2]
            self._post(partner, seq, t, self._acc.tobytes() + self._dec.suffix)
            return self._wait((seq, t, partner))
        if plan.unfold_to is not None:
            self._post(plan.unfold_to, seq, self._tags[1], self._acc.tobytes() + self._dec.suffix)
        self._finish(self._acc)
        return MISSING

    def _wait(self, key: Key) -> Any:
        self.waiting = key
        return self._expect(key, self.on_message)

    def _finish(self, acc: np.ndarray) -> None:
        if not self.done.done():
            self.done.set_result(acc)


_KINDS = "biufc"
_KIND_BASE = MappingProxyType({k: i * 40 for i, k in enumerate(_KINDS)})  # a constant: no call per lookup


def dtype_code(dtype: np.dtype[Any]) -> int:
    """One byte naming a numeric dtype's kind and size (platform-independent: int64 is int64
    whether numpy calls it ``l`` or ``q``)."""
    return _KIND_BASE[dtype.kind] + dtype.itemsize


def code_dtype(code: int) -> str:
    """The dtype a :func:`dtype_code` byte names, for error messages."""
    kind, size = divmod(code, 40)
    return str(np.dtype(f"{_KINDS[kind]}{size}")) if kind < len(_KINDS) and size else f"dtype code {code}"


class RawDecoder:
    """Decode the raw bytes a peer sent for an array of ``dtype`` and ``shape`` (read-only,
    over the received bytes); an array of this dtype and size passes as it came (an older peer's).

    The bytes end with one byte naming the sender's dtype (:attr:`suffix`, appended by the
    sender): without it, ranks whose dtypes disagree but whose byte counts agree (four float32
    against two float64, or the scalars ``1`` and ``1.5``) would reduce garbage without a word."""

    __slots__ = ("code", "count", "dtype", "nbytes", "shape", "suffix")

    def __init__(self, dtype: np.dtype[Any], shape: tuple[int, ...]) -> None:
        self.dtype, self.shape = dtype, shape
        self.count = math.prod(shape)
        self.nbytes = self.count * dtype.itemsize + 1
        self.code = _KIND_BASE[dtype.kind] + dtype.itemsize  # dtype_code, inlined: one per small call
        self.suffix = bytes((self.code,))

    def encode(self, x: np.ndarray) -> bytes:
        """What the sender puts on the wire for ``x`` (of this dtype)."""
        return x.tobytes() + self.suffix

    def __call__(self, b: Any) -> np.ndarray:
        if type(b) is not bytes:
            # an array (an older peer, or a peer that compressed this call): only if it fits
            if type(b) is np.ndarray and b.dtype == self.dtype and b.size == self.count:
                return b.reshape(self.shape)
            theirs = f"{b.size} {b.dtype} elements" if type(b) is np.ndarray else f"a {type(b).__name__}"
            raise CollectiveError(
                f"a peer sent {theirs} for this rank's {self.dtype} array of shape {self.shape}: call the same "
                "collective with the same shape and dtype (and compression) on every rank"
            )
        if len(b) != self.nbytes or b[-1] != self.code:
            theirs = code_dtype(b[-1]) if b else "nothing"
            n = (len(b) - 1) // max(1, np.dtype(theirs).itemsize) if b and "code" not in theirs else "?"
            raise CollectiveError(
                f"a peer sent {n} {theirs} elements for this rank's {self.dtype} array of shape {self.shape} "
                f"({self.count} elements): call the same collective with the same shape and dtype on every rank"
            )
        return np.frombuffer(b, self.dtype, self.count).reshape(self.shape)


def round_tags(plan: DoublingPlan, sig: Tag = 0) -> tuple[Tag, ...]:
    """A call's tags, signature ``sig`` (:func:`.wire.signature`) OR'd in: the fold's, the
    unfold's, then one per round of ``plan``."""
    return (FOLD | sig, UNFOLD | sig, *(tag(0, ROUND, k) | sig for k in range(len(plan.partners))))


__all__ = [
    "MISSING",
    "RAW_MAX",
    "DoublingRun",
    "Expect",
    "Post",
    "RawDecoder",
    "code_dtype",
    "dtype_code",
    "round_tags",
]
