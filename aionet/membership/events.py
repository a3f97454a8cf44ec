"""What membership tells its users: change events, an event stream, and counters.

Why a bounded stream that drops the oldest: a subscriber that stops reading must not make the
node's memory grow; it can see how much it missed in ``dropped``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..instrument import Instruments
from .load import LoadReport
from .table import Member, Update


class _StreamOwner(Protocol):
    _streams: set[MemberEventStream]


@dataclass(frozen=True)
class MemberEvent:
    """A membership change: ``kind`` is joined, alive, suspect, dead, left or restarted; or
    stalled (alive, but its event loop is blocked: its liveness responder answered for it)
    and resumed (its loop answers again)."""

    name: str
    kind: str
    state: str
    previous: str | None
    incarnation: int
    node_id: str
    reason: str = ""
    time: float = field(default_factory=time.time)


class MemberEventStream:
    """``async for ev in node.member_events(): ...``; subscribed from creation (nothing missed
    between creating and iterating). Bounded: when full the oldest event is dropped."""

    def __init__(self, owner: _StreamOwner, maxsize: int = 10_000):
        self._owner = owner
        self._q: asyncio.Queue[MemberEvent | None] = asyncio.Queue()
        self._maxsize = maxsize
        self.dropped = 0
        self.closed = False

    def _push(self, ev: MemberEvent | None) -> None:
        if self._q.qsize() >= self._maxsize:
            self._q.get_nowait()
            self.dropped += 1
        self._q.put_nowait(ev)

    def __aiter__(self) -> MemberEventStream:
        return self

    async def __anext__(self) -> MemberEvent:
        if self.closed and self._q.empty():
            raise StopAsyncIteration
        ev = await self._q.get()
        if ev is None:
            raise StopAsyncIteration
        return ev

    async def get(self, timeout: float | None = None) -> MemberEvent:
        """The next event (``asyncio.TimeoutError`` after ``timeout``)."""
        return await asyncio.wait_for(self.__anext__(), timeout)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._owner._streams.discard(self)
            self._q.put_nowait(None)

    async def __aenter__(self) -> MemberEventStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


@dataclass
class MembershipCounters:
    """Counters of one node's membership (``Membership.stats()`` adds the live gauges)."""

    sent_msgs: int = 0
    sent_bytes: int = 0  # counted only when Membership.count_bytes is set (costs a serialization)
    recv_msgs: int = 0
    suspicions: int = 0
    refutations: int = 0
    deaths_declared: int = 0
    probes_sent: int = 0
    max_phi: float = 0.0


class Subscribers:
    """Who hears about membership changes: callbacks (run inline; a returned coroutine is
    spawned through ``spawn``) and streams. A subscriber's bug is logged, never raised into
    membership."""

    def __init__(
        self, spawn: Callable[[Awaitable[Any], str], Any], log: Any, instruments: Instruments | None = None
    ) -> None:
        self._spawn = spawn
        self.log = log
        self._instruments = instruments if instruments is not None else Instruments()
        self._callbacks: list[Callable[[MemberEvent], Any]] = []
        self._streams: set[MemberEventStream] = set()
        self.closed = False  # membership stopped: a stream made now ends at once (nothing comes)

    def add(self, fn: Callable[[MemberEvent], Any]) -> Callable[[], None]:
        """Subscribe ``fn``; returns a function that unsubscribes."""
        self._callbacks.append(fn)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._callbacks.remove(fn)

        return unsubscribe

    def stream(self, maxsize: int) -> MemberEventStream:
        s = MemberEventStream(self, maxsize)
        self._streams.add(s)
        if self.closed:
            s.close()
        return s

    def emit(self, ev: MemberEvent) -> None:
        log = self.log.warning if ev.kind == "dead" else self.log.info
        log("member " + ev.kind, member=ev.name, previous=ev.previous, incarnation=ev.incarnation, reason=ev.reason)
        if (hook := self._instruments.member_changed) is not None:
            hook(ev.name, ev.kind, ev.previous, ev.reason)
        for fn in list(self._callbacks):
            try:
                res = fn(ev)
                if asyncio.iscoroutine(res):
                    self._spawn(res, "aionet-member-callback")
            except Exception as exc:  # a subscriber's bug must not break membership
                self.log.error("member change callback failed", error=repr(exc))
        for s in list(self._streams):
            s._push(ev)

    def close(self) -> None:
        """End every stream, and those made later (membership stopped)."""
        self.closed = True
        for s in list(self._streams):
            s.close()


def self_view(me: Update, addresses: list[str], rep: LoadReport) -> dict[str, Any]:
    """This node's own row in ``members()``."""
    return {
        "state": me.state.value,
        "address": (addresses or [None])[0],
        "addresses": addresses,
        "incarnation": me.incarnation,
        "node_id": me.node_id,
        "load": {**rep.to_dict(), "reported": True},
        "devices": rep.devices(),
        "age": 0.0,
        "since": None,
        "self": True,
    }


def member_view(m: Member, now: float, unknown: LoadReport, stall: float | None = None) -> dict[str, Any]:
    """One other member's row in ``members()`` (``now``: real monotonic time; ``unknown``:
    the all-zero report shown until its first load report arrives; ``stall``: the loop stall
    its liveness responder reported while it is stalled, else None)."""
    ages = [now - t for t in (m.last_seen, m.load_time) if t is not None]
    lr = m.load or unknown
    return {
        "state": m.shown_state.value,
        "address": m.addresses[0] if m.addresses else None,
        "addresses": list(m.addresses),
        "incarnation": m.incarnation,
        "node_id": m.node_id,
        "load": {**lr.to_dict(), "reported": m.load is not None},
        "devices": lr.devices(),
        "age": max(min(ages), 0.0) if ages else None,
        "since": now - m.since,
        "self": False,
        "stalled": stall is not None,  # alive, but its event loop is blocked (liveness.py)
        **({"stall_s": stall} if stall is not None else {}),
    }


__all__ = ["MemberEvent", "MemberEventStream", "MembershipCounters", "Subscribers", "member_view", "self_view"]
