"""Envelopes -> mailboxes, service handlers and reply futures.

The router knows envelopes but not connections or membership: the node hands it decoded
envelopes together with a ``reply`` callable, and it hands back envelopes to send.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
import traceback
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from itertools import islice, repeat
from types import CoroutineType
from typing import Any

from ..codecs.batch import RPC_INLINE_MAX, RPC_INLINE_NAME_MAX, rpc_items
from ..codecs.envelope import ERR, REP
from ..config import LinkSection
from ..errors import AionetError, NodeClosed, PeerUnavailable, ProtocolError, RemoteError
from ..instrument import Instruments
from ..stats import RouterStats
from .ports import INLINE_MARK
from .tasks import EAGER_TASKS, new_task
from .waiters import wake_first

# envelope kinds and their layouts: codecs/envelope.py

Handler = Callable[[Any], Any]
# how a service's handler runs (Router.add_service decides): inline on the reader, as a task
# per request, or inline until it returns a coroutine (only that part gets a task)
SYNC, ASYNC, INLINE = 0, 1, 2
PRUNE_MAILBOXES_FROM = 1024  # idle mailboxes are forgotten once a node has this many
Reply = Callable[[int, list[Any]], Awaitable[None] | None]  # reply(kind, fields); None when done


class Mailbox:
    """A bounded FIFO of (sender, object). A full mailbox makes ``put`` wait, which stops the
    connection reader and so back-pressures the sender through the link.

    Full means ``maxsize`` messages, or ``maxbytes`` of received message bytes (what arrived
    on the wire: a few huge messages must not hold unbounded memory just because they are
    few). A single message larger than ``maxbytes`` is let into an empty mailbox."""

    __slots__ = (
        "_bytes",
        "_closed",
        "_getters",
        "_items",
        "_maxbytes",
        "_maxsize",
        "_on_take",
        "_putters",
        "_sizes",
        "gen",
    )

    def __init__(
        self, maxsize: int, maxbytes: int = 1 << 62, on_take: Callable[[str, int, int], None] | None = None
    ) -> None:
        self._on_take = on_take  # told (sender, nbytes, count) of the messages taken out
        self.gen = 0  # the router's prune generation when this mailbox was last handed out
        self._items: deque[tuple[str, Any]] = deque()
        self._sizes: deque[int] = deque()
        self._bytes = 0
        self._maxsize = maxsize
        self._maxbytes = maxbytes
        self._getters: deque[asyncio.Future[None]] = deque()
        self._putters: deque[asyncio.Future[None]] = deque()
        self._closed: str | None = None  # why nothing more can arrive (close)

    def close(self, why: str) -> None:
        """Nothing more will arrive (the node stopped): wake everyone waiting here, so that a
        ``recv`` or a blocked put raises :class:`NodeClosed` rather than waiting for good.
        What is already waiting is still handed out first."""
        self._closed = why
        for waiters in (self._getters, self._putters):
            while waiters:
                f = waiters.popleft()
                if not f.done():
                    f.set_result(None)

    def check_open(self) -> None:
        """Raise :class:`NodeClosed` if :meth:`close` was called (before waiting for room)."""
        if self._closed is not None:
            raise NodeClosed(self._closed)

    def put_nowait(self, item: tuple[str, Any], nbytes: int = 0) -> bool:
        items = self._items
        if len(items) >= self._maxsize or (self._bytes + nbytes > self._maxbytes and items):
            return False
        items.append(item)
        self._sizes.append(nbytes)
        self._bytes += nbytes
        if self._getters:
            wake_first(self._getters)
        return True

    def put_many(self, sender: str, env: list[Any], start: int, each: int) -> bool:
        """Put ``env[start:]`` from ``sender``, ``each`` bytes apiece: all if they fit (or the
        mailbox is empty), else none (False)."""
        items = self._items
        n = len(env) - start
        if items and (len(items) + n > self._maxsize or self._bytes + each * n > self._maxbytes):
            return False
        items.extend(zip(repeat(sender), islice(env, start, None), strict=False))
        self._sizes.extend(repeat(each, n))
        self._bytes += each * n
        if self._getters:
            wake_first(self._getters)
        return True

    async def put(self, item: tuple[str, Any], nbytes: int = 0) -> None:
        while not self.put_nowait(item, nbytes):
            if self._closed is not None:
                raise NodeClosed(self._closed)
            fut = self.wait_room()
            try:
                await fut
            except asyncio.CancelledError:
                self.give_up_room(fut)
                raise

    def wait_room(self) -> asyncio.Future[None]:
        """A future done when a message is taken (there may be room then). Registered now, so
        a message taken before the caller awaits it still wakes it. A caller that is woken
        and then does not put must call :meth:`wake_putter`, or the next waiter could sleep
        while there is room."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._putters.append(fut)
        return fut

    def wake_putter(self) -> None:
        """Wake the longest-waiting putter (see :meth:`wait_room`)."""
        wake_first(self._putters)

    def give_up_room(self, fut: asyncio.Future[None]) -> None:
        """The caller of :meth:`wait_room` gave up (cancelled): forget its future, so that
        waiters that keep giving up (timeouts) do not pile up here, or, if it had already
        been woken, pass the wake-up on."""
        if fut.done() and not fut.cancelled():
            wake_first(self._putters)
        else:
            with contextlib.suppress(ValueError):
                self._putters.remove(fut)

    async def _wait(self) -> None:
        while not self._items:
            if self._closed is not None:
                raise NodeClosed(self._closed)
            fut = asyncio.get_running_loop().create_future()
            self._getters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut.cancelled():
                    # gave up before a message came (a recv timeout): forget the future, or a
                    # polling loop on an idle channel would grow this deque without bound
                    with contextlib.suppress(ValueError):
                        self._getters.remove(fut)
                elif self._items and self._getters:  # woken, then cancelled: pass the wake-up on
                    wake_first(self._getters)
                raise

    async def get(self) -> tuple[str, Any]:
        if not self._items:
            await self._wait()
        item = self._items.popleft()
        n = self._sizes.popleft()
        self._bytes -= n
        if self._on_take is not None:
            self._on_take(item[0], n, 1)
        if self._putters:
            wake_first(self._putters)
        return item

    async def get_batch(self, limit: int) -> list[tuple[str, Any]]:
        items = self._items
        if not items:
            await self._wait()
        sizes = self._sizes
        if len(items) <= limit:
            out = list(items)
            taken: Any = sizes
            self._bytes = 0
        else:
            out = [items.popleft() for _ in range(limit)]
            taken = [sizes.popleft() for _ in range(limit)]
            self._bytes -= sum(taken)
        on_take = self._on_take
        if on_take is not None:
            senders = {item[0] for item in out}
            if len(senders) == 1:  # the usual case: one bulk account per batch
                on_take(out[0][0], sum(taken), len(out))
            else:
                for item, n in zip(out, taken, strict=True):
                    on_take(item[0], n, 1)
        if taken is sizes:
            items.clear()
            sizes.clear()
        if self._putters:
            wake_first(self._putters)
        return out

    def take_all(self) -> list[tuple[str, Any]]:
        """Everything waiting, now (accounted as taken, like :meth:`get_batch`)."""
        out = list(self._items)
        if out:
            on_take = self._on_take
            if on_take is not None:
                for item, n in zip(out, self._sizes, strict=True):
                    on_take(item[0], n, 1)
            self._items.clear()
            self._sizes.clear()
            self._bytes = 0
            while self._putters:
                wake_first(self._putters)
        return out

    def qsize(self) -> int:
        return len(self._items)

    def idle(self) -> bool:
        """Empty, and nobody waits on it: forgetting it loses nothing."""
        return not self._items and all(f.done() for f in self._getters) and all(f.done() for f in self._putters)

    @property
    def nbytes(self) -> int:
        """Received bytes of the messages waiting here."""
        return self._bytes


class _Deadlines:
    """Request timeouts without a timer per request (arming and cancelling one cost about as
    much as a loop iteration, on every request): one deque of ``(deadline, rid, service)`` per
    distinct timeout, in deadline order since the clock only rises, and one timer for the
    earliest deadline of a request still pending. Answered requests are dropped from the
    front when that timer fires, and by a compaction when the deques grow past twice what
    is pending (so memory follows the requests in flight, not the request rate)."""

    __slots__ = ("_at", "_compact_at", "_expired", "_handle", "_n", "_pending", "_queues")

    def __init__(
        self, pending: dict[int, tuple[asyncio.Future[Any], str]], expired: Callable[[str, int], None]
    ) -> None:
        self._pending = pending
        self._expired = expired  # (peer, rid) of a request that just timed out
        self._queues: dict[float, deque[tuple[float, int, str]]] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._at = float("inf")  # when the armed timer fires
        self._n = 0  # entries over all queues
        self._compact_at = 1024

    def add(self, loop: asyncio.AbstractEventLoop, rid: int, service: str, timeout: float) -> None:
        deadline = loop.time() + timeout
        q = self._queues.get(timeout)
        if q is None:
            q = self._queues[timeout] = deque()
        q.append((deadline, rid, service))
        self._n += 1
        if deadline < self._at:
            self._arm(loop, deadline)
        elif self._n > self._compact_at:
            self._compact()

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._at = at
        self._handle = loop.call_at(at, self._fire, loop)

    def _compact(self) -> None:
        pending = self._pending
        n = 0
        for timeout, q in list(self._queues.items()):
            live = deque(e for e in q if e[1] in pending)
            if live:
                self._queues[timeout] = live
                n += len(live)
            else:
                del self._queues[timeout]
        self._n = n
        self._compact_at = max(1024, 2 * n)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._handle = None
        self._at = float("inf")
        now = loop.time()
        pending = self._pending
        nxt = float("inf")
        for timeout, q in list(self._queues.items()):
            while q:
                deadline, rid, service = q[0]
                entry = pending.get(rid)
                if entry is None or entry[0].done():
                    q.popleft()  # answered or forgotten
                    self._n -= 1
                    continue
                if deadline > now:
                    nxt = min(nxt, deadline)
                    break
                q.popleft()
                self._n -= 1
                del pending[rid]
                fut, peer = entry
                fut.set_exception(TimeoutError(f"request {service!r} to {peer!r} timed out after {timeout} s"))
                fut.exception()  # retrieved: a caller that gave up meanwhile (its own timeout) leaves no warning
                self._expired(peer, rid)
            if not q:
                del self._queues[timeout]
        if nxt != float("inf"):
            self._arm(loop, nxt)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._at = float("inf")
        self._queues.clear()
        self._n = 0


# what the caller of a handler cancelled (or never started) because this node stops is told
SHUTDOWN = "handler cancelled (node shutting down)"
HANDLER_TASK = "aionet-handler"  # the name of each task that runs an async request handler


class Router:
    def __init__(self, node_name: str, cfg: LinkSection, log: Any, instruments: Instruments | None = None):
        """``cfg``: the ``[link]`` section (mailbox and concurrency bounds)."""
        self.node_name = node_name
        mailbox_size, mailbox_bytes = cfg.mailbox_size, cfg.mailbox_bytes
        max_concurrent_requests = cfg.max_concurrent_requests
        peer_mailbox_bytes, peer_mailbox_size = cfg.peer_mailbox_bytes, cfg.peer_mailbox_size
        self.instruments = instruments if instruments is not None else Instruments()
        # rid -> (peer, service, start, future) of requests timed for instruments
        self._timing: dict[int, tuple[str, str, float, asyncio.Future[Any]]] = {}
        self.mailbox_size = mailbox_size
        self.mailbox_bytes = mailbox_bytes
        self.log = log
        self.services: dict[str, tuple[Handler, int]] = {}
        self.mailboxes: dict[str, Mailbox] = {}
        # channel -> fn(sender, obj) that takes its messages as they arrive (see on_channel)
        self.consumers: dict[str, Callable[[str, Any], None]] = {}
        # Peers name channels, so per-channel bounds alone would let one peer hold
        # channels x mailbox_bytes: each peer's waiting messages, over all channels, are
        # bounded too (then that peer is not read from until the application takes some),
        # and idle mailboxes are forgotten once there are many.
        self.peer_mailbox_bytes = peer_mailbox_bytes
        self.peer_mailbox_size = peer_mailbox_size
        self._queued: dict[str, list[int]] = {}  # peer -> [bytes, messages] waiting in mailboxes
        self._budget_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._gen = 0
        self._prune_at = PRUNE_MAILBOXES_FROM
        self._closed: str | None = None  # set when the node stops (close_mailboxes)
        self._draining = False  # the node is stopping: handlers are being cancelled (drain)
        # req_id -> (future, peer); requests survive reconnects and fail when the peer's link does
        self.pending: dict[int, tuple[asyncio.Future[Any], str]] = {}
        self._deadlines = _Deadlines(self.pending, self._abandon)
        # fn(peer, rid): a request this node sent was given up before its answer (the caller's
        # task cancelled, its timeout passed), so the peer may cancel the handler (the node's)
        self.abandoned: Callable[[str, int], None] | None = None
        # the node's event loop (bind_loop): asyncio.get_running_loop() costs a getpid()
        # system call per call on CPython 3.11, once per request
        self.loop: asyncio.AbstractEventLoop | None = None
        self._next_id = 0
        self.tasks: set[asyncio.Task[Any]] = set()
        # (peer, req_id) -> the task of an async handler still computing its answer, so that a
        # caller's CANCEL can reach it (on_cancel)
        self.handling: dict[tuple[str, Any], asyncio.Task[Any]] = {}
        self.uncancellable: set[str] = set()  # services whose handlers run to the end (add_service)
        self._given_up: set[tuple[str, Any]] = set()  # handlers on_cancel cancelled, until they end
        # async handlers running per requesting peer, bounded by max_concurrent_requests; the
        # requests over it wait here, up to as many again, each started as a handler ends (a
        # caller keeps to both: it sends at most twice the bound); a peer over both is not read
        # from (back-pressure) until one of them finishes
        self.max_concurrent_requests = max_concurrent_requests
        self.running: dict[str, int] = {}
        # peer -> {rid: (entry, service, payload, reply)}, in arrival order
        self.waiting: dict[str, dict[Any, tuple[tuple[Handler, int], Any, Any, Reply]]] = {}
        self._slot_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._refilling: set[str] = set()  # peers whose waiting requests _handler_done is starting

    def bind_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """The loop the node runs on (set when it starts, cleared when it stops)."""
        self.loop = loop

    # ------------------------------------------------------------------ services
    def add_service(self, name: str, fn: Handler, *, cancellable: bool = True) -> None:
        """A coroutine function runs as a task per request; a plain function answers inline on
        the connection's reader; one marked with :func:`~aionet.core.ports.inline_handler` answers inline unless it
        returns a coroutine, which then finishes as a task (and counts against
        ``max_concurrent_requests`` like an async handler). ``cancellable``: the task is
        cancelled when its caller gives up (a CANCEL, :meth:`on_cancel`); False for handlers
        that must run to the end once started (a write that replicates, say)."""
        if not callable(fn):
            raise TypeError(f"service {name!r}: handler must be callable")
        # an object whose __call__ is an async def is one too (run as a plain def, its
        # coroutine was never awaited and the caller read "cannot serialize coroutine")
        if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__):
            mode = ASYNC
        elif getattr(fn, INLINE_MARK, False):
            mode = INLINE
        else:
            mode = SYNC
        self.services[name] = (fn, mode)
        if cancellable:
            self.uncancellable.discard(name)
        else:
            self.uncancellable.add(name)

    def inline_services(self) -> list[str]:
        """Names of the services answered inline on the reader (plain ``def`` handlers), which
        never take a handler slot: advertised in the handshake so callers need not count
        requests to them against this node's window (at most ``RPC_INLINE_MAX``: aionet's own
        first, then by name)."""
        names = [n for n, (_fn, mode) in self.services.items() if mode == SYNC and len(n) <= RPC_INLINE_NAME_MAX]
        names.sort(key=lambda n: (not n.startswith("aionet."), n))
        return names[:RPC_INLINE_MAX]

    def mailbox(self, channel: str) -> Mailbox:
        mb = self.mailboxes.get(channel)
        if mb is None:
            if len(self.mailboxes) >= self._prune_at:
                self._prune()
            mb = self.mailboxes[channel] = Mailbox(self.mailbox_size, self.mailbox_bytes, self._taken)
            if self._closed is not None:
                mb.close(self._closed)
        mb.gen = self._gen
        return mb

    def close_mailboxes(self) -> None:
        """The node stopped: nothing more can arrive, so release every ``recv`` waiting (and
        every later one, once its mailbox is empty) with :class:`NodeClosed`, and every
        connection reader paused on a full mailbox, rather than let them wait for good."""
        self._closed = (
            f"node {self.node_name!r} is stopped: no more messages can arrive "
            "(what was delivered before the stop can still be taken; start a new Node to receive again)"
        )
        for mb in self.mailboxes.values():
            mb.close(self._closed)
        # a reader paused on a peer's share of the mailboxes resumes (and finds its link gone)
        # rather than stay a task of the transport's that outlives the node
        for waiters in self._budget_waiters.values():
            for f in waiters:
                if not f.done():
                    f.set_result(None)
        self._budget_waiters.clear()

    def _prune(self) -> None:
        """Forget idle mailboxes not handed out since the last prune (so one a receiver has
        just looked up survives); the threshold doubles with what is left, so the cost is
        amortised over the mailboxes created."""
        gen = self._gen
        for ch in [ch for ch, mb in self.mailboxes.items() if mb.gen < gen and mb.idle()]:
            del self.mailboxes[ch]
        self._gen = gen + 1
        self._prune_at = max(PRUNE_MAILBOXES_FROM, 2 * len(self.mailboxes))

    def on_channel(self, channel: str, fn: Callable[[str, Any], None] | None) -> None:
        """Hand each message for ``channel`` to ``fn(sender, obj)`` as it is delivered, instead
        of queueing it in a mailbox (``None``: back to the mailbox). For services that keep
        their own bounded state (collectives): it saves a task wake-up per message, and ``fn``
        must neither block nor keep unbounded memory, and should drop (and log) what it cannot
        use rather than raise (one that raises loses that message only: see :meth:`_consumer_failed`).
        Messages already waiting go to ``fn`` now. The mailbox stays while a ``recv`` waits on
        it (that recv gets the messages sent after ``fn`` is removed again)."""
        if fn is None:
            self.consumers.pop(channel, None)
            return
        self.consumers[channel] = fn
        mb = self.mailboxes.get(channel)
        if mb is not None:
            waiting = mb.take_all()
            if mb.idle():  # nobody waits on it: forgotten (made again if needed)
                del self.mailboxes[channel]
            for sender, obj in waiting:
                try:
                    fn(sender, obj)
                except Exception as exc:
                    self._consumer_failed(channel, sender, exc)

    def _consumer_failed(self, channel: str, sender: str, exc: Exception) -> None:
        """An ``on_channel`` consumer raised: its message is dropped with an error line. The
        message was delivered (acknowledged; one batched envelope carries many), so letting
        the error reach the connection's reader would close the connection, blame the peer,
        and lose the rest of the batch without a word; replaying cannot help either."""
        self.log.error(
            "on_channel consumer raised; its message is dropped",
            channel=channel,
            peer=sender,
            error=f"{_type_name(exc)}: {_message(exc)}",
        )

    def deliver(self, peer: str, channel: str, obj: Any, nbytes: int) -> asyncio.Future[None] | Mailbox | None:
        """Put a message from ``peer`` into mailbox ``channel``. None when done; else what to
        wait for before trying again: a Mailbox that is full (``wait_room()``), or a future
        done once the application has taken some of this peer's messages (its share of all
        mailboxes is used up)."""
        if self.consumers:
            fn = self.consumers.get(channel)
            if fn is not None:
                try:
                    fn(peer, obj)
                except Exception as exc:
                    self._consumer_failed(channel, peer, exc)
                return None
        q = self._queued.get(peer)
        if q is not None and (q[0] + nbytes > self.peer_mailbox_bytes or q[1] >= self.peer_mailbox_size):
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._budget_waiters.setdefault(peer, []).append(fut)
            return fut
        mb = self.mailboxes.get(channel) or self.mailbox(channel)
        if not mb.put_nowait((peer, obj), nbytes):
            return mb
        if q is None:
            self._queued[peer] = [nbytes, 1]
        else:
            q[0] += nbytes
            q[1] += 1
        return None

    def deliver_many(self, peer: str, env: list[Any], nbytes: int) -> asyncio.Future[None] | Mailbox | None:
        """:meth:`deliver` for a batched SEND envelope ``[SEND, seq, ack, channel, *payloads]``:
        all of its payloads or none (a batch has one sequence number, so a part could not be
        acknowledged). It goes in when the mailbox and the peer's share have room for all of
        it, or into an empty mailbox whatever its size (as one large message would)."""
        n = len(env) - 4
        if n <= 0:
            raise ProtocolError("SEND envelope without a payload")
        if self.consumers:
            fn = self.consumers.get(env[3])
            if fn is not None:
                for obj in islice(env, 4, None):
                    try:
                        fn(peer, obj)
                    except Exception as exc:
                        self._consumer_failed(env[3], peer, exc)
                return None
        q = self._queued.get(peer)
        if q is not None and (q[0] + nbytes > self.peer_mailbox_bytes or q[1] + n > self.peer_mailbox_size):
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._budget_waiters.setdefault(peer, []).append(fut)
            return fut
        channel = env[3]
        mb = self.mailboxes.get(channel) or self.mailbox(channel)
        each = nbytes // n
        if not mb.put_many(peer, env, 4, each):
            return mb
        if q is None:
            self._queued[peer] = [each * n, n]
        else:
            q[0] += each * n
            q[1] += n
        return None

    def _taken(self, peer: str, nbytes: int, count: int) -> None:
        q = self._queued.get(peer)
        if q is None:
            return  # this node's own message to itself
        q[0] -= nbytes
        q[1] -= count
        if q[1] <= 0:
            del self._queued[peer]
        waiters = self._budget_waiters.pop(peer, None)
        if waiters:
            for f in waiters:
                if not f.done():
                    f.set_result(None)

    # ------------------------------------------------------------------ requests
    def new_request(
        self, peer: str, service: str = "", timeout: float | None = None
    ) -> tuple[int, asyncio.Future[Any]]:
        """A request id and the future its reply resolves. With ``timeout`` the future fails
        with TimeoutError that many seconds from now unless answered (or forgotten) first."""
        self._next_id = rid = self._next_id + 1
        loop = self.loop or asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self.pending[rid] = (fut, peer)
        if self.instruments.request_finished is not None:
            self._timing[rid] = (peer, service, time.perf_counter(), fut)
        if timeout is not None:
            self._deadlines.add(loop, rid, service, timeout)
        return rid, fut

    def expire_after(self, rid: int, service: str, timeout: float) -> None:
        """Fail request ``rid``'s future with TimeoutError ``timeout`` seconds from now unless
        it is answered (or forgotten) first: :meth:`new_request`'s ``timeout``, set later
        (once the request is written)."""
        self._deadlines.add(self.loop or asyncio.get_running_loop(), rid, service, timeout)

    def forget(self, rid: int, sent: bool = False) -> None:
        """The caller is done with request ``rid`` (answered, failed or abandoned). ``sent``:
        the request went out, so if it is still unanswered its handler is told (``abandoned``)."""
        entry = self.pending.pop(rid, None)
        if entry is not None and sent:
            self._abandon(entry[1], rid)
        if self._timing:
            self._finished(rid)

    def _abandon(self, peer: str, rid: int) -> None:
        if (fn := self.abandoned) is not None:
            fn(peer, rid)

    def on_cancel(self, rid: Any, peer: str) -> None:
        """``peer`` gave up on its request ``rid``: cancel the handler if it still computes the
        answer (a sync handler, or one that finished, has nothing left to cancel)."""
        key = (peer, rid)
        waiting = self.waiting.get(peer)
        if waiting is not None and waiting.pop(rid, None) is not None:  # never started: forgotten
            if not waiting:
                del self.waiting[peer]
            self._wake_slot_waiters(peer)
            return
        task = self.handling.pop(key, None)
        if task is not None:
            self._given_up.add(key)
            task.cancel()
            # a task cancelled before its first step (its REQ and the CANCEL came in one read)
            # never enters _run_async, whose finally frees the peer's slot: this callback does
            task.add_done_callback(partial(self._cancelled, peer, key))

    def _cancelled(self, peer: str, key: tuple[str, Any], task: asyncio.Task[Any]) -> None:
        self._given_up.discard(key)
        if task in self.tasks:  # still listed: _run_async's finally did not run
            self.tasks.discard(task)
            self._handler_done(peer)

    def _finished(self, rid: int) -> None:
        timed = self._timing.pop(rid, None)
        hook = self.instruments.request_finished
        if timed is None or hook is None:
            return
        peer, service, t0, fut = timed
        if not fut.done() or fut.cancelled():
            error: str | None = "cancelled"
        else:
            exc = fut.exception()
            if isinstance(exc, TimeoutError):  # its deadline (_Deadlines): a timeout counts as cancelled
                error = "cancelled"
            else:
                error = None if exc is None else getattr(exc, "remote_type", None) or type(exc).__name__
        hook(peer, service, time.perf_counter() - t0, error)

    def stats(self) -> RouterStats:
        mbs = self.mailboxes
        return RouterStats(
            services=tuple(sorted(self.services)),
            mailboxes={ch: mb.qsize() for ch, mb in mbs.items()},
            mailbox_bytes={ch: mb.nbytes for ch, mb in mbs.items()},
            pending_requests=len(self.pending),
            running_handlers=sum(self.running.values()),
        )

    def fail_peer(self, peer: str, exc: BaseException) -> None:
        """Fail every request waiting on ``peer`` (its link died or it left).

        Each future is marked retrieved: its caller may be blocked before the reply (on
        window space, the transport, staging) and then raises the link's own error, never
        looking at the future, which asyncio would report as "Future exception was never
        retrieved" once collected. A caller that awaits it still gets the exception. Its
        requests still waiting for a handler slot here are dropped (nobody waits for them)."""
        self.waiting.pop(peer, None)
        for rid, (fut, p) in list(self.pending.items()):
            if p == peer:
                del self.pending[rid]
                if not fut.done():
                    fut.set_exception(exc)
                    fut.exception()

    def fail_all(self, why: str) -> None:
        """Fail every pending request: the node stops (retrieved as in :meth:`fail_peer`)."""
        for _rid, (fut, p) in list(self.pending.items()):
            if not fut.done():
                fut.set_exception(PeerUnavailable(f"{p}: {why}"))
                fut.exception()
        self.pending.clear()
        self._deadlines.close()

    # ------------------------------------------------------------------ dispatch
    def on_reply(self, kind: int, rid: Any, body: list[Any], peer: str) -> None:
        """REP body: [payload]; ERR body: [type, message, traceback]."""
        entry = self.pending.get(rid)
        if entry is None:
            return  # late reply after a timeout: drop
        if entry[1] != peer:
            raise ProtocolError(f"{peer} sent a reply to request {rid!r}, which went to {entry[1]}")
        del self.pending[rid]
        fut = entry[0]
        if fut.done():
            return
        if kind == REP:
            fut.set_result(body[0])
        else:
            rtype, msg, tb = body
            fut.set_exception(RemoteError(str(rtype), str(msg), str(tb), peer))

    def on_replies(self, env: list[Any], peer: str) -> None:
        """A REP envelope with many replies: ``[REP, seq, ack, rid, payload, rid, payload, ...]``."""
        rpc_items(env)
        pending = self.pending
        for i in range(3, len(env), 2):
            rid = env[i]
            entry = pending.get(rid)
            if entry is None:
                continue  # late reply after a timeout: drop
            if entry[1] != peer:
                raise ProtocolError(f"{peer} sent a reply to request {rid!r}, which went to {entry[1]}")
            del pending[rid]
            fut = entry[0]
            if not fut.done():
                fut.set_result(env[i + 1])

    async def call_local(self, service: str, payload: Any) -> Any:
        """Run a service in this process, as a remote request would (used for requests to self)."""
        entry = self.services.get(service)
        if entry is None:
            raise RemoteError("aionet.ServiceNotFound", self._not_found(service), "", self.node_name)
        fn, mode = entry
        try:
            if mode == ASYNC:
                return await fn(payload)
            out = fn(payload)
            if type(out) is CoroutineType:
                if mode != INLINE:
                    out.close()
                    raise RemoteError("aionet.SerializationError", returned_coroutine(service), "", self.node_name)
                out = await out
            return out
        except RemoteError:
            raise
        except Exception as exc:
            raise RemoteError(_type_name(exc), _message(exc), traceback.format_exc(), self.node_name) from exc

    def _not_found(self, service: str) -> str:
        """What a caller of an unregistered service reads: the fix, and the application's own
        services (the twenty-odd built-in ``aionet.*`` ones only counted, or they would bury them)."""
        own = sorted(n for n in self.services if not n.startswith("aionet."))
        builtin = len(self.services) - len(own)
        return (
            f"no service {service!r} on node {self.node_name!r}: register it there with "
            f"@node.service({service!r}) (or check the name); its services: {', '.join(own) or 'none'}"
            f" (and {builtin} built-in aionet.* ones)"
        )

    def on_request(self, rid: Any, service: Any, payload: Any, reply: Reply, peer: str = "") -> Awaitable[None] | None:
        """Handle REQ from ``peer``. Sync handlers answer inline; async ones get a task;
        inline ones (:func:`~aionet.core.ports.inline_handler`) answer inline or get a task for what they return.

        Returns None once the request is handled or started. Returns an awaitable, and does
        not start it, when ``peer`` already has ``max_concurrent_requests`` async (or inline)
        handlers running: the caller stops reading from that peer, awaits it, then hands the
        same request in again. (``reply`` must not block: it returns None or an awaitable
        that is finished on a task of its own.)"""
        entry = self.services.get(service)
        if entry is None:
            self._spawn_reply(reply(ERR, [rid, "aionet.ServiceNotFound", self._not_found(str(service)), ""]))
            return None
        mode = entry[1]
        if mode != SYNC:
            running = self.running.get(peer, 0)
            if running >= self.max_concurrent_requests:
                return self._wait(peer, rid, entry, service, payload, reply)
            if mode == ASYNC and self.instruments.request_handled is None and not self._draining:
                # the usual async handler, untimed: what _handle and _start do for it, without their checks
                self.running[peer] = running + 1
                loop = self.loop or asyncio.get_running_loop()
                self._start_task(loop, entry[0], rid, payload, reply, peer, service not in self.uncancellable)
                return None
        self._handle(entry, rid, service, payload, reply, peer)
        return None

    def on_requests(
        self, env: list[Any], reply: Reply, peer: str = "", start: int = 3
    ) -> tuple[Awaitable[None], int] | None:
        """A REQ envelope with many requests, ``[REQ, seq, ack, rid, service, payload, ...]``
        (codecs/batch.py): each is handled as :meth:`on_request` would, in order, from field
        ``start`` on. Returns None once all are handled or started; else, when ``peer``'s
        handlers reach ``max_concurrent_requests``, what to await and the field index of the
        first request not started (the caller awaits it, stops reading meanwhile, then hands
        the rest in again), as for one request at a time."""
        rpc_items(env)
        services = self.services
        bound = self.max_concurrent_requests
        for i in range(start, len(env), 3):
            rid, service = env[i], env[i + 1]
            entry = services.get(service)
            if entry is None:
                self._spawn_reply(reply(ERR, [rid, "aionet.ServiceNotFound", self._not_found(str(service)), ""]))
                continue
            if entry[1] != SYNC and self.running.get(peer, 0) >= bound:
                slot = self._wait(peer, rid, entry, service, env[i + 2], reply)
                if slot is not None:
                    return slot, i
                continue
            self._handle(entry, rid, service, env[i + 2], reply, peer)
        return None

    def _handle(
        self, entry: tuple[Handler, int], rid: Any, service: Any, payload: Any, reply: Reply, peer: str
    ) -> None:
        """Run (or start) the handler ``entry`` for one request; the caller checked the bound."""
        fn, mode = entry
        if self.instruments.request_handled is not None:
            fn = self._timed(fn, mode, str(service), peer)
        if mode != SYNC:
            running = self.running.get(peer, 0)
            if mode == ASYNC:
                self._start(fn, rid, payload, reply, peer, running, service not in self.uncancellable)
                return
        try:
            result = fn(payload)
        except Exception as exc:
            self._spawn_reply(reply(ERR, _error_fields(rid, exc)))
            return
        if mode == INLINE and type(result) is CoroutineType:  # it must wait: finish on a task
            self._start(
                _awaited, rid, result, reply, peer, self.running.get(peer, 0), service not in self.uncancellable
            )
            return
        self._spawn_reply(reply(REP, [rid, result]))

    def _start(
        self, fn: Handler, rid: Any, payload: Any, reply: Reply, peer: str, running: int, cancellable: bool
    ) -> None:
        """Answer with ``await fn(payload)`` on a task counted against ``peer``'s running handlers
        (and reachable by the caller's CANCEL when ``cancellable``). Once the node is stopping
        (:meth:`drain` began) nothing new starts: it would outlive the node, unowned; the
        caller is told as the handlers cancelled by the stop are."""
        if self._draining:
            if fn is _awaited:  # an inline handler's coroutine, never to run
                payload.close()
            self._spawn_reply(reply(ERR, [rid, "asyncio.CancelledError", SHUTDOWN, ""]))
            return
        self.running[peer] = running + 1
        self._start_task(self.loop or asyncio.get_running_loop(), fn, rid, payload, reply, peer, cancellable)

    def _start_task(
        self,
        loop: asyncio.AbstractEventLoop,
        fn: Handler,
        rid: Any,
        payload: Any,
        reply: Reply,
        peer: str,
        cancellable: bool,
    ) -> None:
        """The task of one handler, listed in self.tasks (what drain and a stop from a handler
        look for) and, when ``cancellable``, in self.handling (what a CANCEL looks for). The
        task takes itself out as it ends (_run_async): a done callback would cost one more loop
        iteration per request. Where it starts eagerly (Python 3.12+), its first step lists it
        itself, before the handler runs: the handler may stop the node, or answer and then wait
        for room to write the reply (listing it afterwards would leave a stale entry)."""
        if EAGER_TASKS and loop.get_task_factory() is None:  # (what new_task starts eagerly)
            new_task(
                loop, self._run_async(fn, rid, payload, reply, peer, loop, 2 if cancellable else 1), HANDLER_TASK, True
            )
            return
        task = new_task(loop, self._run_async(fn, rid, payload, reply, peer, loop, 0), HANDLER_TASK)
        self.tasks.add(task)
        if cancellable:
            self.handling[peer, rid] = task

    def _timed(self, fn: Handler, mode: int, service: str, peer: str) -> Handler:
        """``fn`` wrapped to report its duration and outcome to the ``request_handled`` hook."""

        def report(t0: float, exc: BaseException | None) -> None:
            if (hook := self.instruments.request_handled) is not None:
                hook(peer, service, time.perf_counter() - t0, None if exc is None else _type_name(exc))

        async def rest(t0: float, coro: Coroutine[Any, Any, Any]) -> Any:
            try:
                out = await coro
            except BaseException as exc:
                report(t0, exc)
                raise
            report(t0, None)
            return out

        if mode == INLINE:

            def timed_inline(arg: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    out = fn(arg)
                except BaseException as exc:
                    report(t0, exc)
                    raise
                if type(out) is CoroutineType:
                    return rest(t0, out)
                report(t0, None)
                return out

            return timed_inline

        if mode == ASYNC:

            async def timed_async(arg: Any) -> Any:
                t0 = time.perf_counter()
                return await rest(t0, fn(arg))  # an async handler raises only when awaited

            return timed_async

        def timed(arg: Any) -> Any:
            t0 = time.perf_counter()
            try:
                out = fn(arg)
            except BaseException as exc:
                report(t0, exc)
                raise
            report(t0, None)
            return out

        return timed

    async def drain(self, grace: float) -> None:
        """Let running handlers answer for up to ``grace`` s, then cancel what still runs."""
        handlers = list(self.tasks)
        self._draining = True  # what is cancelled from now on is told "node shutting down"
        waiting, self.waiting = self.waiting, {}
        for queued in waiting.values():  # never started, never to start
            for rid, (_entry, _service, _payload, reply) in queued.items():
                self._spawn_reply(reply(ERR, [rid, "asyncio.CancelledError", SHUTDOWN, ""]))
        for peer in list(self._slot_waiters):
            self._wake_slot_waiters(peer)  # readers stopped at the bound: what they read now is refused
        if handlers:
            _done, pending = await asyncio.wait(handlers, timeout=grace)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
            # a task cancelled before it ever ran never reached the finally that removes it
            self.tasks.difference_update([t for t in handlers if t.done()])

    def _spawn_reply(self, aw: Awaitable[None] | None) -> None:
        if aw is not None:  # not with the node's reply (it never blocks); kept for other callers
            task = asyncio.ensure_future(_quiet(aw))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def _wait(
        self, peer: str, rid: Any, entry: tuple[Handler, int], service: Any, payload: Any, reply: Reply
    ) -> asyncio.Future[None] | None:
        """``peer`` runs its bound of handlers: the request waits for one of them to end (None),
        unless as many wait already; then the caller stops reading from ``peer`` until one
        ends (the future), and hands the same request in again."""
        waiting = self.waiting.get(peer)
        if waiting is None:
            waiting = self.waiting[peer] = {}
        elif len(waiting) >= self.max_concurrent_requests:
            return self._slot(peer)
        waiting[rid] = (entry, service, payload, reply)
        return None

    def _slot(self, peer: str) -> asyncio.Future[None]:
        """Done when one of ``peer``'s handlers finishes; registered now, so a handler that
        finishes before the caller awaits it still wakes it."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._slot_waiters.setdefault(peer, []).append(fut)
        return fut

    def _handler_done(self, peer: str) -> None:
        n = self.running[peer] - 1
        if n:
            self.running[peer] = n
        else:
            del self.running[peer]
        waiting = self.waiting.get(peer)
        if waiting and peer not in self._refilling:
            # a handler started here may end within _handle (an eager start): its own
            # _handler_done then only frees its slot, and this loop starts the next one, so
            # nothing recurses and the queue is walked once
            bound = self.max_concurrent_requests
            self._refilling.add(peer)
            try:
                while waiting and self.running.get(peer, 0) < bound:
                    rid = next(iter(waiting))  # the oldest: requests start in the order they came
                    entry, service, payload, reply = waiting.pop(rid)
                    self._handle(entry, rid, service, payload, reply, peer)  # takes the slot (or answers inline)
            finally:
                self._refilling.discard(peer)
            if not waiting:
                self.waiting.pop(peer, None)
        if peer in self._slot_waiters:  # (a call per handler otherwise)
            self._wake_slot_waiters(peer)

    def _wake_slot_waiters(self, peer: str) -> None:
        """A reader stopped on ``peer`` (:meth:`_slot`) may read again: room to wait again."""
        if peer in self._slot_waiters and len(self.waiting.get(peer, ())) < self.max_concurrent_requests:
            for fut in self._slot_waiters.pop(peer):
                if not fut.done():
                    fut.set_result(None)

    async def _run_async(
        self, fn: Handler, rid: int, payload: Any, reply: Reply, peer: str, loop: asyncio.AbstractEventLoop, lists: int
    ) -> None:
        """The task of one async handler: answer with ``await fn(payload)`` (or its error),
        then free the peer's slot and leave self.tasks. (One coroutine, not two: it runs for
        every request.) ``lists``: 0, :meth:`_start_task` listed the task; 1, list it in
        self.tasks first; 2, there and in self.handling (an eager start)."""
        key = (peer, rid)
        if lists:
            me = asyncio.current_task(loop)
            self.tasks.add(me)  # type: ignore[arg-type]
            if lists == 2:
                self.handling[key] = me  # type: ignore[assignment]
        try:
            try:
                result = await fn(payload)
            except asyncio.CancelledError:
                self.handling.pop(key, None)
                if key in self._given_up and not self._draining:
                    raise  # the caller cancelled it (on_cancel): nobody waits for an answer
                why = SHUTDOWN if self._draining else "the handler raised CancelledError"
                await _quiet(reply(ERR, [rid, "asyncio.CancelledError", why, ""]))
                raise
            except Exception as exc:
                self.handling.pop(key, None)
                await _quiet(reply(ERR, _error_fields(rid, exc)))
                return
            # answered: a CANCEL from now on finds nothing to cancel (the reply has its place)
            self.handling.pop(key, None)
            try:
                aw = reply(REP, [rid, result])
                if aw is not None:
                    await aw
            except PeerUnavailable:
                self.log.info("reply dropped: the caller is gone", rid=rid)
            except AionetError as exc:
                await _quiet(reply(ERR, _error_fields(rid, exc)))
        finally:
            self._handler_done(peer)
            self.tasks.discard(asyncio.current_task(loop))


async def _awaited(coro: Coroutine[Any, Any, Any]) -> Any:
    """What an inline handler returned, awaited (the ``fn`` that :meth:`Router._run_async` runs)."""
    return await coro


async def _quiet(aw: Awaitable[None] | None) -> None:
    try:
        if aw is not None:
            await aw
    except Exception:  # the connection is gone: nothing more to tell the caller
        pass


def _type_name(exc: BaseException) -> str:
    t = type(exc)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def returned_coroutine(service: Any = None) -> str:
    """Why a plain ``def`` handler's coroutine is refused, naming the fix."""
    which = "the handler" if service is None else f"the handler of service {service!r}"
    return (
        f"{which} returned a coroutine: register an async def (or mark the def with "
        "aionet.core.ports.inline_handler, which awaits what it returns)"
    )


def _message(exc: BaseException) -> str:
    """``str(exc)``, which runs user code (``__str__``) and can itself fail: rendering a
    handler's error must never raise, or the reply is never sent and its caller waits for good."""
    try:
        return str(exc)
    except Exception as inner:
        return f"<str() failed: {_type_name(inner)}>"


def _error_fields(rid: Any, exc: BaseException) -> list[Any]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))  # survives a bad __str__
    return [rid, _type_name(exc), _message(exc), tb]
