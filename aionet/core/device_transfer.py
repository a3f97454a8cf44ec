"""Device arrays through the Node API: ``node.send``, ``node.request`` and service replies.

The serializer offers objects it does not know to the node's :class:`DeviceTransfers` (its
``device_hook``), after every other check, so plain messages never pay for this module. A
device array (CuPy, ``__cuda_array_interface__``, CUDA DLPack) then travels one of three ways:

* **inline**, arrays smaller than one staging chunk: copied to host synchronously
  (:meth:`Stager.encode`) and carried as out-of-band frames of the message itself;
* **staged**, larger arrays: before the message, the node sends the array's chunks as
  separate sequenced link messages (envelope kind ``XFER``), each chunk copied device->host
  into a buffer of the node's pinned :class:`~aionet.devices.buffers.BufferPool` while the
  previous chunk is on the wire (:class:`~aionet.devices.staging.ChunkStream`); the message
  then refers to the transfer by id. A pool buffer goes back to the pool only when nothing
  references its frame any more (the link keeps frames for replay until the peer acknowledges
  them), so pinned memory is bounded by ``[buffers] max_bytes`` and a sender faster than the
  network waits for acknowledgements (back-pressure);
* **device frames**, when the connection's transport moves device memory itself
  (``moves_device_memory``, UCX with CUDA): the device buffer is the frame.

Why the two-step send: the link stamps a message's sequence number before serializing it, so
chunks cannot be slipped in front of it from inside the serializer. The hook therefore refuses
(:class:`StagingRequired`) when it meets a device array outside a plan; the node catches that,
finds the arrays with a throw-away serialization, streams the large ones, and posts the message
again with the plan in a context variable so the hook can refer to the transfers.

On the receiver, chunks are validated synchronously (hostile input closes the connection),
queued in arrival order and fed by one task per peer into :meth:`Stager.receiver`; a full
queue pauses reading that connection. The message that refers to a transfer is decoded when
the transfer is complete (:class:`TransferPending` makes the node wait and decode it again).
If the array cannot be held here (no GPU and ``device_host_fallback = false``) the message is
not delivered: a request is answered with the error, a reply fails the request, a send is
logged and counted in ``node.info()["device"]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from ..codecs.envelope import ERR, REP, REQ, SEND, XFER
from ..codecs.extensions import DEVICE_FRAMES, DEVICE_INLINE, DEVICE_STAGED, DecodeDeferred
from ..codecs.serialize import Serializer
from ..config import BuffersSection, LimitsSection
from ..devices import BufferPool, ChunkStream, Devices, PooledBuffer, Receiver, Stager, is_device_array
from ..errors import (
    DecodeError,
    FrameTooLarge,
    PeerUnavailable,
    ProtocolError,
    SerializationError,
)
from ..instrument import Instruments
from ..stats import DeviceTransferStats

__all__ = ["DeviceTransfers", "StagingRequired", "TransferFailed", "TransferPending"]

_KiB, _MiB = 1 << 10, 1 << 20
_TOMBSTONES = 8192  # transfer ids remembered after use (replayed duplicates, dropped transfers)
_ABORT = -1  # chunk index that tells the receiver to drop a transfer


class StagingRequired(SerializationError):
    """The message holds device arrays: the node must plan and stage them (internal signal,
    also what users see when a device array is sent by a path that cannot stage it)."""


class TransferPending(DecodeDeferred):
    """The message refers to a staged array whose chunks are still being copied."""

    def __init__(self, wait: asyncio.Future[None]) -> None:
        super().__init__("device array transfer still in progress")
        self.wait = wait


class TransferFailed(DecodeDeferred):
    """The message holds a device array this node cannot hold (or whose transfer failed)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _Plan:
    """What the encoder hook does with each device array of one message (keyed by id)."""

    __slots__ = ("collect", "decided", "found", "referenced")

    def __init__(self) -> None:
        self.collect = True
        self.referenced = False  # the message referring to the transfers was serialized
        self.found: dict[int, Any] = {}  # id -> array (kept alive so ids stay unique)
        self.decided: dict[int, tuple[int, int]] = {}  # id -> (mode, transfer id)


class _Transfer:
    __slots__ = (
        "array",
        "chunk",
        "done",
        "dropped",
        "error",
        "finished",
        "nbytes",
        "nchunks",
        "peer",
        "received",
        "rx",
        "rx_id",
        "started",
        "xid",
    )

    def __init__(self, xid: int, peer: str, rx_id: str, meta: dict[str, Any]) -> None:
        self.xid = xid
        self.peer = peer
        self.rx_id = rx_id
        self.nbytes = int(meta["nbytes"])
        self.chunk = int(meta["chunk"])
        self.nchunks = int(meta["nchunks"])
        self.started = time.perf_counter()
        self.received = 0  # chunks accepted from the network
        self.rx: Receiver | None = None
        self.error: BaseException | None = None
        self.array: Any = None
        self.finished = False  # every chunk copied (or skipped after an error)
        self.dropped = False
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class _PeerRx:
    """Incoming transfers from one peer, fed in arrival order by one task."""

    __slots__ = ("feeder", "last_complete", "pending_bytes", "queue", "space", "transfers")

    def __init__(self) -> None:
        self.transfers: dict[int, _Transfer] = {}
        self.queue: deque[tuple[_Transfer, memoryview, bool]] = deque()
        self.feeder: asyncio.Task[None] | None = None
        self.space: asyncio.Future[None] | None = None
        self.last_complete: _Transfer | None = None  # newest transfer whose chunks all arrived
        self.pending_bytes = 0  # announced bytes of transfers not yet handed to a message


class DeviceTransfers:
    """The node's device-array machinery: serializer hook, staged sends, chunk reassembly.

    Owns one :class:`Stager` and one :class:`BufferPool`, created on first use (no CuPy
    import at node start) and closed by :meth:`close`.
    """

    def __init__(
        self,
        *,
        buffers: BuffersSection,
        limits: LimitsSection,
        serializer: Serializer,
        log: Any,
        spawn: Callable[[Any, str], asyncio.Task[Any]],
        backend: Any = None,
        devices: Devices | None = None,
        instruments: Instruments | None = None,
    ) -> None:
        self._cfg = buffers
        self.instruments = instruments if instruments is not None else Instruments()
        self._devices = devices  # the node's: whether CUDA works (pinned pool, CuPy backend)
        self._limits = limits
        self._ser = serializer
        self.log = log
        self._spawn = spawn
        self._backend = backend
        self._stager: Stager | None = None
        self._pool: BufferPool | None = None
        self._plan: ContextVar[_Plan | None] = ContextVar("aionet_device_plan", default=None)
        self._lenient = False  # decode undeliverable arrays as None (to read the envelope)
        self._closed = False
        self._rx: dict[str, _PeerRx] = {}
        self._by_id: dict[int, _Transfer] = {}
        # used or dropped transfer ids -> None (handed to a message) or why it was dropped
        self._tombstones: OrderedDict[int, BaseException | None] = OrderedDict()
        self.counts = {  # plain ints on the hot path; stats() copies them out
            "sent_inline": 0,
            "sent_staged": 0,
            "sent_device_frames": 0,
            "chunks_sent": 0,
            "received_inline": 0,
            "received_staged": 0,
            "undeliverable": 0,
            "dropped_transfers": 0,
        }
        serializer.device_hook = self

    # ------------------------------------------------------------------ resources
    @property
    def stager(self) -> Stager:
        if self._stager is None:
            cfg = self._cfg
            chunk = int(cfg.staging_chunk_bytes)
            classes = sorted({c for c in (64 * _KiB, _MiB) if c < chunk} | {chunk})
            pinned: bool | None = {"true": True, "false": False}.get(str(cfg.pinned))
            if pinned is None and self._backend is not None:
                pinned = bool(getattr(self._backend, "on_device", False))
            self._pool = BufferPool(
                size_classes=classes, max_bytes=int(cfg.max_bytes), pinned=pinned, devices=self._devices
            )
            self._stager = Stager(
                backend=self._backend,
                pool=self._pool,
                chunk_bytes=chunk,
                depth=int(cfg.staging_depth),
                host_fallback=bool(cfg.device_host_fallback),
                max_nbytes=self._limits.max_message_bytes,
                devices=self._devices,
                scratch_max_bytes=int(cfg.scratch_max_bytes),
            )
        return self._stager

    @property
    def pool(self) -> BufferPool | None:
        """The staging pool, once a device array was sent or received."""
        return self._pool

    def close(self) -> None:
        self._closed = True
        for peer in list(self._rx):
            self.drop_peer(peer, PeerUnavailable("local node is shutting down"))
        if self._stager is not None:
            self._stager.close()
        if self._pool is not None:
            self._pool.close()

    def stats(self) -> DeviceTransferStats:
        staging = self._stager is not None and self._pool is not None
        return DeviceTransferStats(
            **self.counts,
            incomplete_transfers=sum(len(p.transfers) for p in self._rx.values()),
            incomplete_bytes=sum(p.pending_bytes for p in self._rx.values()),
            backend=self._stager.backend.name if staging else None,  # type: ignore[union-attr]
            pool=self._pool.stats() if staging else None,  # type: ignore[union-attr]
        )

    # ------------------------------------------------------------------ serializer hook
    # ------------------------------------------------------------------ DeviceArrays port
    def is_device_array(self, obj: Any) -> bool:
        return self.stager.is_device_array(obj)

    def to_host(self, obj: Any) -> Any:
        return self.stager.to_host(obj)

    def to_device(self, arr: Any) -> Any:
        return self.stager.to_device(arr)

    def borrow_host(self, obj: Any) -> Any:
        return self.stager.borrow_host(obj)

    def give_back(self, arr: Any) -> None:
        self.stager.give_back(arr)

    def encode(self, obj: Any) -> tuple[int, Any, Any] | None:
        if not is_device_array(obj):
            return None
        plan = self._plan.get()
        if plan is None:
            raise StagingRequired(
                f"{type(obj).__name__} is a device array: it travels in node.send, node.request "
                "and service replies (copy it to the host first to send it any other way)"
            )
        if plan.collect:
            plan.found.setdefault(id(obj), obj)
            return (DEVICE_INLINE, None, [])
        mode, xid = plan.decided.get(id(obj), (DEVICE_INLINE, 0))
        if mode == DEVICE_STAGED:
            plan.referenced = True
            return (DEVICE_STAGED, None, xid)
        meta, frames = self.stager.encode(obj, device_frames=mode == DEVICE_FRAMES)
        return (mode, meta, frames)

    def decode(self, mode: int, meta: Any, data: Any) -> Any:
        if mode == DEVICE_STAGED:
            return self._claim(data)
        try:
            arr = self.stager.decode(meta, data)
        except ProtocolError:
            raise  # hostile header or frames: the connection is closed
        except Exception as exc:  # DeviceUnavailable, or a local failure: not the peer's fault
            if self._lenient:
                return None
            raise TransferFailed(exc) from None
        self.counts["received_inline"] += 1
        return arr

    # ------------------------------------------------------------------ sending
    async def send(self, link: Any, kind: int, fields: list[Any], *, wait_ack: bool = True) -> None:
        """Post ``[kind, *fields]`` on ``link`` with its device arrays planned and staged."""
        plan = _Plan()
        token = self._plan.set(plan)
        try:
            self._ser.dumps(fields, compress=False)  # finds the arrays (output discarded)
        finally:
            self._plan.reset(token)
        plan.collect = False
        stager = self.stager
        conn = getattr(link.current, "conn", None)
        direct = conn is not None and not stager.needs_staging(conn)
        streamed: list[int] = []
        try:
            for key, obj in plan.found.items():
                if direct:
                    plan.decided[key] = (DEVICE_FRAMES, 0)
                    self.counts["sent_device_frames"] += 1
                    continue
                meta = stager.header(obj)
                if meta["nbytes"] < stager.chunk_bytes:
                    self.counts["sent_inline"] += 1
                    continue  # inline: encoded by the hook while the message is serialized
                t0 = time.perf_counter()
                xid = await self._stream(link, obj, meta)
                if (hook := self.instruments.transfer_finished) is not None:
                    hook(link.peer, "send", int(meta["nbytes"]), time.perf_counter() - t0, "staged")
                streamed.append(xid)
                plan.decided[key] = (DEVICE_STAGED, xid)
                self.counts["sent_staged"] += 1
            token = self._plan.set(plan)
            try:
                aw = link.post(kind, fields, wait_ack=wait_ack)
                if aw is not None:
                    await aw
            finally:
                self._plan.reset(token)
        except BaseException as exc:
            if not plan.referenced:  # the message will not come: let the receiver free the arrays
                for xid in streamed:
                    self._post_abort(link, xid)
            if self._closed and isinstance(exc, RuntimeError):  # the pool closed under us
                raise PeerUnavailable(f"{link.peer}: local node is shutting down") from exc
            raise

    async def send_request(self, link: Any, fields: list[Any], reply: asyncio.Future[Any]) -> None:
        """Stage and post a request; stop streaming when ``reply`` fails first (timeout, dead
        peer), so a timeout is not delayed by a long, back-pressured transfer."""
        task = asyncio.ensure_future(self.send(link, REQ, fields))
        try:
            await asyncio.wait((task, reply), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if not task.cancelled() and task.exception() is not None and not reply.done():
            raise task.exception()  # type: ignore[misc]

    async def send_reply(self, link: Any, kind: int, fields: list[Any]) -> None:
        """A service's reply with device arrays (runs as its own task, never on the reader).
        Failures are answered with an error reply so the caller never waits for nothing."""
        try:
            await self.send(link, kind, fields, wait_ack=False)
            return
        except PeerUnavailable:
            return
        except Exception as exc:
            err = [fields[0], _type_name(exc), f"cannot send the reply: {exc}", ""]
        if kind != REP or link.dead is not None:
            return
        with contextlib.suppress(Exception):
            aw = link.post(ERR, err, wait_ack=False)
            if aw is not None:
                await aw

    async def _stream(self, link: Any, obj: Any, meta: dict[str, Any]) -> int:
        xid = secrets.randbits(62) | 1
        loop = asyncio.get_running_loop()
        stream = ChunkStream(self.stager, obj, hand_over=True)
        index = 0
        try:
            async for buf in stream:
                frame = _pool_frame(loop, buf)
                aw = link.post(XFER, [xid, index, meta if index == 0 else None, frame], wait_ack=False)
                del frame  # the link (and the transport) hold it now; its release frees the buffer
                index += 1
                self.counts["chunks_sent"] += 1
                if aw is not None:
                    await aw
        except BaseException:
            if index:
                self._post_abort(link, xid)
            raise
        finally:
            await stream.aclose()
        return xid

    def _post_abort(self, link: Any, xid: int) -> None:
        if link.dead is not None:
            return
        try:
            aw = link.post(XFER, [xid, _ABORT, None, b""], wait_ack=False)
        except Exception:
            return
        if aw is not None:
            self._spawn(_quiet(aw), "aionet-xfer-abort")

    # ------------------------------------------------------------------ receiving
    def on_chunk(self, peer: str, link: Any, env: list[Any]) -> Awaitable[None] | None:
        """A sequenced XFER envelope ``[XFER, seq, ack, xid, index, meta, chunk]`` (already
        deduplicated). Returns an awaitable when reading must pause (feed queue full)."""
        if len(env) != 7 or type(env[3]) is not int or type(env[4]) is not int:
            raise ProtocolError("malformed device array chunk envelope")
        xid, index, meta, chunk = env[3], env[4], env[5], env[6]
        prx = self._rx.get(peer)
        if prx is None:
            prx = self._rx[peer] = _PeerRx()
        if index == _ABORT:
            t = prx.transfers.get(xid)
            if t is not None:
                self._drop(prx, t, DecodeError("transfer aborted by the sender"))
            return None
        if type(chunk) is memoryview:
            view = chunk
        elif type(chunk) in (bytes, bytearray):
            view = memoryview(chunk)
        else:
            raise ProtocolError("device array chunk is not a buffer")
        if index == 0:
            t = self._start(prx, peer, link, xid, meta, view.nbytes)
        else:
            t = prx.transfers.get(xid)
            if t is None:
                if xid in self._tombstones:
                    return None  # the rest of a transfer dropped when a link failed
                raise ProtocolError(f"chunk {index} of unknown device array transfer {xid}")
            if index != t.received or index >= t.nchunks:
                raise ProtocolError(f"device array transfer {xid}: chunk {index} out of order")
            _check_chunk(t.nbytes, t.chunk, index, view.nbytes)
        t.received += 1
        last = t.received == t.nchunks
        if last:
            prx.last_complete = t
        prx.queue.append((t, view, last))
        if prx.feeder is None:
            prx.feeder = self._spawn(self._feed(prx), "aionet-device-rx")
        if len(prx.queue) > self.stager.depth:
            if prx.space is None:
                prx.space = asyncio.get_running_loop().create_future()
            return prx.space
        return None

    def _start(self, prx: _PeerRx, peer: str, link: Any, xid: int, meta: Any, first: int) -> _Transfer:
        if xid in self._by_id or xid in self._tombstones:
            raise ProtocolError(f"device array transfer id {xid} reused")
        if not isinstance(meta, dict) or type(meta.get("nbytes")) is not int or meta["nbytes"] < 0:
            raise DecodeError("device array transfer without a valid header")
        for old in [t for t in prx.transfers.values() if t.rx_id != link.rx_id]:
            self._drop(prx, old, PeerUnavailable(f"{peer}: restarted its stream"))
        limit = self._limits.max_message_bytes
        if prx.pending_bytes + meta["nbytes"] > limit:
            raise FrameTooLarge(
                f"device array transfers from {peer} would hold {prx.pending_bytes + meta['nbytes']} bytes, "
                f"above limits.max_message_bytes ({limit})"
            )
        rx: Receiver | None = None
        error: BaseException | None = None
        try:
            rx = self.stager.receiver(meta)  # validates the header (DecodeError / FrameTooLarge)
        except ProtocolError:
            raise
        except Exception as exc:  # DeviceUnavailable (or a local failure): take the chunks,
            error = exc  # deliver the failure with the message
        t = _Transfer(xid, peer, link.rx_id, meta)
        if t.nchunks < 1:
            raise DecodeError("staged device array transfer without chunks")
        _check_chunk(t.nbytes, t.chunk, 0, first)
        t.rx, t.error = rx, error
        prx.transfers[xid] = t
        self._by_id[xid] = t
        prx.pending_bytes += t.nbytes
        return t

    async def _feed(self, prx: _PeerRx) -> None:
        q = prx.queue
        depth = self.stager.depth
        try:
            while q:
                t, view, last = q[0]
                if t.error is None and not t.dropped and t.rx is not None:
                    try:
                        await t.rx.feed(view)
                        if last:
                            t.array = await t.rx.finish()
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:
                        t.error = exc
                        self.log.warning("device array transfer failed", peer=t.peer, error=repr(exc))
                        with contextlib.suppress(Exception):
                            await t.rx.abort()
                q.popleft()
                del view
                if last:
                    t.finished = True
                    t.rx = None
                    if not t.done.done():
                        t.done.set_result(None)
                if prx.space is not None and len(q) <= depth:
                    if not prx.space.done():
                        prx.space.set_result(None)
                    prx.space = None
        finally:
            prx.feeder = None

    def _claim(self, xid: int) -> Any:
        t = self._by_id.get(xid)
        if t is None:
            if xid in self._tombstones:
                why = self._tombstones[xid]
                if why is None or self._lenient:
                    return None  # a replayed duplicate (dropped after decoding)
                raise TransferFailed(why)
            raise DecodeError(f"message refers to unknown device array transfer {xid}")
        if t.received != t.nchunks:
            raise DecodeError(f"message refers to device array transfer {xid} before all its chunks")
        prx = self._rx[t.peer]
        last = prx.last_complete
        if last is not None and not last.finished:
            raise TransferPending(last.done)  # before claiming anything of this message
        if not t.finished:
            raise TransferPending(t.done)
        if t.error is not None and not self._lenient:
            raise TransferFailed(t.error)
        self._forget(prx, t, None)
        self.counts["received_staged"] += 1
        if (hook := self.instruments.transfer_finished) is not None:
            hook(t.peer, "recv", t.nbytes, time.perf_counter() - t.started, "staged")
        return t.array

    def _forget(self, prx: _PeerRx, t: _Transfer, why: BaseException | None) -> None:
        prx.transfers.pop(t.xid, None)
        if self._by_id.pop(t.xid, None) is not None:
            prx.pending_bytes -= t.nbytes
        self._tombstones[t.xid] = why
        while len(self._tombstones) > _TOMBSTONES:
            self._tombstones.popitem(last=False)

    def _drop(self, prx: _PeerRx, t: _Transfer, why: BaseException) -> None:
        t.dropped = True
        t.array = t.rx = None
        t.finished = True
        if not t.done.done():
            t.done.set_result(None)
        self._forget(prx, t, why)
        self.counts["dropped_transfers"] += 1

    def drop_peer(self, peer: str, why: BaseException) -> None:
        """The link to ``peer`` failed (or the node stops): free its half-received arrays."""
        prx = self._rx.pop(peer, None)
        if prx is None:
            return
        if prx.feeder is not None:
            prx.feeder.cancel()
        for t in list(prx.transfers.values()):
            self._drop(prx, t, why)
        prx.queue.clear()
        if prx.space is not None and not prx.space.done():
            prx.space.set_result(None)

    def settle(
        self,
        exc: DecodeDeferred,
        peer: str,
        link: Any,
        reply: Callable[[int, list[Any]], Any],
        frames: list[Any],
        on_reply: Callable[[int, Any, list[Any], str], None],
    ) -> Awaitable[Any] | None:
        """A message could not be decoded now: return what to wait for before decoding it
        again, or (array not deliverable here) deal with it and return None."""
        if isinstance(exc, TransferPending):
            return exc.wait
        assert isinstance(exc, TransferFailed)
        self._lenient = True
        try:
            env = self._ser.loads(frames)
        finally:
            self._lenient = False
        if type(env) is not list or len(env) < 5 or type(env[0]) is not int or type(env[1]) is not int:
            raise ProtocolError("malformed envelope around a device array")
        kind = env[0]
        if not link.state.on_receive(env[1]):
            return None  # duplicate from a replay
        if type(env[2]) is int and env[2] > link.state.acked:
            link.on_ack(env[2])
        err = exc.error
        self.counts["undeliverable"] += 1
        if kind == SEND:
            self.log.error("device array from peer not delivered", peer=peer, channel=str(env[3])[:200], error=str(err))
        elif kind == REQ:
            reply(ERR, [env[3], _type_name(err), f"cannot receive the request's device array: {err}", ""])
        elif kind == REP:
            on_reply(ERR, env[3], [_type_name(err), f"cannot receive the reply's device array: {err}", ""], peer)
        else:
            raise ProtocolError(f"device array in an envelope of kind {kind}")
        return None


def _check_chunk(nbytes: int, chunk: int, index: int, got: int) -> None:
    expect = min(chunk, nbytes - index * chunk)
    if got != expect:
        raise DecodeError(f"device array chunk of {got} bytes at index {index}, expected {expect}")


def _pool_frame(loop: asyncio.AbstractEventLoop, buf: PooledBuffer) -> memoryview:
    """A frame over ``buf``'s bytes that returns ``buf`` to its pool when the last reference
    to it (link replay buffer, transport, in-process receiver) is gone."""
    view = buf.array[: buf.nbytes]
    weakref.finalize(view, _release_soon, loop, buf).atexit = False
    return memoryview(view)


def _release_soon(loop: asyncio.AbstractEventLoop, buf: PooledBuffer) -> None:
    # may run in any thread (a copy worker dropping the last reference): the pool is not
    # thread-safe, so release on the loop
    try:
        loop.call_soon_threadsafe(_release, buf)
    except RuntimeError:  # loop closed: nobody waits for buffers any more
        _release(buf)


def _release(buf: PooledBuffer) -> None:
    with contextlib.suppress(RuntimeError, ValueError):
        buf.release()


def _type_name(exc: BaseException) -> str:
    t = type(exc)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


async def _quiet(aw: Awaitable[Any]) -> None:
    with contextlib.suppress(Exception):
        await aw
