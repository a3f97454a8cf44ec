"""Envelopes -> mailboxes, service handlers and reply futures.

The router knows envelopes but not connections or membership: the node hands it decoded
envelopes together with a ``reply`` callable, and it hands back envelopes to send.
"""

from __future__ import annotations

import asyncio
import inspect
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from .errors import AionetError, PeerUnavailable, RemoteError

# Envelope kinds (element 0 of every application message header). Kinds 1..6 are sequenced
# by the link: [kind, seq, ack, *fields] with the fields below.
SEND = 1  # channel, payload
REQ = 2  # req_id, service, payload
REP = 3  # req_id, payload
ERR = 4  # req_id, remote_type, message, traceback
PEERS = 5  # {name: [addresses]}
BYE = 6  # (none)  graceful leave

Handler = Callable[[Any], Any]
Reply = Callable[[int, list[Any]], Awaitable[None]]  # reply(kind, fields)


class Mailbox:
    """A bounded FIFO of (sender, object). A full mailbox makes ``put`` wait, which stops the
    connection reader and so back-pressures the sender through the transport."""

    __slots__ = ("_q",)

    def __init__(self, maxsize: int):
        self._q: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize)

    def put_nowait(self, item: tuple[str, Any]) -> bool:
        try:
            self._q.put_nowait(item)
            return True
        except asyncio.QueueFull:
            return False

    async def put(self, item: tuple[str, Any]) -> None:
        await self._q.put(item)

    async def get(self) -> tuple[str, Any]:
        return await self._q.get()

    async def get_batch(self, limit: int) -> list[tuple[str, Any]]:
        q = self._q
        out = [await q.get()]
        get_nowait = q.get_nowait
        while len(out) < limit and not q.empty():
            out.append(get_nowait())
        return out

    def qsize(self) -> int:
        return self._q.qsize()


class Router:
    def __init__(self, node_name: str, mailbox_size: int, log: Any):
        self.node_name = node_name
        self.mailbox_size = mailbox_size
        self.log = log
        self.services: dict[str, tuple[Handler, bool]] = {}
        self.mailboxes: dict[str, Mailbox] = {}
        # req_id -> (future, peer); requests survive reconnects and fail when the peer's link does
        self.pending: dict[int, tuple[asyncio.Future[Any], str]] = {}
        self._next_id = 0
        self.tasks: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ services
    def add_service(self, name: str, fn: Handler) -> None:
        if not callable(fn):
            raise TypeError(f"service {name!r}: handler must be callable")
        is_async = inspect.iscoroutinefunction(fn)
        self.services[name] = (fn, is_async)

    def mailbox(self, channel: str) -> Mailbox:
        mb = self.mailboxes.get(channel)
        if mb is None:
            mb = self.mailboxes[channel] = Mailbox(self.mailbox_size)
        return mb

    # ------------------------------------------------------------------ requests
    def new_request(self, peer: str) -> tuple[int, asyncio.Future[Any]]:
        self._next_id += 1
        rid = self._next_id
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[rid] = (fut, peer)
        return rid, fut

    def forget(self, rid: int) -> None:
        self.pending.pop(rid, None)

    def fail_peer(self, peer: str, exc: BaseException) -> None:
        """Fail every request waiting on ``peer`` (its link died or it left)."""
        for rid, (fut, p) in list(self.pending.items()):
            if p == peer:
                del self.pending[rid]
                if not fut.done():
                    fut.set_exception(exc)

    def fail_all(self, why: str) -> None:
        for _rid, (fut, p) in list(self.pending.items()):
            if not fut.done():
                fut.set_exception(PeerUnavailable(f"{p}: {why}"))
        self.pending.clear()

    # ------------------------------------------------------------------ dispatch
    def on_reply(self, kind: int, rid: Any, body: list[Any], peer: str) -> None:
        """REP body: [payload]; ERR body: [type, message, traceback]."""
        entry = self.pending.pop(rid, None)
        if entry is None:
            return  # late reply after a timeout: drop
        fut = entry[0]
        if fut.done():
            return
        if kind == REP:
            fut.set_result(body[0])
        else:
            rtype, msg, tb = body
            fut.set_exception(RemoteError(str(rtype), str(msg), str(tb), peer))

    async def call_local(self, service: str, payload: Any) -> Any:
        """Run a service in this process, as a remote request would (used for requests to self)."""
        entry = self.services.get(service)
        if entry is None:
            raise RemoteError("aionet.ServiceNotFound", self._not_found(service), "", self.node_name)
        fn, is_async = entry
        try:
            return (await fn(payload)) if is_async else fn(payload)
        except Exception as exc:
            raise RemoteError(_type_name(exc), str(exc), traceback.format_exc(), self.node_name) from exc

    def _not_found(self, service: str) -> str:
        return f"no service {service!r} on node {self.node_name!r}; services: {', '.join(sorted(self.services))}"

    def on_request(self, rid: Any, service: Any, payload: Any, reply: Reply) -> Awaitable[None] | None:
        """Handle REQ. Sync handlers answer inline (returns the send awaitable); async ones get a task."""
        entry = self.services.get(service)
        if entry is None:
            return reply(ERR, [rid, "aionet.ServiceNotFound", self._not_found(str(service)), ""])
        fn, is_async = entry
        if is_async:
            task = asyncio.get_running_loop().create_task(self._run_async(fn, rid, payload, reply))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            return None
        try:
            result = fn(payload)
        except Exception as exc:
            return reply(ERR, _error_fields(rid, exc))
        return reply(REP, [rid, result])

    async def _run_async(self, fn: Handler, rid: int, payload: Any, reply: Reply) -> None:
        try:
            result = await fn(payload)
        except asyncio.CancelledError:
            await _quiet(reply(ERR, [rid, "asyncio.CancelledError", "handler cancelled (node shutting down)", ""]))
            raise
        except Exception as exc:
            await _quiet(reply(ERR, _error_fields(rid, exc)))
            return
        try:
            await reply(REP, [rid, result])
        except PeerUnavailable:
            self.log.info("reply dropped: the caller is gone", rid=rid)
        except AionetError as exc:
            await _quiet(reply(ERR, _error_fields(rid, exc)))


async def _quiet(aw: Awaitable[None]) -> None:
    try:
        await aw
    except Exception:  # the connection is gone: nothing more to tell the caller
        pass


def _type_name(exc: BaseException) -> str:
    t = type(exc)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _error_fields(rid: Any, exc: BaseException) -> list[Any]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return [rid, _type_name(exc), str(exc), tb]
