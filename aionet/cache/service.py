"""The cache's effects on one node: request handlers, replication, re-replication, watches.

It never sees the Node: ``node.py`` hands :class:`aionet.cache.Cache` a
:class:`~aionet.core.ports.Messaging` (requests between nodes, the watch channel) and
:class:`~aionet.core.ports.MemberEvents` (who is alive: the only input to placement).
The decisions live in pure state: :class:`~.store.Store` (versions, budget, TTL),
:class:`~.locks.LeaseTable` (leases, fencing tokens) and :class:`~.placement.Placement`.

Authority (docs/cache.md): a key's *primary* (first in its rendezvous ranking over the alive
members this node knows) orders its writes: it assigns versions, checks ``cas`` and fences,
and replicates each write to the key's other replicas before answering. A lock's state lives
on the primary of ``LOCK_PREFIX + name`` the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ..core.ports import Clock, MemberEventInfo, MemberEvents, Messaging, inline_handler, loop_time
from ..core.tasks import OwnedTasks
from ..errors import PeerUnavailable, RemoteError
from ..log import get_logger
from .errors import BY_NAME, CacheFull, StaleFenceError
from .etcd import EtcdCoordination
from .locks import Granted, LeaseTable
from .placement import Placement, owners_in, rank
from .store import Entry, Store, freeze
from .wire import (
    CHANNEL,
    LOAD,
    LOCK_ACQUIRE,
    LOCK_PREFIX,
    LOCK_RELEASE,
    LOCK_RENEW,
    LOCK_VALID,
    MAX_HOPS,
    OP_CAS,
    OP_DEL,
    OP_PUT,
    REPL_BATCH,
    SVC_CLAIM,
    SVC_LOCK,
    SVC_PEEK,
    SVC_PUT,
    SVC_READ,
    SVC_READ_SLOW,
    SVC_REPL,
    SVC_UNCLAIM,
    SVC_WATCH,
    SVC_WRITE,
    WAIT,
)

if TYPE_CHECKING:
    from ..config import CacheSection

_SWEEP_INTERVAL = 1.0  # s between expired-entry sweeps
_UP = ("alive", "suspect")  # member states that keep their keys (a suspicion moves nothing)
_MAX_WATCH_PREFIXES = 1024  # distinct prefixes one watcher node may register on a node
_MAX_WATCHERS = 4096  # watcher nodes one node keeps subscriptions for


def entry_record(key: str, e: Entry, ttl_left: float | None) -> list[Any]:
    return [key, e.version, e.value, -1.0 if ttl_left is None else ttl_left, e.pinned, e.fences, False]


class CacheService:
    """One node's part of the cache: what it stores, the locks it is primary for, and the
    handlers other nodes call. :class:`aionet.cache.Cache` is the user-facing side."""

    def __init__(
        self, cfg: CacheSection, *, messaging: Messaging, members: MemberEvents, clock: Clock = loop_time
    ) -> None:
        self.cfg = cfg
        self._msg = messaging
        self.name: str = messaging.name
        self.clock = clock
        self.log = get_logger("aionet.cache", node=self.name)
        self.store = Store(cfg.max_bytes, clock)
        self.locks = LeaseTable(clock)
        self.placement = Placement([self.name], cfg.replicas)
        # locks, tokens and versions on etcd when configured (values stay here): aionet/cache/etcd.py
        self.coord = EtcdCoordination(cfg.coordination, cfg.request_timeout) if cfg.coordination else None
        self._key_locks: dict[str, asyncio.Lock] = {}  # etcd mode: one write per key at a time
        self._placed: frozenset[str] = self.placement.members  # member set the last rebalance finished for
        self._restarted: set[str] = set()
        self._changed_at = float("-inf")
        self._rebalance_wake = asyncio.Event()
        self._claims: dict[str, tuple[str, asyncio.Future[None]]] = {}  # key -> (loading node, done)
        self._lock_events: dict[str, asyncio.Event] = {}  # lock name -> set when it is released
        self._subs: dict[str, set[str]] = {}  # watcher node -> prefixes (this node notifies as a primary)
        self._out: dict[str, list[list[Any]]] = {}  # watcher node -> changes not sent yet
        self._pumps: dict[str, asyncio.Event] = {}
        self._tasks = OwnedTasks(self.log, "cache")
        self._running = False
        self.rebalances = 0
        self.moved = 0
        # set by the user-facing Cache: changes for this node's watches, members that came up
        self.on_change: Callable[[list[list[Any]]], None] = lambda _c: None
        self.on_member_up: Callable[[str], None] = lambda _n: None
        self.handlers: dict[str, Callable[[Any], Any]] = {
            SVC_WRITE: self._h_write,
            SVC_PUT: self._h_put,
            SVC_READ: self._h_read_fast,
            SVC_READ_SLOW: self._h_read,
            SVC_PEEK: self._h_peek,
            SVC_CLAIM: self._h_claim,
            SVC_UNCLAIM: self._h_unclaim,
            SVC_LOCK: self._h_lock,
            SVC_REPL: self._h_repl,
            SVC_WATCH: self._h_watch,
        }
        for svc, fn in self.handlers.items():
            # a write that replicates, a lock grant, a pull: never stopped half-way because a
            # caller gave up (its retry, or the next caller, finds a consistent store)
            messaging.add_service(svc, fn, cancellable=False)
        self._unsubscribe = members.on_member_change(self._on_member)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._running:
            return
        self._running = True
        self.spawn(self._rebalance_loop(), "aionet-cache-rebalance")
        self.spawn(self._consume(), "aionet-cache-watch")
        self.spawn(self._sweep_loop(), "aionet-cache-sweep")

    async def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        self._unsubscribe()
        for _who, fut in self._claims.values():
            if not fut.done():
                fut.set_result(None)
        self._claims.clear()
        if self.coord is not None:
            self.coord.close()
        await self._tasks.cancel_all()

    @property
    def running(self) -> bool:
        """Between :meth:`start` and :meth:`stop`."""
        return self._running

    def spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any] | None:
        """Start a task the cache owns (cancelled and awaited by stop; failures logged)."""
        if not self._running:
            coro.close()  # type: ignore[attr-defined]
            return None
        return self._tasks.spawn(coro, name)

    # ------------------------------------------------------------------ calls between nodes
    async def call(self, peer: str, svc: str, payload: Any, timeout: float | None = None) -> Any:
        """``svc`` on ``peer`` (directly when it is this node); a cache error the peer raised
        is raised here as the same type."""
        if peer == self.name:
            res = self.handlers[svc](payload)
            return (await res) if asyncio.iscoroutine(res) else res
        try:
            return await self._msg.request(peer, svc, payload, timeout=timeout or self.cfg.request_timeout)
        except RemoteError as exc:
            cls = BY_NAME.get(exc.remote_type)
            if cls is not None:
                raise cls(exc.remote_message) from None
            raise

    def unsettled(self) -> bool:
        """Keys may still be moving: a member set changed lately, or a rebalance is pending."""
        return self._placed != self.placement.members or self.clock() - self._changed_at < self.cfg.settle

    async def _pull(self, key: str) -> None:
        """Before a primary's first write or read of a key it does not hold while keys are
        moving: take the newest copy the other replicas have (it may not have arrived yet)."""
        for peer in self.placement.owners(key):
            if peer == self.name:
                continue
            try:
                rec = await self.call(peer, SVC_PEEK, [key], timeout=min(self.cfg.request_timeout, 2.0))
            except (PeerUnavailable, RemoteError, TimeoutError):
                continue
            if rec is not None:
                self._h_repl([[], [rec]] if key.startswith(LOCK_PREFIX) else [[rec], []])

    async def _replicate(self, owners: tuple[str, ...], entries: list[Any], locks: list[Any]) -> None:
        """Send a write to the key's other replicas and wait for them: a write is answered
        once every reachable replica holds it. An unreachable one is left to re-replication."""
        others = [p for p in owners if p != self.name]
        if not others:
            return
        payload = [entries, locks]
        if len(others) == 1:
            await self._repl_one(others[0], payload)
        else:
            await asyncio.gather(*(self._repl_one(p, payload) for p in others))

    async def _repl_one(self, peer: str, payload: list[Any]) -> bool:
        try:
            await self._msg.request(peer, SVC_REPL, payload, timeout=self.cfg.request_timeout)
            return True
        except (PeerUnavailable, TimeoutError, RemoteError) as exc:
            self.log.debug("replica not updated", peer=peer, error=repr(exc))
            return False

    # ------------------------------------------------------------------ handlers: data
    @inline_handler
    def _h_write(self, arg: list[Any]) -> int | Coroutine[Any, Any, int]:
        """A write at the key's primary, answered inline in the common case (this node is the
        primary, no keys moving, no etcd, no fence, no other replica to wait for); otherwise
        a coroutine that waits for what it must (see :meth:`_write_slow`)."""
        op, key, value, expect, ttl, pin, fence, hops = arg
        owners = self.placement.owners(key)
        if fence is not None or self.coord is not None or (owners[0] != self.name and hops > 0):
            return self._write_slow(arg, owners)
        e = self.store.peek(key)
        if e is None and self.unsettled():
            return self._write_slow(arg, owners)
        if op == OP_CAS and (e.version if e is not None else 0) != expect:
            return 0
        if op == OP_DEL and e is None:
            return 0
        floor = self.store.floor  # store.next_version(key), without peeking at the key again
        version = (e.version if e is not None and e.version > floor else floor) + 1
        version, rec = self._apply(op, key, value, version, ttl, pin, fence, e)
        if len(owners) > 1:
            return self._replicated(owners, rec, version)
        return version

    @inline_handler
    def _h_put(self, arg: list[Any]) -> int | Coroutine[Any, Any, int]:
        """The common write, ``[key, value]``: a put with no ttl, pin or fence. At the primary
        of a key it already holds unpinned (no pull, no etcd), the entry is updated in place
        (its fences kept, as any put keeps them); anything else is the general write."""
        key, value = arg
        owners = self.placement.owners(key)
        e = self.store.peek(key)
        if e is None or e.pinned or owners[0] != self.name or self.coord is not None:
            return self._h_write([OP_PUT, key, value, 0, None, False, None, MAX_HOPS])
        floor = self.store.floor
        version = (e.version if e.version > floor else floor) + 1
        value = freeze(value, copy=False)
        self.store.update(key, e, value, version)
        if self._claims:
            self._release_claim(key)
        if self._subs:
            self._notify(key, version, OP_PUT, value)
        if len(owners) > 1:
            return self._replicated(owners, [key, version, value, -1.0, False, e.fences, False], version)
        return version

    async def _write_slow(self, arg: list[Any], owners: tuple[str, ...]) -> int:
        """The write path that may wait: forwarding to the primary, pulling a key that may be
        moving, checking a fence, or etcd as the authority."""
        op, key, value, expect, ttl, pin, fence, hops = arg
        if owners[0] != self.name and hops > 0:
            return await self.call(owners[0], SVC_WRITE, [op, key, value, expect, ttl, pin, fence, hops - 1])  # type: ignore[no-any-return]
        if self.store.peek(key) is None and self.unsettled():
            await self._pull(key)
        if self.coord is not None:
            if op == OP_CAS and 0 < expect < self.store.version(key):
                return 0  # this node applied a newer etcd revision already: cannot match (no etcd call)
            lock = self._key_locks.get(key)
            if lock is None:
                lock = self._key_locks[key] = asyncio.Lock()
            try:
                async with lock:  # versions come from etcd: keep this primary's changes of a key in order
                    return await self._write_etcd(op, key, value, expect, ttl, pin, fence, owners)
            finally:
                if not lock.locked() and self._key_locks.get(key) is lock:
                    del self._key_locks[key]
        if fence is not None:
            await self._check_fence(key, str(fence[0]), int(fence[1]))
        e = self.store.peek(key)
        if op == OP_CAS and (e.version if e is not None else 0) != expect:
            return 0
        if op == OP_DEL and e is None:
            return 0
        return await self._commit(op, key, value, self.store.next_version(key), ttl, pin, fence, e, owners)

    async def _commit(
        self, op: int, key: str, value: Any, version: int, ttl: Any, pin: Any, fence: Any, e: Entry | None, owners: Any
    ) -> int:
        """Apply a decided write here (as ``version``), tell watchers, and answer once the
        other replicas hold it."""
        version, rec = self._apply(op, key, value, version, ttl, pin, fence, e)
        await self._replicate(owners, [rec], [])
        return version

    async def _replicated(self, owners: tuple[str, ...], rec: list[Any], version: int) -> int:
        """``version``, once the other replicas hold the write (the inline write's tail)."""
        await self._replicate(owners, [rec], [])
        return version

    def _apply(
        self, op: int, key: str, value: Any, version: int, ttl: Any, pin: Any, fence: Any, e: Entry | None
    ) -> tuple[int, list[Any]]:
        """Apply a decided write here (as ``version``) and tell watchers; returns the version
        and the entry record to replicate."""
        if op == OP_DEL:
            self.store.remove(key, version)
            rec = [key, version, None, -1.0, False, {}, True]
            value = None
        else:
            fences = dict(e.fences) if e is not None else {}
            if fence is not None:
                fences[str(fence[0])] = max(fences.get(str(fence[0]), 0), int(fence[1]))
            value = freeze(value, copy=False)
            self.store.apply(key, value, version, ttl=ttl, pinned=bool(pin), fences=fences)
            rec = [key, version, value, -1.0 if ttl is None else float(ttl), bool(pin), fences, False]
            if self._claims:
                self._release_claim(key)
        if self._subs:
            self._notify(key, version, op, value)
        return version, rec

    async def _write_etcd(
        self, op: int, key: str, value: Any, expect: int, ttl: Any, pin: Any, fence: Any, owners: tuple[str, ...]
    ) -> int:
        """The write path when etcd is the authority: the version is the etcd revision of the
        key's version record, and ``cas`` is an etcd transaction."""
        assert self.coord is not None
        if fence is not None:
            await self._check_fence(key, str(fence[0]), int(fence[1]))
        e = self.store.peek(key)
        if op == OP_CAS and e is not None and 0 < expect < e.version:
            return 0  # versions only rise: an older expected version cannot be etcd's current one
        if op == OP_DEL:
            version = await self.coord.write(key, None, delete=True)
        else:
            version = await self.coord.write(key, expect if op == OP_CAS else None)
        if not version:
            return 0
        return await self._commit(op, key, value, version, ttl, pin, fence, e, owners)

    async def _check_fence(self, key: str, name: str, token: int) -> None:
        """Refuse a write fenced by a lease that is not the live one of its lock, or older
        than a lease that already wrote this key."""
        e = self.store.peek(key)
        if e is not None and e.fences.get(name, 0) > token:
            raise StaleFenceError(
                f"write to {key!r} fenced by lock {name!r} token {token} refused: "
                f"token {e.fences[name]} already wrote it"
            )
        if self.coord is not None:
            ok = await self.coord.valid(name, token)
        else:
            primary = self.placement.primary(LOCK_PREFIX + name)
            ok = await self.call(primary, SVC_LOCK, [LOCK_VALID, name, "", token, 0.0, 0.0, 1])
        if not ok:
            raise StaleFenceError(
                f"write to {key!r} fenced by lock {name!r} token {token} refused: that lease has ended "
                f"(expired, released or superseded)"
            )

    def _h_read_fast(self, key: str) -> list[Any]:
        """A read answered inline when this node can: it holds the key, or it is a replica and
        no keys are moving. Else ``[-1, None]``: the caller asks SVC_READ_SLOW."""
        if type(key) is not str:
            raise TypeError(f"a cache read names a str key, not {key!r}")
        e = self.store.get(key)
        if e is not None:
            return [e.version, e.value]
        if self.name in self.placement.owners(key) and not self.unsettled():
            return [0, None]
        return [-1, None]

    async def _h_read(self, arg: list[Any]) -> list[Any]:
        key, hops = arg
        e = self.store.get(key)
        if e is None:
            owners = self.placement.owners(key)
            if self.name not in owners and hops > 0:
                return await self.call(owners[0], SVC_READ_SLOW, [key, hops - 1])  # type: ignore[no-any-return]
            if self.unsettled():
                await self._pull(key)
                e = self.store.get(key)
        return [0, None] if e is None else [e.version, e.value]

    def _h_peek(self, arg: list[Any]) -> list[Any] | None:
        key = arg[0]
        if key.startswith(LOCK_PREFIX):
            name = key[len(LOCK_PREFIX) :]
            return self.locks.record(name) if name in self.locks.tokens else None
        e = self.store.peek(key)
        return None if e is None else entry_record(key, e, self.store.ttl_left(e))

    def _h_repl(self, arg: list[Any]) -> None:
        """Replica side: take writes in arrival order (a sync handler runs inline, so requests
        from one primary apply in the order it sent them). Never goes back a version."""
        entries, locks = arg
        for key, version, value, ttl, pinned, fences, deleted in entries:
            if deleted:
                self.store.remove(key, version)
                continue
            try:
                self.store.apply(
                    key,
                    freeze(value, copy=False),
                    version,
                    ttl=None if ttl < 0 else ttl,
                    pinned=pinned,
                    fences=fences,
                )
            except CacheFull as exc:
                self.log.warning("replica copy dropped: no room", key=key, error=str(exc))
        for rec in locks:
            self.locks.apply(rec)

    # ------------------------------------------------------------------ single flight
    async def _h_claim(self, arg: list[Any]) -> list[Any]:
        """get_or_load's miss at the key's primary: the value, or LOAD (the asker loads it;
        others wait for its put), or WAIT after ``wait`` s (ask again)."""
        key, who, wait, hops = arg
        owners = self.placement.owners(key)
        if owners[0] != self.name and hops > 0:
            fwd = [key, who, wait, hops - 1]
            return await self.call(owners[0], SVC_CLAIM, fwd, timeout=wait + self.cfg.request_timeout)  # type: ignore[no-any-return]
        deadline = self.clock() + wait
        while True:
            e = self.store.get(key)
            if e is None and self.unsettled():
                await self._pull(key)
                e = self.store.get(key)
            if e is not None:
                return [e.version, e.value]
            claim = self._claims.get(key)
            if claim is None or claim[0] == who:
                if claim is None:
                    self._claims[key] = (who, asyncio.get_running_loop().create_future())
                return [0, LOAD]
            left = deadline - self.clock()
            if left <= 0:
                return [0, WAIT]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(claim[1]), left)

    def _h_unclaim(self, arg: list[Any]) -> None:
        key, who = arg
        claim = self._claims.get(key)
        if claim is not None and claim[0] == who:
            self._release_claim(key)

    def _release_claim(self, key: str) -> None:
        claim = self._claims.pop(key, None)
        if claim is not None and not claim[1].done():
            claim[1].set_result(None)

    # ------------------------------------------------------------------ locks
    async def _h_lock(self, arg: list[Any]) -> Any:
        op, name, owner, token, ttl, wait, hops = arg
        pkey = LOCK_PREFIX + name
        owners = self.placement.owners(pkey)
        if owners[0] != self.name and hops > 0:
            fwd = [op, name, owner, token, ttl, wait, hops - 1]
            return await self.call(owners[0], SVC_LOCK, fwd, timeout=wait + self.cfg.request_timeout)
        if name not in self.locks.tokens and self.unsettled():
            await self._pull(pkey)
        locks = self.locks
        if op == LOCK_VALID:
            return locks.valid(name, token)
        if op == LOCK_RENEW:
            ok = locks.renew(name, token, ttl)
            if ok:
                await self._replicate(owners, [], [locks.record(name)])
            return ok
        if op == LOCK_RELEASE:
            ok = locks.release(name, token)
            if ok:
                ev = self._lock_events.pop(name, None)
                if ev is not None:
                    ev.set()
                await self._replicate(owners, [], [locks.record(name)])
            return ok
        if op != LOCK_ACQUIRE:
            raise ValueError(f"unknown lock operation {op!r}")
        deadline = self.clock() + wait
        while True:
            r = locks.acquire(name, owner, ttl)
            if isinstance(r, Granted):
                await self._replicate(owners, [], [locks.record(name)])
                return [r.token, r.ttl]
            left = deadline - self.clock()
            if left <= 0:
                return [0, r.remaining]
            ev = self._lock_events.setdefault(name, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                # woken by a release; else when the lease would end (a dead holder's, say)
                await asyncio.wait_for(ev.wait(), max(min(left, r.remaining), 0.001))

    # ------------------------------------------------------------------ watches
    def _h_watch(self, arg: list[Any]) -> None:
        watcher, prefix, on = arg
        if not isinstance(prefix, str) or watcher not in self.placement.members:
            raise ValueError(
                f"watch subscription refused: {watcher!r} is not a member here, or the prefix is not a str"
            )
        if on:
            prefixes = self._subs.setdefault(watcher, set())
            if len(prefixes) >= _MAX_WATCH_PREFIXES and prefix not in prefixes:
                raise ValueError(f"{watcher!r} already watches {_MAX_WATCH_PREFIXES} prefixes here")
            prefixes.add(prefix)
        else:
            prefixes = self._subs.get(watcher)
            if prefixes is not None:
                prefixes.discard(prefix)
                if not prefixes:
                    del self._subs[watcher]

    def _notify(self, key: str, version: int, op: int, value: Any) -> None:
        """Queue a change for each watcher of a prefix of ``key``, in the order this primary
        assigned versions (one sender per watcher keeps that order on the wire)."""
        change = [key, version, op, value]
        for watcher, prefixes in self._subs.items():
            if not any(key.startswith(p) for p in prefixes):
                continue
            if watcher == self.name:
                self.on_change([change])
                continue
            self._out.setdefault(watcher, []).append(change)
            wake = self._pumps.get(watcher)
            if wake is None:
                wake = self._pumps[watcher] = asyncio.Event()
                self.spawn(self._pump(watcher, wake), f"aionet-cache-pump-{watcher}")
            wake.set()

    async def _pump(self, watcher: str, wake: asyncio.Event) -> None:
        try:
            while True:
                await wake.wait()
                wake.clear()
                batch = self._out.pop(watcher, None)
                if batch:
                    await self._msg.send(watcher, CHANNEL, batch)
        except PeerUnavailable:
            self._subs.pop(watcher, None)
            self._out.pop(watcher, None)
        finally:
            if self._pumps.get(watcher) is wake:
                del self._pumps[watcher]

    async def _consume(self) -> None:
        while True:
            for batch in await self._msg.recv_batch(CHANNEL):
                try:
                    self.on_change(batch)
                except (TypeError, ValueError) as exc:  # a peer's malformed batch: skip it, keep watching
                    self.log.warning("malformed cache change batch dropped", error=repr(exc))

    # ------------------------------------------------------------------ membership
    def _on_member(self, ev: MemberEventInfo) -> None:
        name = ev.name
        if name == self.name:
            return
        members = set(self.placement.members)
        if ev.kind == "restarted":
            self._restarted.add(name)  # a new process: whatever the old one held is gone
        if ev.state in _UP:
            came_up = name not in members or ev.kind == "restarted"
            members.add(name)
        else:
            came_up = False
            members.discard(name)
            self._subs.pop(name, None)
            self._out.pop(name, None)
            for key, (who, _fut) in list(self._claims.items()):
                if who == name:  # its load died with it: the next asker loads
                    self._release_claim(key)
        if self.placement.update(members) or name in self._restarted:
            self._changed_at = self.clock()
            self._rebalance_wake.set()
        if came_up:
            self.on_member_up(name)

    async def _rebalance_loop(self) -> None:
        while True:
            await self._rebalance_wake.wait()
            self._rebalance_wake.clear()
            await asyncio.sleep(0)  # let a burst of membership events land first
            new = self.placement.members
            old = self._placed - self._restarted
            self._restarted.clear()
            try:
                ok = await self._rebalance(old, new)
            except Exception as exc:  # keep the loop: the next change (or the retry) runs it again
                self.log.error("cache re-replication failed", error=repr(exc))
                ok = False
            if ok:
                self._placed = new
            else:
                self._placed = old | {self.name}
                await asyncio.sleep(0.2)
                self._rebalance_wake.set()

    async def _rebalance(self, old: frozenset[str], new: frozenset[str]) -> bool:
        """Move copies after the member set went from ``old`` to ``new``: for each key whose
        replica list changed, the highest-ranked node still alive that held it sends it to
        the new replicas; a node no longer a replica drops its copy once that is done.
        True when every send succeeded."""
        me, n = self.name, self.cfg.replicas
        out: dict[str, tuple[list[Any], list[Any]]] = {}
        drop: list[str] = []
        drop_locks: list[str] = []

        def plan(key: str) -> bool:  # -> whether this node pushes the key
            new_set = self.placement.owners(key)
            old_set = owners_in(key, old, n) if old else ()
            if old_set == new_set and me in new_set:
                return False
            holders = (set(old_set) & new) | {me}
            push = rank(key, holders)[0] == me
            if push:
                for d in new_set:
                    if d != me:
                        out.setdefault(d, ([], []))
            return push

        for key, e in list(self.store.items()):
            push = plan(key)
            if push:
                rec = entry_record(key, e, self.store.ttl_left(e))
                for d in self.placement.owners(key):
                    if d != me:
                        out[d][0].append(rec)
            if me not in self.placement.owners(key):
                drop.append(key)
        for name in self.locks.names():
            pkey = LOCK_PREFIX + name
            if plan(pkey):
                rec = self.locks.record(name)
                for d in self.placement.owners(pkey):
                    if d != me:
                        out[d][1].append(rec)
            if me not in self.placement.owners(pkey):
                drop_locks.append(name)
        ok = True
        sent = 0
        for dest, (entries, locks) in out.items():
            for i in range(0, max(len(entries), 1), REPL_BATCH):
                chunk = entries[i : i + REPL_BATCH]
                if not chunk and not (i == 0 and locks):
                    continue
                if not await self._repl_one(dest, [chunk, locks if i == 0 else []]):
                    ok = False
                    break
                sent += len(chunk)
        self.rebalances += 1
        self.moved += sent
        if ok and self.placement.members == new:
            for key in drop:
                if me not in self.placement.owners(key):
                    self.store.discard(key)
            for name in drop_locks:
                if me not in self.placement.owners(LOCK_PREFIX + name):
                    self.locks.forget(name)
        if sent:
            self.log.info("cache re-replicated", copies=sent, members=len(new))
        return ok

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(_SWEEP_INTERVAL)
            self.store.sweep()


__all__ = ["CacheService", "entry_record"]
