"""``rdma://host:port``: messages over InfiniBand/RoCE reliable-connected QPs (pyverbs).

**Not run on RDMA hardware here.** This machine's kernel has no RDMA support, so the verbs
calls below were written against the pyverbs API and never executed against a device; what
*is* tested on the CPU is everything above the verbs: the protocol
(:mod:`~aionet.transports.rdma.protocol`: credits, segmentation, reassembly, back-pressure) and
this module's event-driven driver (:class:`RDMAConnection`) against an in-memory verbs double
(``tests/integration/test_rdma.py``). Without a device, ``check_available``, ``listen`` and ``connect``
raise ``TransportUnavailable("no RDMA device: ...")``.

Design:

* Connection setup through a TCP side channel on ``host:port``: both ends exchange QP number,
  PSN, LID, GID, MTU and their receive-buffer count as one JSON line, move their QP to
  RTR/RTS, then exchange a ready byte (so nobody sends before the peer's QP can receive). The
  side channel stays open: its EOF tells us the peer process died.
* Receive buffers (``recv_buffers`` x ``segment_bytes``) come from a
  :class:`~aionet.devices.buffers.BufferPool` registered with the protection domain once, as are
  send buffers; they are recycled, never registered per message.
* Credit-based flow control (see the protocol module): a sender never posts more sends than
  the receiver has buffers, so RNR retries never happen.
* Completions are delivered through a completion channel whose file descriptor is watched by
  the event loop (``loop.add_reader``): no thread, no busy loop when idle. pyverbs does not
  expose that descriptor, so it is located by comparing ``/proc/self/fd`` before and after
  creating the channel (``anon_inode:[infinibandevent]``); if that fails the driver falls back
  to polling with an idle back-off of at most ``idle_poll_ms``.

pyverbs comes from the distribution (``apt-get install -y python3-pyverbs``). When the
running interpreter is not the distribution's Python, the package is loaded from
``/usr/lib/python3/dist-packages/pyverbs`` if its extension ABI matches (only that package,
not the whole directory).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import json
import os
import random
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

from ...devices.buffers import BufferPool, MemoryRegistrar, PooledBuffer
from ...errors import ConfigError, ConnectionClosed, HandshakeError, ProtocolError, TransportError, TransportUnavailable
from ...log import get_logger
from ...stats import ConnectionStats
from ..base import Address, Buffer, Connection, ConnectionHandler, Listener, Message, Transport, map_errors
from ..options import Option, integer, non_negative, number, parse_options, positive, size, string
from .protocol import RdmaProtocol

__all__ = ["Completion", "RDMAConnection", "RDMAListener", "RDMATransport", "VerbsQP", "load_pyverbs"]

log = get_logger("aionet.transports.rdma")

DIST_PYVERBS = Path("/usr/lib/python3/dist-packages/pyverbs")
HANDSHAKE_VERSION = 1


class Completion(NamedTuple):
    wr_id: int
    is_recv: bool
    ok: bool
    byte_len: int
    error: str = ""


class VerbsQP(Protocol):
    """What :class:`RDMAConnection` needs from one connected QP and its completion queue."""

    def post_recv(self, wr_id: int, buf: PooledBuffer) -> None: ...

    def post_send(self, wr_id: int, buf: PooledBuffer, nbytes: int) -> None: ...

    def poll(self, max_entries: int) -> list[Completion]: ...

    def arm(self) -> None:
        """Request a completion-channel event for the next completion."""

    def fileno(self) -> int | None:
        """The completion channel's fd (readable when an event is pending), or None."""

    def ack_event(self) -> None:
        """Consume pending channel events (must not block)."""

    def close(self) -> None: ...


# ---------------------------------------------------------------------------- pyverbs loading
def load_pyverbs() -> Any:
    """Import pyverbs, falling back to the distribution's copy; TransportUnavailable if absent."""
    try:
        return importlib.import_module("pyverbs")
    except ImportError as exc:
        first = exc
    soabi = sysconfig.get_config_var("SOABI") or ""
    init = DIST_PYVERBS / "__init__.py"
    if init.exists() and soabi and any(DIST_PYVERBS.glob(f"*.{soabi}.so")):
        spec = importlib.util.spec_from_file_location("pyverbs", init, submodule_search_locations=[str(DIST_PYVERBS)])
        if spec is not None and spec.loader is not None:
            mod = importlib.util.module_from_spec(spec)
            sys.modules["pyverbs"] = mod
            try:
                spec.loader.exec_module(mod)
                return mod
            except Exception as exc:
                sys.modules.pop("pyverbs", None)
                raise TransportUnavailable(
                    f"no RDMA support: pyverbs from {DIST_PYVERBS} failed to load: {exc}"
                ) from exc
    raise TransportUnavailable(
        "no RDMA support: pyverbs is not importable (install rdma-core's Python bindings: "
        f"apt-get install -y python3-pyverbs; this interpreter's ABI is {soabi or 'unknown'}): {first}"
    ) from first


def list_rdma_devices() -> list[str]:
    """Names of the RDMA devices here; TransportUnavailable naming why there are none."""
    load_pyverbs()
    import pyverbs.device as d

    try:
        devs = d.get_device_list()
    except Exception as exc:  # PyverbsRDMAError (ENOSYS when the kernel has no RDMA support)
        raise TransportUnavailable(
            f"no RDMA device: ibv_get_device_list failed ({exc}); the kernel has no RDMA support "
            "(CONFIG_INFINIBAND) or no RDMA driver is loaded"
        ) from exc
    names = [dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name) for dev in devs]
    if not names:
        raise TransportUnavailable("no RDMA device: ibv_get_device_list() returned no devices (no HCA, no soft-RoCE)")
    return names


# ---------------------------------------------------------------------------- the driver
class RDMAConnection(Connection):
    """An aionet connection over one RC QP, driven by completion events on the event loop."""

    def __init__(
        self,
        qp: VerbsQP,
        pool: BufferPool,
        proto: RdmaProtocol,
        *,
        side_channel: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None,
        max_send_wr: int = 64,
        idle_poll_ms: float = 5.0,
        local_address: str = "",
        peer_address: str = "",
        on_close: Any = None,
    ) -> None:
        self._qp = qp
        self._pool = pool
        self._proto = proto
        self._side = side_channel
        self._max_send_wr = max_send_wr
        self._idle_poll = idle_poll_ms / 1000
        self.local_address = local_address
        self.peer_address = peer_address
        self._on_close = on_close
        self._recv_bufs: dict[int, PooledBuffer] = {}
        self._send_bufs: dict[int, PooledBuffer] = {}
        self._wr = 0
        self._send_waiters: dict[int, asyncio.Future[None]] = {}
        self._recv_event = asyncio.Event()
        self._sent_event = asyncio.Event()
        self._closed = False
        self._failure: BaseException | None = None
        self._fd: int | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._acquiring = False
        self._loop = asyncio.get_running_loop()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Post every receive buffer and start watching completions."""
        seg = self._proto.segment_bytes
        for _ in range(self._proto.recv_buffers):
            buf = await self._pool.acquire(seg)
            wr = self._next_wr()
            self._recv_bufs[wr] = buf
            self._qp.post_recv(wr, buf)
        fd = self._qp.fileno()
        if fd is not None:
            self._fd = fd
            self._qp.arm()
            self._loop.add_reader(fd, self._on_readable)
        else:
            self._tasks.append(self._loop.create_task(self._poll_loop()))
        if self._side is not None:
            self._tasks.append(self._loop.create_task(self._watch_side()))

    def _next_wr(self) -> int:
        self._wr += 1
        return self._wr

    def _on_readable(self) -> None:
        try:
            self._qp.ack_event()
            self._qp.arm()  # re-arm *before* draining, so nothing completes unseen
        except Exception as exc:
            self._fail(TransportError(f"completion channel failed: {exc}"))
            return
        self._progress()

    async def _poll_loop(self) -> None:
        delay = 0.0
        while not self._closed:
            delay = 0.0 if self._progress() else min(self._idle_poll, max(delay * 2, 50e-6))
            await asyncio.sleep(delay)

    async def _watch_side(self) -> None:
        assert self._side is not None
        reader = self._side[0]
        try:
            while await reader.read(4096):
                pass  # the side channel carries nothing after the handshake
        except (ConnectionError, OSError):
            pass
        if not self._closed:
            self._progress()  # data the peer sent before dying is already in our CQ
            if not self._proto.fin_received:
                self._fail(ConnectionClosed(f"RDMA peer {self.peer_address} went away (side channel closed)"))
            else:
                self._recv_event.set()

    # ------------------------------------------------------------------ completions
    def _progress(self) -> bool:
        """Drain completions, feed the protocol, post what credits allow. True if work done."""
        if self._closed and self._failure is not None:
            return False
        did = False
        try:
            while True:
                wcs = self._qp.poll(32)
                if not wcs:
                    break
                did = True
                for wc in wcs:
                    self._completion(wc)
            self._pump()
        except ProtocolError as exc:
            log.warning("rdma protocol violation; closing", peer=self.peer_address, error=str(exc))
            self._fail(exc)
        except Exception as exc:
            self._fail(TransportError(f"RDMA failure: {exc!r}"))
        return did

    def _completion(self, wc: Completion) -> None:
        if wc.is_recv:
            buf = self._recv_bufs.get(wc.wr_id)
            if buf is None:
                raise TransportError(f"completion for unknown receive wr {wc.wr_id}")
            if not wc.ok:
                raise TransportError(f"RDMA receive failed: {wc.error}")
            self._proto.on_receive(memoryview(buf.array)[: wc.byte_len])
            if not self._closed:
                self._qp.post_recv(wc.wr_id, buf)  # payload copied out: recycle at once
            self._recv_event.set()
        else:
            buf = self._send_bufs.pop(wc.wr_id, None)
            if buf is not None:
                buf.release()
            if not wc.ok:
                raise TransportError(f"RDMA send failed: {wc.error}")
            self._sent_event.set()

    def _pump(self) -> None:
        """Post data, then a credit update, while credits, send slots and buffers allow."""
        proto = self._proto
        while len(self._send_bufs) < self._max_send_wr:
            if not (proto.can_send_data() or proto.wants_credit_update()):
                return
            buf = self._pool.try_acquire(proto.segment_bytes)
            if buf is None:
                self._wait_for_buffer()
                return
            view = memoryview(buf.array)[: proto.segment_bytes]
            r = proto.fill(view)
            if r is not None:
                n, done = r
            else:
                n, done = proto.fill_control(view), None
                if n is None:
                    buf.release()
                    return
            wr = self._next_wr()
            self._send_bufs[wr] = buf
            self._qp.post_send(wr, buf, n)
            if done is not None:
                fut = self._send_waiters.pop(done, None)
                if fut is not None and not fut.done():
                    fut.set_result(None)

    def _wait_for_buffer(self) -> None:
        if self._acquiring:
            return
        self._acquiring = True

        async def wait() -> None:
            try:
                buf = await self._pool.acquire(self._proto.segment_bytes)
                buf.release()
            finally:
                self._acquiring = False
            self._progress()

        self._tasks.append(self._loop.create_task(wait()))

    # ------------------------------------------------------------------ the contract
    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed or self._proto.fin_sent:
            raise ConnectionClosed("RDMA connection is closed") from self._failure

    async def send(self, frames: Sequence[Buffer]) -> None:
        self._check_open()
        msg_id = self._proto.queue(frames)
        fut = self._loop.create_future()
        self._send_waiters[msg_id] = fut
        self._pump()
        await fut  # resolves once the last byte is in a registered send buffer

    async def recv(self) -> Message:
        while True:
            m = self._proto.next_message()
            if m is not None:
                self._pump()  # reading may release withheld credits
                return list(m)
            if self._closed or self._proto.fin_received:
                raise ConnectionClosed("RDMA connection closed") from self._failure
            self._recv_event.clear()
            await self._recv_event.wait()

    async def recv_many(self) -> list[Message]:
        out = [await self.recv()]
        while (m := self._proto.next_message()) is not None:
            out.append(list(m))
        self._pump()
        return out

    def stats(self) -> ConnectionStats:
        p = self._proto
        extra = {"credits": p.credits, "outstanding_sends": len(self._send_bufs), **p.counts}
        return ConnectionStats(local=self.local_address, remote=self.peer_address, extra=extra)

    async def close(self) -> None:
        if self._closed:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                while self._proto.has_pending_data and self._failure is None:
                    self._sent_event.clear()
                    await self._sent_event.wait()
                buf = await self._pool.acquire(self._proto.segment_bytes)
                n = self._proto.fill_fin(memoryview(buf.array)[: self._proto.segment_bytes])
                if n is None:
                    buf.release()
                else:
                    wr = self._next_wr()
                    self._send_bufs[wr] = buf
                    self._qp.post_send(wr, buf, n)
                while self._send_bufs and self._failure is None:
                    self._sent_event.clear()
                    await self._sent_event.wait()
        self._teardown(None)

    def abort(self) -> None:
        self._teardown(ConnectionClosed("RDMA connection aborted"))

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
        self._teardown(exc)

    def _teardown(self, exc: BaseException | None) -> None:
        if self._closed:
            return
        self._closed = True
        if exc is not None and self._failure is None:
            self._failure = exc
        if self._fd is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._fd)
        try:
            self._qp.close()  # destroys the QP first: no DMA into buffers we give back
        except Exception as e:
            log.warning("closing RDMA QP failed", error=repr(e))
        for buf in [*self._recv_bufs.values(), *self._send_bufs.values()]:
            buf.release()
        self._recv_bufs.clear()
        self._send_bufs.clear()
        err = ConnectionClosed("RDMA connection closed")
        for fut in self._send_waiters.values():
            if not fut.done():
                fut.set_exception(err)
                fut.exception()
        self._send_waiters.clear()
        current = asyncio.current_task()
        for t in self._tasks:
            if t is not current:
                t.cancel()
        if self._side is not None:
            self._side[1].close()
        self._recv_event.set()
        self._sent_event.set()
        if self._on_close is not None:
            self._on_close(self)


# ---------------------------------------------------------------------------- pyverbs binding
class _PDRegistrar:
    """Registers pool buffers as memory regions of one protection domain."""

    def __init__(self, pd: Any, access: int) -> None:
        self._pd = pd
        self._access = access

    def register(self, memory: Any) -> Any:
        from pyverbs.mr import MR

        return MR(self._pd, int(memory.nbytes), self._access, address=int(memory.ctypes.data))

    def deregister(self, region: Any) -> None:
        region.close()


def _find_new_event_fd(before: set[str]) -> int | None:
    try:
        after = set(os.listdir("/proc/self/fd"))
    except OSError:
        return None
    for name in sorted(after - before, key=int):
        try:
            if "infinibandevent" in os.readlink(f"/proc/self/fd/{name}"):
                return int(name)
        except OSError:
            continue
    return None


class _PyverbsQP:
    """One RC QP with its own CQ and completion channel (unverified on hardware, see above)."""

    def __init__(self, dev: _Device, *, max_send_wr: int, max_recv_wr: int) -> None:
        from pyverbs.cq import CQ, CompChannel
        from pyverbs.qp import QP, QPCap, QPInitAttr

        e = dev.enums
        self._e = e
        self._dev = dev
        try:
            before = set(os.listdir("/proc/self/fd"))
        except OSError:
            before = set()
        self.channel = CompChannel(dev.ctx)
        self._fd = _find_new_event_fd(before)
        if self._fd is not None:
            os.set_blocking(self._fd, False)  # get_cq_event must never block the loop
        self.cq = CQ(dev.ctx, max_send_wr + max_recv_wr + 1, None, self.channel, 0)
        cap = QPCap(max_send_wr=max_send_wr, max_recv_wr=max_recv_wr, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=1)
        self.qp = QP(dev.pd, init)
        self.psn = random.getrandbits(24)
        self._recv_wr: set[int] = set()

    def local_info(self) -> dict[str, Any]:
        return {
            "qpn": self.qp.qp_num,
            "psn": self.psn,
            "lid": self._dev.lid,
            "gid": self._dev.gid,
            "mtu": self._dev.mtu,
        }

    def connect(self, peer: dict[str, Any]) -> None:
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.qp import QPAttr

        e, dev = self._e, self._dev
        attr = QPAttr(qp_state=e.IBV_QPS_INIT)
        attr.port_num = dev.port
        attr.pkey_index = 0
        attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        self.qp.to_init(attr)
        attr = QPAttr(qp_state=e.IBV_QPS_RTR)
        attr.path_mtu = min(int(peer["mtu"]), dev.mtu)
        attr.dest_qp_num = int(peer["qpn"])
        attr.rq_psn = int(peer["psn"])
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = 12
        gr = None
        if peer.get("gid") and peer["gid"] != "0000:0000:0000:0000:0000:0000:0000:0000":
            dgid = GID()
            dgid.gid = peer["gid"]
            gr = GlobalRoute(dgid=dgid, sgid_index=dev.gid_index, hop_limit=64)
        attr.ah_attr = AHAttr(dlid=int(peer["lid"]), port_num=dev.port, is_global=1 if gr else 0, gr=gr)
        self.qp.to_rtr(attr)
        attr.qp_state = e.IBV_QPS_RTS
        attr.sq_psn = self.psn
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = 7  # credits make RNR impossible; retry anyway rather than die
        attr.max_rd_atomic = 1
        self.qp.to_rts(attr)

    def post_recv(self, wr_id: int, buf: PooledBuffer) -> None:
        from pyverbs.wr import SGE, RecvWR

        region = buf.region(self._dev.registrar)
        sge = SGE(buf.address, buf.capacity, region.lkey)
        self._recv_wr.add(wr_id)
        self.qp.post_recv(RecvWR(wr_id=wr_id, num_sge=1, sg=[sge]))

    def post_send(self, wr_id: int, buf: PooledBuffer, nbytes: int) -> None:
        from pyverbs.wr import SGE, SendWR

        region = buf.region(self._dev.registrar)
        sge = SGE(buf.address, nbytes, region.lkey)
        wr = SendWR(wr_id=wr_id, opcode=self._e.IBV_WR_SEND, num_sge=1, sg=[sge], send_flags=self._e.IBV_SEND_SIGNALED)
        self.qp.post_send(wr)

    def poll(self, max_entries: int) -> list[Completion]:
        n, wcs = self.cq.poll(max_entries)
        out: list[Completion] = []
        for wc in wcs[:n]:
            ok = wc.status == self._e.IBV_WC_SUCCESS
            is_recv = wc.wr_id in self._recv_wr if not ok else bool(wc.opcode & self._e.IBV_WC_RECV)
            out.append(Completion(wc.wr_id, is_recv, ok, wc.byte_len, "" if ok else f"wc status {wc.status}"))
        return out

    def arm(self) -> None:
        self.cq.req_notify()

    def fileno(self) -> int | None:
        return self._fd

    def ack_event(self) -> None:
        events = 0
        while True:
            try:
                self.channel.get_cq_event(self.cq)  # fd is non-blocking: raises when drained
            except Exception:
                break
            events += 1
        if events:
            self.cq.ack_events(events)

    def close(self) -> None:
        for obj in (self.qp, self.cq, self.channel):
            with contextlib.suppress(Exception):
                obj.close()


class _Device:
    """An opened RDMA device: context, protection domain, port attributes, registrar."""

    def __init__(self, name: str, port: int, gid_index: int) -> None:
        import pyverbs.enums as enums
        from pyverbs.device import Context
        from pyverbs.pd import PD

        self.enums = enums
        self.ctx = Context(name=name)
        self.pd = PD(self.ctx)
        self.port = port
        self.gid_index = gid_index
        pattr = self.ctx.query_port(port)
        self.lid = int(pattr.lid)
        self.mtu = int(pattr.active_mtu)
        try:
            self.gid = str(self.ctx.query_gid(port, gid_index))
        except Exception:
            self.gid = ""
        access = enums.IBV_ACCESS_LOCAL_WRITE | enums.IBV_ACCESS_REMOTE_WRITE | enums.IBV_ACCESS_REMOTE_READ
        self.registrar: MemoryRegistrar = _PDRegistrar(self.pd, access)

    def close(self) -> None:
        for obj in (self.pd, self.ctx):
            with contextlib.suppress(Exception):
                obj.close()


# ---------------------------------------------------------------------------- transport
class RDMAListener(Listener):
    def __init__(self, server: asyncio.base_events.Server, url: str) -> None:
        self._server = server
        self._url = url

    @property
    def address(self) -> str:
        return self._url

    async def close(self) -> None:
        self._server.close()
        with contextlib.suppress(Exception):
            await self._server.wait_closed()


_POSITIVE = "must be positive"

#: ``[transport] rdma = {...}``; see RDMATransport.
SCHEMA: MappingProxyType[str, Option] = MappingProxyType(
    {
        "device": Option("", string),
        "port_num": Option(1, integer, positive, _POSITIVE),
        "gid_index": Option(0, integer, non_negative, "must not be negative"),
        "recv_buffers": Option(64, integer, positive, _POSITIVE),
        "segment_bytes": Option(64 << 10, size, positive, _POSITIVE),
        "max_send_wr": Option(64, integer, positive, _POSITIVE),
        "pool_bytes": Option(64 << 20, size, positive, _POSITIVE),
        "recv_queue_bytes": Option(64 << 20, size, positive, _POSITIVE),
        "idle_poll_ms": Option(5.0, number, non_negative, "must not be negative"),
        "handshake_timeout": Option(5.0, number, positive, _POSITIVE),
    }
)


class RDMATransport(Transport):
    """``rdma://host:port`` (the port is the TCP side channel used for connection setup).

    Options (``[transport] rdma = {...}``): ``device`` (default: first), ``port_num`` (1),
    ``gid_index`` (0; RoCE v2 usually needs the index of the IPv4-mapped GID), ``recv_buffers``
    (64), ``segment_bytes`` (65536), ``max_send_wr`` (64), ``pool_bytes`` (64 MiB),
    ``recv_queue_bytes`` (64 MiB), ``idle_poll_ms`` (5), ``handshake_timeout`` (5 s).
    """

    schemes = ("rdma",)

    def __init__(self, options: dict[str, Any] | None = None, limits: Any = None) -> None:
        super().__init__(options, limits)
        o = self.options = parse_options("rdma", SCHEMA, self.options)
        self._device_name: str = o["device"]
        self._port_num: int = o["port_num"]
        self._gid_index: int = o["gid_index"]
        self._recv_buffers: int = o["recv_buffers"]
        self._segment: int = o["segment_bytes"]
        self._max_send_wr: int = o["max_send_wr"]
        self._pool_bytes: int = o["pool_bytes"]
        self._recv_queue: int = o["recv_queue_bytes"]
        self._idle_poll_ms: float = o["idle_poll_ms"]
        self._dev: _Device | None = None
        self._pool: BufferPool | None = None
        self._shared_pool: BufferPool | None = None
        self._conns: set[RDMAConnection] = set()

    def use_pool(self, pool: BufferPool) -> None:
        """Register and use ``pool`` (the node's staging pool) instead of a pool of our own,
        so one set of pinned buffers serves both GPU staging and RDMA. Call before the first
        listen/connect; the pool needs a size class of exactly ``segment_bytes``."""
        if pool is self._shared_pool:
            return
        if self._dev is not None:
            raise RuntimeError("rdma: use_pool() must be called before the device is opened")
        if self._segment not in pool.size_classes:
            raise ConfigError(
                f"rdma: the shared buffer pool has no size class of segment_bytes ({self._segment}); "
                f"its classes: {list(pool.size_classes)}"
            )
        self._shared_pool = pool

    @classmethod
    def check_available(cls) -> None:
        list_rdma_devices()

    def _ensure_device(self) -> tuple[_Device, BufferPool]:
        if self._dev is None:
            names = list_rdma_devices()
            name = self._device_name or names[0]
            if name not in names:
                raise TransportUnavailable(f"no RDMA device named {name!r}; present: {', '.join(names)}")
            try:
                dev = _Device(name, self._port_num, self._gid_index)
            except Exception as exc:
                raise TransportUnavailable(f"no usable RDMA device: opening {name!r} failed: {exc}") from exc
            pool = self._shared_pool or BufferPool(
                size_classes=(self._segment,), max_bytes=max(self._pool_bytes, self._segment), pinned=False
            )
            pool.add_registrar(dev.registrar)
            self._dev, self._pool = dev, pool
        assert self._pool is not None
        return self._dev, self._pool

    async def _setup(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, local: str, peer: str, timeout: float
    ) -> RDMAConnection:
        dev, pool = self._ensure_device()
        vqp = _PyverbsQP(dev, max_send_wr=self._max_send_wr, max_recv_wr=self._recv_buffers)
        try:
            mine = {
                "v": HANDSHAKE_VERSION,
                "recv_buffers": self._recv_buffers,
                "segment_bytes": self._segment,
                **vqp.local_info(),
            }
            async with asyncio.timeout(timeout):
                writer.write(json.dumps(mine).encode() + b"\n")
                await writer.drain()
                line = await reader.readline()
                try:
                    theirs = json.loads(line)
                    if theirs.get("v") != HANDSHAKE_VERSION or int(theirs["segment_bytes"]) != self._segment:
                        raise HandshakeError(f"RDMA handshake mismatch: {theirs!r:.200}")
                except (ValueError, KeyError, TypeError) as exc:
                    raise HandshakeError(f"bad RDMA handshake from {peer}: {exc}") from None
                proto = RdmaProtocol(
                    recv_buffers=self._recv_buffers,
                    peer_recv_buffers=int(theirs["recv_buffers"]),
                    segment_bytes=self._segment,
                    max_message_bytes=self.limits.max_message_bytes,
                    max_frames=self.limits.max_frames,
                    recv_queue_bytes=self._recv_queue,
                )
                conn = RDMAConnection(
                    vqp,
                    pool,
                    proto,
                    side_channel=(reader, writer),
                    max_send_wr=self._max_send_wr,
                    idle_poll_ms=self._idle_poll_ms,
                    local_address=local,
                    peer_address=peer,
                    on_close=self._conns.discard,
                )
                await conn.start()  # receives posted before the QP can receive
                vqp.connect(theirs)
                writer.write(b"R")
                await writer.drain()
                if await reader.readexactly(1) != b"R":
                    raise HandshakeError("RDMA peer did not confirm readiness")
        except BaseException:
            vqp.close()
            writer.close()
            raise
        self._conns.add(conn)
        return conn

    async def listen(self, url: str, handler: ConnectionHandler) -> Listener:
        addr = Address.parse(url)
        self._ensure_device()
        timeout: float = self.options["handshake_timeout"]

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peer = writer.get_extra_info("peername")
            try:
                conn = await self._setup(reader, writer, url, f"rdma://{peer[0]}:{peer[1]}", timeout)
            except Exception as exc:
                log.warning("RDMA connection setup failed", peer=str(peer), error=str(exc))
                return
            await handler(conn)

        with map_errors({OSError: lambda e: TransportError(f"cannot listen on {url}: {e}")}):
            server = await asyncio.start_server(on_client, addr.host or "0.0.0.0", addr.port or 0)
        port = server.sockets[0].getsockname()[1]
        return RDMAListener(server, Address("rdma", addr.host, port, "").url())

    async def connect(self, url: str, *, timeout: float | None = None) -> Connection:
        addr = Address.parse(url)
        self._ensure_device()
        timeout = timeout if timeout is not None else 5.0
        with map_errors({OSError: lambda e: TransportError(f"cannot connect to {url}: {e!r}")}):  # timeouts too
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(addr.host, addr.port)
        local = writer.get_extra_info("sockname")
        return await self._setup(reader, writer, f"rdma://{local[0]}:{local[1]}", url, timeout)

    async def aclose(self) -> None:
        for c in list(self._conns):
            await c.close()
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._dev is not None:
            self._dev.close()
            self._dev = None
