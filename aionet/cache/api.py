"""``node.cache`` and ``node.lock``: what users call (the effects are in :mod:`.service`).

::

    v = await node.cache.put("k", value, ttl=60)
    value, version = await node.cache.get_versioned("k")
    if await node.cache.cas("k", value + 1, version): ...
    async with node.lock("resource", ttl=10) as lease:
        await node.cache.put("k", value, fence=lease)     # refused once the lease is stale
    async for change in node.cache.watch("jobs/"): ...

See docs/cache.md for the consistency model.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.ports import Clock, MemberEvents, Messaging, loop_time
from ..errors import PeerUnavailable, RemoteError
from .errors import BY_NAME, CacheError, LockLost
from .service import CacheService
from .store import freeze
from .wire import (
    LOAD,
    LOCK_ACQUIRE,
    LOCK_PREFIX,
    LOCK_RELEASE,
    LOCK_RENEW,
    MAX_HOPS,
    OP_CAS,
    OP_DEL,
    OP_NAMES,
    OP_PUT,
    SVC_CLAIM,
    SVC_LOCK,
    SVC_PUT,
    SVC_READ,
    SVC_READ_SLOW,
    SVC_UNCLAIM,
    SVC_WATCH,
    SVC_WRITE,
)

if TYPE_CHECKING:
    from ..config import CacheSection

try:
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None  # type: ignore[assignment]

_CLAIM_WAIT = 1.0  # s a get_or_load waiter parks at the primary per round
_LOCK_WAIT = 1.0  # s an acquire parks at the lock's primary per round


@dataclass(frozen=True, slots=True)
class Change:
    """One change a watch delivers: ``kind`` is "put" or "delete" (``value`` None)."""

    key: str
    version: int
    kind: str
    value: Any


class Lease:
    """A held lock: ``token`` rises with every grant of the lock's name. ``lost`` is set
    when a renewal was refused (the lease ended: another holder may have it now)."""

    def __init__(self, name: str, token: int, ttl: float) -> None:
        self.name = name
        self.token = token
        self.ttl = ttl
        self.lost = asyncio.Event()
        self._renewer: asyncio.Task[Any] | None = None
        self._etcd_lease = 0  # etcd coordination: the etcd lease that keeps the lock key

    @property
    def fence(self) -> list[Any]:
        return [self.name, self.token]

    def __repr__(self) -> str:
        return f"Lease({self.name!r}, token={self.token}{', lost' if self.lost.is_set() else ''})"


class LockContext:
    """``async with node.lock(name, ttl=10) as lease:``; renewed every ttl/3 while held."""

    def __init__(self, cache: Cache, name: str, ttl: float, timeout: float | None) -> None:
        self._cache, self._name, self._ttl, self._timeout = cache, name, ttl, timeout
        self.lease: Lease | None = None

    async def __aenter__(self) -> Lease:
        self.lease = await self._cache.acquire(self._name, self._ttl, timeout=self._timeout)
        return self.lease

    async def __aexit__(self, *exc: object) -> None:
        if self.lease is not None:
            await self._cache.release(self.lease)


class WatchStream:
    """``async for change in node.cache.watch(prefix)``: every change of a key under
    ``prefix``, in version order per key. Bounded: when full the oldest is dropped and
    counted in ``dropped``. ``close()`` (or leaving ``async with``) unsubscribes."""

    def __init__(self, cache: Cache, prefix: str, maxsize: int) -> None:
        self._cache = cache
        self.prefix = prefix
        self._q: asyncio.Queue[Change | None] = asyncio.Queue()
        self._maxsize = maxsize
        self._seen: dict[str, int] = {}
        self._subscribing: list[asyncio.Task[Any]] = []
        self.dropped = 0
        self.closed = False

    async def ready(self) -> WatchStream:
        """Wait until the subscription reached every member (``async with`` does this):
        changes written after that are all delivered."""
        if self._subscribing:
            await asyncio.wait(self._subscribing)
            self._subscribing.clear()
        return self

    def _push(self, c: Change) -> None:
        if c.version <= self._seen.get(c.key, 0):
            return  # already delivered (a change can reach us twice across a primary's failover)
        self._seen[c.key] = c.version
        if self._q.qsize() >= self._maxsize:
            self._q.get_nowait()
            self.dropped += 1
        self._q.put_nowait(c)

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> Change:
        if self.closed and self._q.empty():
            raise StopAsyncIteration
        c = await self._q.get()
        if c is None:
            raise StopAsyncIteration
        return c

    async def get(self, timeout: float | None = None) -> Change:
        return await asyncio.wait_for(self.__anext__(), timeout)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._cache._unwatch(self)
            self._q.put_nowait(None)

    async def __aenter__(self) -> WatchStream:
        return await self.ready()

    async def __aexit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class CacheRef:
    """``aionet.cache_ref(key)``: a task argument naming a cache key. The scheduler places the
    task on a node holding a replica of the key (the ``locality`` policy, and any policy reading
    ``TaskReq.dep_bytes``); inside the task, ``await aionet.task_context().node.cache.get(ref.key)``
    then reads the local copy."""

    key: str

    @property
    def __aionet_locality__(self) -> str:  # what the scheduler asks of any argument (duck-typed)
        return self.key


def cache_ref(key: str) -> CacheRef:
    """A task argument that says "run me where this cache key is held"."""
    return CacheRef(_check_key(key))


class Cache:
    """The distributed cache of one node: ``node.cache``."""

    def __init__(
        self, cfg: CacheSection, *, messaging: Messaging, members: MemberEvents, clock: Clock = loop_time
    ) -> None:
        self.cfg = cfg
        messaging.register_type(CacheRef, "aionet.cache_ref")  # travels as a task argument
        self.service = CacheService(cfg, messaging=messaging, members=members, clock=clock)
        self.name = messaging.name
        self._request = messaging.request  # the fast paths of put and get call it directly
        self._placement = self.service.placement
        self._id = f"{messaging.name}/{messaging.node_id[:8]}"
        self._seq = itertools.count(1)
        self._watches: set[WatchStream] = set()
        self._loading: dict[str, asyncio.Future[Any]] = {}
        self.service.on_change = self._on_change
        self.service.on_member_up = self._resubscribe

    async def start(self) -> None:
        await self.service.start()

    async def stop(self) -> None:
        for w in list(self._watches):
            w.close()
        await self.service.stop()

    @property
    def store(self) -> Any:
        """This node's copies (a :class:`~aionet.cache.store.Store`), for inspection."""
        return self.service.store

    def owners(self, key: str) -> tuple[str, ...]:
        """The nodes that hold ``key`` now, primary first."""
        return self.service.placement.owners(_check_key(key))

    # ------------------------------------------------------------------ writes
    async def put(
        self, key: str, value: Any, ttl: float | None = None, *, fence: Lease | None = None, pin: bool = False
    ) -> int:
        """Store ``value``; returns its new version. ``fence=lease`` refuses the write with
        StaleFenceError unless ``lease`` is its lock's live lease. ``pin=True`` keeps it out
        of LRU eviction. A numpy array is copied once here; gets on a replica share it."""
        if ttl is None and fence is None and not pin and type(key) is str and key and key[0] != "\x00":
            # the common put, at a remote primary: one request of the smallest form, no
            # frames between here and the request (any failure takes the general path)
            primary = self._placement.owners(key)[0]
            if primary != self.name:
                start = loop_time()
                try:
                    return await self._request(primary, SVC_PUT, [key, value], self.cfg.request_timeout)  # type: ignore[no-any-return]
                except RemoteError as exc:
                    raise _remote(exc) from None
                except (PeerUnavailable, TimeoutError) as exc:
                    return await self._write_retry(OP_PUT, key, value, 0, None, False, None, start, exc)
        return await self._write(OP_PUT, key, value, 0, ttl, pin, fence)

    async def cas(
        self,
        key: str,
        value: Any,
        expect_version: int,
        ttl: float | None = None,
        *,
        fence: Lease | None = None,
        pin: bool = False,
    ) -> bool:
        """Store ``value`` only if the key's version is still ``expect_version`` (0: absent)."""
        return await self._write(OP_CAS, key, value, int(expect_version), ttl, pin, fence) > 0

    async def delete(self, key: str, *, fence: Lease | None = None) -> bool:
        """Remove ``key``; False if it was absent."""
        return await self._write(OP_DEL, key, None, 0, None, False, fence) > 0

    async def _write(
        self, op: int, key: str, value: Any, expect: int, ttl: float | None, pin: bool, fence: Lease | None
    ) -> int:
        _check_key(key)
        if ttl is not None and not ttl > 0:
            raise ValueError("ttl must be positive seconds (or None: no expiry)")
        fence_f = _fence(fence)
        svc = self.service
        start = loop_time()
        primary = svc.placement.primary(key)
        failed: Exception | None = None
        if primary != self.name:  # the usual case, without the retry loop's closure and frames
            try:
                return await svc.call(primary, SVC_WRITE, [op, key, value, expect, ttl, pin, fence_f, MAX_HOPS])  # type: ignore[no-any-return]
            except (PeerUnavailable, TimeoutError) as exc:
                failed = exc
        return await self._write_retry(op, key, value, expect, ttl, pin, fence_f, start, failed)

    async def _write_retry(
        self,
        op: int,
        key: str,
        value: Any,
        expect: int,
        ttl: float | None,
        pin: bool,
        fence_f: list[Any] | None,
        start: float,
        failed: Exception | None,
    ) -> int:
        """A write's retry loop (after a first try at a remote primary ``failed``, or for a
        write this node is the primary of)."""
        svc = self.service

        async def once() -> int:
            primary = svc.placement.primary(key)
            v = freeze(value, copy=True) if primary == self.name else value
            payload = [op, key, v, expect, ttl, pin, fence_f, MAX_HOPS]
            return await svc.call(primary, SVC_WRITE, payload)  # type: ignore[no-any-return]

        return await self._retrying(once, start, failed)

    # ------------------------------------------------------------------ reads
    async def get(self, key: str, default: Any = None, *, copy: bool = False) -> Any:
        """The value, or ``default`` when absent. On a node holding a replica a numpy array
        comes back as the cached memory, read-only; ``copy=True`` returns a writable copy."""
        if type(key) is str and key and key[0] != "\x00":
            owners = self._placement.owners(key)
            if self.name in owners:
                e = self.service.store.get(key)
                if e is not None and self.service.running:  # a stopped node's copy is no longer kept
                    return _copy(e.value) if copy else e.value
            else:  # a remote replica: one request, no frames between here and the request
                start = loop_time()
                try:
                    version, value = await self._request(owners[0], SVC_READ, key, self.cfg.request_timeout)
                except RemoteError as exc:
                    raise _remote(exc) from None
                except (PeerUnavailable, TimeoutError) as exc:
                    version, value = await self._read_rest(key, copy, owners, start, exc)
                if version >= 0:
                    return default if version == 0 else value
        version, value = await self._read(key, copy)
        return default if version == 0 else value

    async def get_versioned(self, key: str, *, copy: bool = False) -> tuple[Any, int]:
        """``(value, version)``; ``(None, 0)`` when absent (``cas(..., 0)`` creates it)."""
        version, value = await self._read(key, copy)
        return value, version

    async def _read(self, key: str, copy: bool) -> tuple[int, Any]:
        svc = self.service
        _check_key(key)
        owners = svc.placement.owners(key)
        if self.name in owners:
            e = svc.store.get(key)
            if e is not None and svc.running:
                return e.version, _copy(e.value) if copy else e.value
        start = loop_time()
        try:  # the first round without the retry loop's closure and frames (the usual case)
            return await self._read_from(key, copy, owners)
        except (PeerUnavailable, TimeoutError) as exc:
            failed = exc
        return await self._retrying(lambda: self._read_from(key, copy, svc.placement.owners(key)), start, failed)

    async def _read_rest(
        self, key: str, copy: bool, owners: tuple[str, ...], start: float, failed: Exception
    ) -> tuple[int, Any]:
        """After ``owners[0]`` failed a read: the key's other replicas this round, then the
        retry loop (from ``start``)."""
        if len(owners) > 1:
            try:
                return await self._read_from(key, copy, owners[1:])
            except (PeerUnavailable, TimeoutError) as exc:
                failed = exc
        svc = self.service
        return await self._retrying(lambda: self._read_from(key, copy, svc.placement.owners(key)), start, failed)

    async def _read_from(self, key: str, copy: bool, owners: tuple[str, ...]) -> tuple[int, Any]:
        """One round: ask each replica in turn until one answers (not once this node has
        stopped: its own store, asked last, would say absent for a key the others hold)."""
        svc = self.service
        if not svc.running:
            raise self._stopped()
        last: Exception | None = None
        for peer in owners:
            try:
                version, value = await svc.call(peer, SVC_READ, key)
                if version < 0:
                    version, value = await svc.call(peer, SVC_READ_SLOW, [key, MAX_HOPS])
                return version, _copy(value) if copy and peer == self.name else value
            except (PeerUnavailable, TimeoutError) as exc:
                last = exc
        raise last or PeerUnavailable(f"no replica of {key!r} reachable")

    async def get_or_load(
        self, key: str, loader: Callable[[], Any], ttl: float | None = None, *, timeout: float | None = None
    ) -> Any:
        """The value of ``key``; on a miss ``loader()`` (sync or async) runs once in the whole
        cluster: the key's primary lets the first asker load it and holds the others until its
        put (if that asker fails or dies, the next asker loads)."""
        _check_key(key)
        svc = self.service
        if self.name in svc.placement.owners(key):
            e = svc.store.get(key)
            if e is not None:
                return e.value
        local = self._loading.get(key)  # one flight per node, then one per cluster
        if local is not None:
            return await asyncio.shield(local)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._loading[key] = fut
        try:
            value = await asyncio.wait_for(self._load(key, loader, ttl), timeout)
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # retrieved: no other local caller may be waiting
            raise
        else:
            fut.set_result(value)
        finally:
            self._loading.pop(key, None)
        return value

    async def _load(self, key: str, loader: Callable[[], Any], ttl: float | None) -> Any:
        svc = self.service
        who = f"{self._id}#{next(self._seq)}"
        while True:

            async def claim() -> list[Any]:
                primary = svc.placement.primary(key)
                payload = [key, who, _CLAIM_WAIT, MAX_HOPS]
                return await svc.call(primary, SVC_CLAIM, payload, timeout=_CLAIM_WAIT + self.cfg.request_timeout)  # type: ignore[no-any-return]

            version, value = await self._retrying(claim)
            if version:
                return value
            if value != LOAD:
                continue  # someone else is loading: ask again
            try:
                value = loader()
                if inspect.isawaitable(value):
                    value = await value
            except BaseException:
                primary = svc.placement.primary(key)
                try:
                    await svc.call(primary, SVC_UNCLAIM, [key, who])
                except Exception:  # the primary is gone: its claims went with it
                    pass
                raise
            await self.put(key, value, ttl)
            return value

    # ------------------------------------------------------------------ watches
    def watch(self, prefix: str = "", maxsize: int = 100_000) -> WatchStream:
        """Changes of keys starting with ``prefix``: ``async with cache.watch(p) as w:
        async for change in w: ...`` (entering waits until every member has the subscription;
        see :meth:`WatchStream.ready`)."""
        w = WatchStream(self, prefix, maxsize)
        if not self.service.running:  # stopped: no change can come, so the stream ends at once
            w.closed = True
            w._q.put_nowait(None)
            return w
        first = not any(x.prefix == prefix for x in self._watches)
        self._watches.add(w)
        if first:
            for peer in self.service.placement.members:
                t = self._subscribe(peer, prefix, True)
                if t is not None:
                    w._subscribing.append(t)
        return w

    def _unwatch(self, w: WatchStream) -> None:
        self._watches.discard(w)
        if not any(x.prefix == w.prefix for x in self._watches):
            for peer in self.service.placement.members:
                self._subscribe(peer, w.prefix, False)

    def _subscribe(self, peer: str, prefix: str, on: bool) -> asyncio.Task[Any] | None:
        if peer == self.name:
            self.service._h_watch([self.name, prefix, on])
            return None
        return self.service.spawn(self._subscribe_remote(peer, prefix, on), "aionet-cache-subscribe")

    async def _subscribe_remote(self, peer: str, prefix: str, on: bool) -> None:
        try:
            await self.service.call(peer, SVC_WATCH, [self.name, prefix, on])
        except Exception as exc:  # gone: it is subscribed again if it comes back
            self.service.log.debug("watch subscription not sent", peer=peer, error=repr(exc))

    def _resubscribe(self, peer: str) -> None:
        for prefix in {w.prefix for w in self._watches}:
            self._subscribe(peer, prefix, True)

    def _on_change(self, batch: list[list[Any]]) -> None:
        for key, version, op, value in batch:
            if not isinstance(key, str) or not isinstance(version, int):
                raise TypeError(f"malformed cache change {key!r} version {version!r}")
            c = Change(key, version, OP_NAMES.get(op, "put"), value)
            for w in self._watches:
                if key.startswith(w.prefix):
                    w._push(c)

    # ------------------------------------------------------------------ locks
    def lock(self, name: str, ttl: float = 10.0, *, timeout: float | None = None) -> LockContext:
        """``async with cache.lock(name, ttl=10) as lease:``; see :meth:`acquire`."""
        return LockContext(self, name, ttl, timeout)

    async def acquire(self, name: str, ttl: float = 10.0, *, timeout: float | None = None) -> Lease:
        """Wait for lock ``name`` (up to ``timeout`` s: TimeoutError) and hold it with a lease
        of ``ttl`` s, renewed every ttl/3 by a task of this node until :meth:`release`.
        A holder that dies keeps the lock until its lease ends."""
        _check_key(name)
        if not ttl > 0:
            raise ValueError("lock ttl must be positive seconds")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        owner = f"{self._id}#{next(self._seq)}"
        svc = self.service
        if svc.coord is not None:
            return await self._acquire_etcd(name, ttl, owner, deadline, timeout)
        while True:
            left = _LOCK_WAIT if deadline is None else min(_LOCK_WAIT, deadline - loop.time())
            if left <= 0:
                raise TimeoutError(f"lock {name!r} not acquired within {timeout} s")

            async def ask(wait: float = left) -> list[Any]:
                primary = svc.placement.primary(LOCK_PREFIX + name)
                payload = [LOCK_ACQUIRE, name, owner, 0, float(ttl), wait, MAX_HOPS]
                return await svc.call(primary, SVC_LOCK, payload, timeout=wait + self.cfg.request_timeout)  # type: ignore[no-any-return]

            token, _ = await self._retrying(ask)
            if token:
                lease = Lease(name, int(token), float(ttl))
                lease._renewer = svc.spawn(self._renew(lease), f"aionet-cache-lease-{name}")
                return lease

    async def _acquire_etcd(
        self, name: str, ttl: float, owner: str, deadline: float | None, timeout: float | None
    ) -> Lease:
        svc = self.service
        coord = svc.coord
        assert coord is not None
        loop = asyncio.get_running_loop()
        delay = 0.02
        while True:
            token, lease_id = await self._retrying(lambda: coord.acquire(name, owner, ttl))
            if token:
                lease = Lease(name, token, float(ttl))
                lease._etcd_lease = lease_id
                lease._renewer = svc.spawn(self._renew(lease), f"aionet-cache-lease-{name}")
                return lease
            if deadline is not None and loop.time() + delay > deadline:
                raise TimeoutError(f"lock {name!r} not acquired within {timeout} s")
            await asyncio.sleep(delay)  # held: poll until its holder releases or etcd expires it
            delay = min(delay * 2, 0.2)

    async def release(self, lease: Lease) -> None:
        """End ``lease`` now (stops its renewal)."""
        t = lease._renewer
        lease._renewer = None
        if t is not None:
            t.cancel()
            await asyncio.wait([t])
        if lease.lost.is_set():
            return
        svc = self.service
        if svc.coord is not None:
            try:
                await svc.coord.release(lease._etcd_lease)
            except Exception as exc:  # etcd unreachable: the lease runs out there
                svc.log.debug("lock release not delivered", lock=lease.name, error=repr(exc))
            return
        try:
            primary = svc.placement.primary(LOCK_PREFIX + lease.name)
            await svc.call(primary, SVC_LOCK, [LOCK_RELEASE, lease.name, "", lease.token, 0.0, 0.0, MAX_HOPS])
        except Exception as exc:  # unreachable: the lease simply runs out
            svc.log.debug("lock release not delivered", lock=lease.name, error=repr(exc))

    async def _renew(self, lease: Lease) -> None:
        svc = self.service
        loop = asyncio.get_running_loop()
        ends = loop.time() + lease.ttl
        while True:
            await asyncio.sleep(lease.ttl / 3)
            while True:
                try:
                    started = loop.time()
                    if svc.coord is not None:
                        ok = await svc.coord.renew(lease._etcd_lease)
                        break
                    primary = svc.placement.primary(LOCK_PREFIX + lease.name)
                    payload = [LOCK_RENEW, lease.name, "", lease.token, lease.ttl, 0.0, MAX_HOPS]
                    ok = await svc.call(primary, SVC_LOCK, payload, timeout=lease.ttl / 3)
                    break
                except (PeerUnavailable, TimeoutError):
                    if loop.time() >= ends:
                        ok = False
                        break
                    await asyncio.sleep(min(0.05, lease.ttl / 10))
            if not ok:
                lease.lost.set()
                svc.log.warning("lock lease lost", lock=lease.name, token=lease.token)
                return
            ends = started + lease.ttl

    # ------------------------------------------------------------------ helpers
    async def _retrying(
        self, once: Callable[[], Awaitable[Any]], start: float | None = None, failed: Exception | None = None
    ) -> Any:
        """Run ``once`` until it answers, retrying while the target is unreachable (membership
        moves the key to its next replica) for up to ``cache.request_timeout`` s from ``start``
        (default: now). ``failed``: the caller's own first try failed so (back off first).
        Once this node has stopped, CacheError at once: every write, lock and read comes
        through here then (a local copy is no longer kept up to date, so it is not served)."""
        loop = asyncio.get_running_loop()
        deadline = (loop.time() if start is None else start) + self.cfg.request_timeout
        delay = 0.01
        while True:
            if not self.service.running:  # no retry can help, and this node's own copy is no
                raise self._stopped()  # write or lock anyone else would see
            if failed is None:
                try:
                    return await once()
                except (PeerUnavailable, TimeoutError) as exc:
                    failed = exc
            if loop.time() + delay > deadline:
                raise failed
            failed = None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.25)

    def _stopped(self) -> CacheError:
        return CacheError(f"node {self.name!r} is stopped: the cache needs a running node (start a new Node)")

    def stats(self) -> dict[str, Any]:
        s = self.service
        return {
            "entries": len(s.store),
            "bytes": s.store.nbytes,
            "evictions": s.store.evictions,
            "expirations": s.store.expirations,
            "locks": len(s.locks.held),
            "members": sorted(s.placement.members),
            "rebalances": s.rebalances,
            "moved": s.moved,
        }


def _check_key(key: Any) -> str:
    if not isinstance(key, str) or not key or key.startswith("\x00"):
        raise TypeError(f"cache keys and lock names are non-empty str not starting with NUL, not {key!r}")
    return key


def _fence(lease: Any) -> list[Any] | None:
    if lease is None:
        return None
    if isinstance(lease, Lease):
        return lease.fence
    raise TypeError(f"fence= takes the Lease of `async with node.lock(...)`, not {lease!r}")


def _remote(exc: RemoteError) -> Exception:
    """A cache error a peer raised, as its own type here (else the RemoteError itself)."""
    cls = BY_NAME.get(exc.remote_type)
    return exc if cls is None else cls(exc.remote_message)


def _copy(value: Any) -> Any:
    if _np is not None and isinstance(value, _np.ndarray):
        return value.copy()
    return value


__all__ = ["Cache", "Change", "Lease", "LockContext", "LockLost", "WatchStream"]
