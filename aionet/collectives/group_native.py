"""How a :class:`~aionet.collectives.group.Group` runs an allreduce or a reduce-scatter over its
native ring (:mod:`.native`): the setup at its first such call, the call itself, and what a
failed one does.

A call is *eligible* by what every rank sees alike (``collectives.native_bytes``, the input's
size, dtype and op, no compression): it then carries the ``native`` signature whichever path moves
its bytes, so ranks never disagree on it. The first one sets the ring up inside its own sequence
number (tags of phases 27 and 28):

- every rank tells its left neighbour where its listener is and its secret, and every other rank
  whether it can take part at all;
- where all can, each dials its right neighbour and takes its left one's dial;
- every rank tells every other whether that worked, and the ring is used only if it did
  everywhere. Otherwise this call and every later one go over the ring of the group's links.

Native calls take the group's native lock in sequence order: one call at a time on the streams.
A native call that does not complete breaks the group on every member (its streams are out of
step): the member that failed says so with a breaking ABORT.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from ..errors import CollectiveError
from .aligned import empty_like_aligned
from .compression import WireCodec
from .native import (
    DTYPES,
    OPS,
    RC_ABORTED,
    RC_LEFT_CLOSED,
    RC_LEFT_ERROR,
    RC_MISMATCH,
    NativeFailure,
    NativeSupport,
    RingStreams,
)
from .wire import Tag, tag

#: the key a native call waits under in the group's ``_waiting``: no message carries it; the
#: group's failures (a member lost, a peer's abort, a mismatch found by a probe) end it
NATIVE: Tag = tag(0, 29, 0)
SETUP_TIMEOUT = 10.0  # s for the streams to connect at setup (beyond: the ring over the links)
NATIVE_GRACE = 3.0  # s a rank whose stream closed waits for the group to say why (a member declared dead)
_DTYPE_NAMES = {code: dt.name for dt, code in DTYPES.items()}
_OP_NAMES = {0: "sum", 1: "prod", 2: "min", 3: "max"}


class GroupNative:
    """The native ring calls of a :class:`~aionet.collectives.group.Group` (mixin: uses its state)."""

    members: tuple[str, ...]
    name: str
    rank: int
    size: int
    log: Any
    _native_support: NativeSupport | None
    _native: RingStreams | None
    _native_state: bool | None
    _native_why: str
    _native_lock: asyncio.Lock
    _waiting: dict[tuple[int, Tag, int], asyncio.Future[Any]]
    _post: Callable[[int, int, Tag, Any], asyncio.Task[None] | None]
    _recv: Callable[[int, Tag, int], asyncio.Future[Any]]
    _break: Callable[..., None]
    _tell_abort: Callable[..., None]
    _broken: CollectiveError | None

    def _native_eligible(self, flat: np.ndarray, op: str, algorithm: str, codec: WireCodec | None) -> bool:
        """Whether this call goes the native way (by what every rank sees alike)."""
        sup = self._native_support
        return (
            sup is not None
            and sup.min_bytes > 0
            and self.size > 1
            and codec is None
            and flat.dtype in DTYPES
            and op in OPS
            and flat.size >= self.size
            and (algorithm == "native" or (algorithm == "auto" and flat.nbytes >= sup.min_bytes))
        )

    async def _native_call(
        self, seq: int, flat: np.ndarray, op: str, base: Tag, dest: np.ndarray | None
    ) -> np.ndarray | None:
        """The allreduce over the native ring, or None where the group has none (the caller then
        runs the ring of the links under the same signature)."""
        async with self._native_lock:  # taken in sequence order: the streams carry one call at a time
            if self._native_state is None:
                await self._native_setup(seq, base)
            if self._native_state:
                return await self._native_allreduce(seq, flat, op, dest)
        return None

    async def _native_reduce_scatter(
        self, seq: int, flat: np.ndarray, op: str, base: Tag, bounds: list[tuple[int, int]]
    ) -> np.ndarray | None:
        """This rank's block (``bounds[rank]`` of ``flat``) reduced over the native ring, or None
        where the group has none."""
        async with self._native_lock:
            if self._native_state is None:
                await self._native_setup(seq, base)
            if not self._native_state:
                return None
            assert self._native is not None
            work = empty_like_aligned(flat)  # the blocks in flight; this rank's ends reduced
            native = self._native
            await self._native_guarded(
                seq,
                "reduce_scatter",
                lambda failed: native.reduce_scatter(seq, flat, work, op, self.size, self.rank, bounds, failed),
            )
        a, b = bounds[self.rank]
        return work[a:b].copy()  # the block alone: the work array is n blocks

    async def _native_setup(self, seq: int, base: Tag) -> None:
        n, r = self.size, self.rank
        left, right = (r - 1) % n, (r + 1) % n
        assert self._native_support is not None
        streams, rec = self._native_support.offer(self.log)
        t_rec, t_ok = base | tag(0, 27, 0), base | tag(0, 28, 0)
        try:
            for dst in range(n):  # the left neighbour dials this rank: it alone gets the secret
                if dst != r:
                    self._post(dst, seq, t_rec, rec if dst == left else {"ok": rec["ok"], "why": rec.get("why", "")})
            recs = {src: await self._recv(seq, t_rec, src) for src in range(n) if src != r}
            why = "" if rec["ok"] else f"rank {r} ({self.members[r]!r}): {rec['why']}"
            for src, got in recs.items():
                if not why and not (type(got) is dict and got.get("ok") is True):
                    said = got.get("why") if type(got) is dict else "a malformed record"
                    why = f"rank {src} ({self.members[src]!r}): {said}"
            if not why and streams is not None:
                to = recs[right]
                try:
                    await streams.connect(str(to["host"]), int(to["port"]), to["secret"], r, left, SETUP_TIMEOUT)
                except (OSError, TimeoutError, ValueError, KeyError, TypeError) as exc:
                    why = f"rank {r} ({self.members[r]!r}) could not connect its streams: {exc!r}"
            for dst in range(n):
                if dst != r:
                    self._post(dst, seq, t_ok, 0 if why else 1)
            oks = [await self._recv(seq, t_ok, src) for src in range(n) if src != r]
        except BaseException:
            if streams is not None:
                streams.close()
            raise
        if not why and all(ok == 1 for ok in oks):
            self._native, self._native_state = streams, True
            self.log.info("native ring set up", members=n)
            return
        if streams is not None:
            streams.close()
        self._native_state = False
        self._native_why = why or "another rank could not connect its streams"
        self.log.info("native ring not used: calls go over the ring of the links", reason=self._native_why)

    async def _native_allreduce(self, seq: int, flat: np.ndarray, op: str, dest: np.ndarray | None) -> np.ndarray:
        assert self._native is not None
        native, n, r = self._native, self.size, self.rank
        res = empty_like_aligned(flat) if dest is None else dest
        await self._native_guarded(seq, "allreduce", lambda failed: native.allreduce(seq, flat, res, op, n, r, failed))
        return res

    async def _native_guarded(
        self, seq: int, kind: str, call: Callable[[asyncio.Future[Any]], Awaitable[None]]
    ) -> None:
        """Run one compiled call of ``kind``, given the future the group fails it through; a call
        that does not complete raises the error every rank should see and breaks the group."""
        left = (self.rank - 1) % self.size
        key = (seq, NATIVE, left)
        failed = self._recv(seq, NATIVE, left)
        try:
            await call(failed)
        except NativeFailure as exc:
            raise await self._native_failed(seq, kind, exc, failed) from None
        except BaseException as exc:  # the group's failure, a cancellation (timeout, caller)
            self._native_broken(seq, kind, exc)
            raise
        finally:
            self._waiting.pop(key, None)

    async def _native_failed(
        self, seq: int, kind: str, exc: NativeFailure, failed: asyncio.Future[Any]
    ) -> BaseException:
        """The error a failed native call raises: the group's own reason when it comes (a
        closed stream usually means a member died, and membership says which), else one naming
        the stream that failed."""
        left = (self.rank - 1) % self.size
        if exc.rc == RC_MISMATCH:
            got_seq, count, dt, op = exc.peer
            theirs = "reduce_scatter" if op >= 256 else "allreduce"
            err = CollectiveError(
                f"group {self.name!r}: rank {left} ({self.members[left]!r}) called {theirs} #{got_seq} with "
                f"{count} {_DTYPE_NAMES.get(dt, dt)} elements (op {_OP_NAMES.get(op % 256, op)!r}) where rank "
                f"{self.rank} called {kind} #{seq}: call the same collective with the same shape and dtype on "
                "every rank; the group's native streams are out of step: shrink() on every member to go on",
                member=self.members[left],
            )
        else:
            if exc.rc != RC_ABORTED and not failed.done():
                # a stream that closed or failed usually means a member died: membership names
                # it within the failure-detection time, on every rank alike
                await asyncio.wait([failed], timeout=NATIVE_GRACE)
            if failed.done() and not failed.cancelled() and failed.exception() is not None:
                err = failed.exception()  # type: ignore[assignment]
            else:
                side = "from" if exc.rc in (RC_LEFT_CLOSED, RC_LEFT_ERROR) else "to"
                peer = left if side == "from" else (self.rank + 1) % self.size
                err = CollectiveError(
                    f"group {self.name!r}: the native ring's stream {side} rank {peer} "
                    f"({self.members[peer]!r}) failed: {exc}; shrink() on every member to go on",
                    member=self.members[peer],
                )
        self._native_broken(seq, kind, err)
        return err

    def _native_broken(self, seq: int, kind: str, exc: BaseException) -> None:
        """A native call ended without completing: the streams are out of step everywhere."""
        if self._native is not None:
            self._native.close()
        first = self._broken is None
        reason = exc if isinstance(exc, CollectiveError) else CollectiveError(
            f"group {self.name!r}: {kind} #{seq} on the native ring ended on rank {self.rank} "
            f"({type(exc).__name__}): its streams are out of step; shrink() on every member to go on"
        )  # fmt: skip
        self._break(reason)
        if first:
            self._tell_abort(seq, kind, str(reason), breaks=True)

    def _native_close(self) -> None:
        if self._native is not None:
            self._native.close()
            self._native = None


__all__ = ["NATIVE", "GroupNative"]
