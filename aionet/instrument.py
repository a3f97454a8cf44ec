"""Instrument hooks: how metrics and tracing watch a Node without the layers below importing them.

Subclass :class:`Instrument`, override the hooks you need and add it with
``node.instruments.add(inst)``. The Node owns one :class:`Instruments` multiplexer and hands it
to the router, links, membership, scheduler and device transfers; each of them asks the
multiplexer for a hook (an attribute that is ``None`` while nobody overrides it), so an
uninstrumented node pays one attribute load per event and nothing else.

Hooks run inline on the event loop: keep them cheap (count, append to a bounded buffer). A hook
that raises is a bug in that instrument: the instrument is removed, with one log line naming it
and the hook, and the node carries on (trio's ``abc.Instrument`` does the same).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .log import get_logger

HOOKS = (
    "request_finished",
    "request_handled",
    "member_changed",
    "link_event",
    "task_changed",
    "collective_finished",
    "transfer_finished",
)


class Instrument:
    """Base class: every hook is a no-op. Override only what you need."""

    def request_finished(self, peer: str, service: str, seconds: float, error: str | None) -> None:
        """A request this node made to ``peer`` ended: replied (``error`` None), failed
        (the remote exception type, ``PeerUnavailable``...) or was abandoned (``"cancelled"``,
        e.g. a timeout). ``seconds`` from sending to the end."""

    def request_handled(self, peer: str, service: str, seconds: float, error: str | None) -> None:
        """This node's handler for ``service`` answered a request from ``peer`` (``error``: the
        exception type it raised, or None)."""

    def member_changed(self, name: str, kind: str, previous: str | None, reason: str) -> None:
        """A membership event about ``name``: ``kind`` is joined, alive, suspect, dead, left,
        restarted, stalled or resumed (as ``node.member_events()`` delivers them)."""

    def link_event(self, peer: str, event: str, info: dict[str, Any]) -> None:
        """An event of the link to ``peer``: connected, lost, left, dead or undeliverable
        (``info`` as ``node.on_connection_event`` delivers it)."""

    def task_changed(self, owner: str, task_id: int, attempt: int, name: str, state: str, device: str = "cpu") -> None:
        """An attempt of task ``task_id`` (submitted on node ``owner``) changed state on the node
        that runs it: fetching (its inputs), queued, running, finished. ``device`` is where it
        runs: ``"cpu"``, or the GPUs it was given (``"gpu:0"``, ``"gpu:0+1"``; from running on)."""

    def collective_finished(self, group: str, op: str, nbytes: int, seconds: float, error: str | None) -> None:
        """A collective call on ``group`` ended on this rank: ``op`` (allreduce, broadcast, ...),
        ``nbytes`` of this rank's input, ``error`` the exception type name if it failed."""

    def transfer_finished(self, peer: str, direction: str, nbytes: int, seconds: float, path: str) -> None:
        """A device array crossed the wire (``direction`` "send"/"recv"; ``path`` "staged",
        "device" or "inline")."""


class Instruments:
    """The Node's multiplexer: one attribute per hook, ``None`` when no instrument overrides it,
    else a function calling every instrument that does (and removing one that raises)."""

    request_finished: Callable[[str, str, float, str | None], None] | None
    request_handled: Callable[[str, str, float, str | None], None] | None
    member_changed: Callable[[str, str, str | None, str], None] | None
    link_event: Callable[[str, str, dict[str, Any]], None] | None
    task_changed: Callable[[str, int, int, str, str, str], None] | None
    collective_finished: Callable[[str, str, int, float, str | None], None] | None
    transfer_finished: Callable[[str, str, int, float, str], None] | None

    def __init__(self, instruments: list[Instrument] | tuple[Instrument, ...] = (), log: Any = None) -> None:
        self._items: list[Instrument] = []
        self.log = log or get_logger("aionet.instrument")
        for inst in instruments:
            self._check(inst)
            self._items.append(inst)
        self._rebuild()

    def __iter__(self) -> Any:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def add(self, inst: Instrument) -> None:
        """Start calling ``inst``'s hooks (adding the same instrument twice is a no-op)."""
        self._check(inst)
        if inst not in self._items:
            self._items.append(inst)
            self._rebuild()

    def remove(self, inst: Instrument) -> None:
        """Stop calling ``inst`` (ValueError if it was not added)."""
        self._items.remove(inst)
        self._rebuild()

    @staticmethod
    def _check(inst: Any) -> None:
        if not isinstance(inst, Instrument):
            raise TypeError(f"{inst!r} is not an aionet.instrument.Instrument: subclass it and override hooks")

    def _rebuild(self) -> None:
        for hook in HOOKS:
            base = getattr(Instrument, hook)
            bound = [
                (i, _compat(hook, getattr(i, hook))) for i in self._items if getattr(type(i), hook, base) is not base
            ]
            setattr(self, hook, self._fanout(hook, bound) if bound else None)

    def _fanout(self, hook: str, bound: list[tuple[Instrument, Callable[..., None]]]) -> Callable[..., None]:
        def call(*args: Any) -> None:
            for inst, fn in bound:
                try:
                    fn(*args)
                except Exception as exc:
                    self._failed(inst, hook, exc)

        return call

    def _failed(self, inst: Instrument, hook: str, exc: Exception) -> None:
        if inst in self._items:
            self._items.remove(inst)
            self._rebuild()
            self.log.error(
                "instrument removed: its hook raised",
                instrument=type(inst).__qualname__,
                hook=hook,
                error=repr(exc),
            )


def _compat(hook: str, fn: Callable[..., None]) -> Callable[..., None]:
    """An instrument written before ``task_changed`` gained ``device`` (five arguments) keeps
    working: it is called without the device."""
    if hook != "task_changed":
        return fn
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return fn
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 6:
        return fn
    return lambda owner, task_id, attempt, name, state, device: fn(owner, task_id, attempt, name, state)


__all__ = ["HOOKS", "Instrument", "Instruments"]
