"""``ucx://host:port``: messages over UCX through ucxx (optional extra: ``pip install 'aionet[ucx]'``).

UCX picks the fabric itself (InfiniBand, RoCE, shared memory, CUDA IPC, TCP); on a machine
without RDMA it runs over TCP. ``UCX_TLS`` (or the ``tls`` option) restricts the choice, e.g.
``tls = "tcp"`` as CI does.

Wire: one aionet message = one ucxx ``send_multi`` of ``[kind] + frames`` on the endpoint's
tag, where ``kind`` is a one-byte frame (message / FIN). The kind frame lets zero-frame messages
exist (ucxx cannot send an empty list) and carries the orderly close: ``close()`` sends FIN
after everything already sent, so the peer reads every message and then ``ConnectionClosed``.

Device frames go **out of line**: the ``send_multi`` carries a layout (where and how large each
frame is) and the host frames, and each device frame follows as its own tagged ``send`` that
the receiver posts into a device buffer it allocated at the announced size. On an H200
(2026-11-28, ``benchmarks/ucx_frames.py``) ucxx's ``recv_multi`` moved CuPy frames at
0.35 GB/s where a tagged ``recv`` into a buffer sized ahead reached 25.6 GB/s at 64 MiB and
100 GB/s at 256 MiB (CUDA IPC). ``tagged_frame_bytes`` sends host frames that large the same way.

Receiving: one reader task per connection keeps a single ``recv_multi`` posted and queues
complete messages, so ``recv_many`` returns everything already received. It stops posting while
``max_queued_bytes`` are unread; large messages (above UCX's rendezvous threshold) then stay at
the sender, whose ``send`` blocks: that is the back-pressure. Small (eager) messages are
buffered by UCX itself and are not bounded by this.

Listening: ucxx (0.52) cannot bind a listener to one host; its socket accepts on every
interface. The listener enforces the host per connection instead: UCX reports each accepted
endpoint's local and remote address (``ucp_ep_query``), a connection that arrived on an address
other than the requested host is aborted before aionet sees it, and the peer is labelled with
its real address, so it counts as local (for a node without a token) only when it is. A context
created for a loopback listener also limits UCX's own TCP data listeners to the loopback device
(``UCX_NET_DEVICES``, unless set), so nothing else of the process listens on a routable
address; and ``CM_REUSEADDR`` is on (unless set) so a stopped listener's port can be bound again
at once instead of after TIME_WAIT.

Device memory: when UCX was built with CUDA support and CUDA works, frames may be CuPy arrays
and arrive as device buffers (``moves_device_memory`` is True on such connections), so GPU
staging is skipped.

ucxx keeps **one context per process**, bound to the event loop it was created on (its
notifier thread completes requests on that loop). Transports in one process therefore share
it through :class:`_SharedUCX`, the one piece of process-wide state in aionet, which mirrors
ucxx's own: it creates the context on first use (with ``enable_python_future`` so idle
connections do not spin the CPU), and resets it when the last transport using it closes, so a
later event loop (a new test, a new ``asyncio.run``) can start afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import socket
import struct
import sys
import weakref
from collections import deque
from collections.abc import Awaitable, Sequence
from types import MappingProxyType
from typing import Any

from ..config import LimitsSection
from ..errors import (
    ConnectionClosed,
    FrameTooLarge,
    ProtocolError,
    TooManyFrames,
    TransportError,
    TransportUnavailable,
)
from ..log import get_logger
from ..stats import ConnectionStats
from .base import Address, Buffer, Connection, ConnectionHandler, Listener, Message, Transport, map_errors
from .options import Option, boolean, parse_options, positive, size, string, table

__all__ = ["UCXConnection", "UCXListener", "UCXTransport"]

log = get_logger("aionet.transports.ucx")

KIND_MSG = b"\x01"
KIND_FIN = b"\x02"
KIND_BATCH = b"\x03"  # [KIND_BATCH, frame counts (uint32 each), *frames of every message]
KIND_SPLIT = b"\x04"  # [KIND_SPLIT, layout, *inline frames]; out-of-line frames follow, tagged
_INLINE, _OOL_HOST, _OOL_DEVICE = 0, 1, 2  # where a frame of a KIND_SPLIT message travels
_LAYOUT = struct.Struct("<BQ")  # per frame: where, nbytes
# The tag of out-of-line frames, hashed with the endpoint's own by ucxx. An int, since str hashes
# differ between processes.
_OOL_TAG = 0x616E6574
_SMALL = 64 << 10  # messages below this are copied when queued, so the caller may reuse them
_BATCH_BYTES = 4 << 20  # at most this much (or one larger message) per ucxx send
_BATCH_MESSAGES = 1024
_HIGH_WATER = 4 << 20  # queued outgoing bytes above which write_nowait asks the caller to wait


def _import_ucxx() -> Any:
    # UCX warns on stderr about variables ucxx itself sets; ucxx reads the environment at
    # import, so the default must be in place before that (a user's setting wins).
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    try:
        import ucxx
    except ImportError as exc:
        raise TransportUnavailable(f"ucx: ucxx is not installed (pip install 'aionet[ucx]'): {exc}") from exc
    except Exception as exc:  # libucx missing or too old: ucxx raises at import
        raise TransportUnavailable(f"ucx: ucxx failed to load: {exc!r}") from exc
    return ucxx


class _SharedUCX:
    """The process's ucxx context: which loop it is bound to and which transports use it."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.users: weakref.WeakSet[UCXTransport] = weakref.WeakSet()

    def acquire(self, user: UCXTransport, options: dict[str, Any], *, loopback_only: bool = False) -> Any:
        ucxx = _import_ucxx()
        loop = asyncio.get_running_loop()
        if self.loop is not None and self.loop is not loop:
            live = [u for u in self.users if u is not user]
            if live and not self.loop.is_closed():
                raise TransportUnavailable(
                    "ucx: ucxx keeps one context per process, bound to one event loop, and another "
                    "running loop is using it"
                )
            self._reset(ucxx)
        if self.loop is None:
            ucx_opts = {str(k).upper(): str(v) for k, v in options.get("ucx_options", {}).items()}
            if options.get("tls"):
                ucx_opts["TLS"] = str(options["tls"])
            _context_defaults(ucx_opts, loopback_only=loopback_only)
            try:
                ucxx.init(options=ucx_opts, progress_mode="thread", enable_python_future=True)
            except RuntimeError:
                pass  # someone else (user code) initialised ucxx already: share it
            except Exception as exc:
                raise TransportUnavailable(f"ucx: cannot initialise UCX: {exc!r}") from exc
            self.loop = loop
        self.users.add(user)
        return ucxx

    def release(self, user: UCXTransport) -> None:
        self.users.discard(user)
        if not self.users and self.loop is not None:
            ucxx = _import_ucxx()
            self._reset(ucxx)

    def _reset(self, ucxx: Any) -> None:
        try:
            ucxx.reset()
            self.loop = None
        except Exception as exc:  # endpoints still referenced somewhere: keep it, try later
            log.warning("ucx context could not be reset yet", error=str(exc)[:300])


_SHARED = _SharedUCX()


def _context_defaults(ucx_opts: dict[str, str], *, loopback_only: bool) -> None:
    """UCX settings aionet needs unless the user chose otherwise (in ``ucx_options`` or UCX_*).

    CM_REUSEADDR: without it, a listener's port stays busy for TIME_WAIT (about a minute)
    after a clean stop whenever this side closed an accepted connection first, so a restarted
    node cannot take its port back. NET_DEVICES: UCX's TCP transport opens a data listener on
    every network device; when the context is created for a loopback listener, restrict it to
    the loopback device so nothing of this process listens on a routable address."""
    if not any(k in ucx_opts for k in ("CM_REUSEADDR", "TCP_CM_REUSEADDR")) and not any(
        k in os.environ for k in ("UCX_CM_REUSEADDR", "UCX_TCP_CM_REUSEADDR")
    ):
        ucx_opts["CM_REUSEADDR"] = "y"
    if loopback_only and "NET_DEVICES" not in ucx_opts and "UCX_NET_DEVICES" not in os.environ:
        ucx_opts["NET_DEVICES"] = ",".join(_loopback_devices())


def _loopback_devices() -> list[str]:
    """Names of the loopback network interfaces (IFF_LOOPBACK), ``lo`` where unknown."""
    names = []
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir("/sys/class/net")):
            with contextlib.suppress(OSError, ValueError), open(f"/sys/class/net/{name}/flags") as f:
                if int(f.read().strip(), 16) & 0x8:  # IFF_LOOPBACK
                    names.append(name)
    return names or ["lo"]


class _EpQuery:
    """``ucp_ep_query`` through ctypes: the socket addresses of an accepted endpoint.

    ucxx does not say who connected, nor on which local address, and (0.52) cannot bind a
    listener to one host: it always listens on every interface. Asking UCX for the endpoint's
    addresses is what lets a listener refuse connections that arrived on another address and
    label a peer local only when its address proves it. ``None`` where UCX cannot be asked."""

    _FIELDS = (1 << 1) | (1 << 2)  # UCP_EP_ATTR_FIELD_LOCAL_SOCKADDR | _REMOTE_SOCKADDR
    _LOCAL_OFF = 8 + 32  # after field_mask and name[UCP_ENTITY_NAME_MAX]
    _REMOTE_OFF = _LOCAL_OFF + 128  # sizeof(struct sockaddr_storage)

    def __init__(self) -> None:
        import ctypes

        self._ctypes = ctypes
        self._fn: Any = None
        for name in ("libucp.so.0", "libucp.so"):  # already loaded by ucxx: dlopen finds it by soname
            with contextlib.suppress(OSError, AttributeError):
                fn = ctypes.CDLL(name).ucp_ep_query
                fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
                fn.restype = ctypes.c_int
                self._fn = fn
                break

    @property
    def available(self) -> bool:
        return self._fn is not None

    def addresses(self, ep: Any) -> tuple[tuple[str, int], tuple[str, int]] | None:
        """(local, remote) (ip, port) of ``ep``, or None where UCX does not report them."""
        if self._fn is None:
            return None
        ct = self._ctypes
        buf = (ct.c_uint8 * 1024)()  # larger than ucp_ep_attr_t; UCX writes only the asked fields
        ct.c_uint64.from_buffer(buf).value = self._FIELDS
        try:
            if self._fn(ep.ucp_endpoint, buf) != 0:
                return None
        except Exception:
            return None
        raw = bytes(buf)
        local, remote = _sockaddr(raw, self._LOCAL_OFF), _sockaddr(raw, self._REMOTE_OFF)
        return (local, remote) if local is not None and remote is not None else None


def _sockaddr(raw: bytes, off: int) -> tuple[str, int] | None:
    family = int.from_bytes(raw[off : off + 2], sys.byteorder)  # sa_family_t, host order
    port = int.from_bytes(raw[off + 2 : off + 4], "big")
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[off + 4 : off + 8]), port
    if family == socket.AF_INET6:
        ip = ipaddress.IPv6Address(raw[off + 8 : off + 24])
        return str(ip.ipv4_mapped or ip), port
    return None


def _is_cancel(exc: BaseException) -> bool:
    return type(exc).__name__ in ("UCXCanceled", "UCXCanceledError", "UCXXCanceledError")


class UCXConnection(Connection):
    """One ucxx endpoint as an aionet connection."""

    def __init__(
        self,
        ep: Any,
        *,
        local: str,
        peer: str,
        max_queued_bytes: int,
        device: bool,
        limits: LimitsSection | None = None,
        tagged_frame_bytes: int = 0,
    ) -> None:
        self._ep = ep
        self._limits = limits or LimitsSection()
        self._tagged = tagged_frame_bytes  # host frames this large go out of line (0: none)
        self.local_address = local
        self.peer_address = peer
        self.moves_device_memory = device  # type: ignore[misc]  # per connection: depends on UCX build
        self._max_queued = max_queued_bytes
        self._queue: deque[Message] = deque()
        self._queued_bytes = 0
        self._have_data = asyncio.Event()
        self._space = asyncio.Event()
        self._space.set()
        self._eof = False
        self._closed = False
        self._failure: BaseException | None = None
        self._reader = asyncio.get_running_loop().create_task(self._read_loop())
        self._reader.add_done_callback(_consume)
        # Outgoing: one sender task takes everything queued and sends it as one ucxx message:
        # each ucxx send costs a completion through the progress thread, so sending queued
        # small messages together is what makes small-message rates tolerable.
        # (frames, bytes, done, has out-of-line frames)
        self._outq: deque[tuple[list[Any], int, asyncio.Future[None] | None, bool]] = deque()
        self._out_bytes = 0
        self._sender: asyncio.Task[None] | None = None
        self._room: list[asyncio.Future[None]] = []  # writers waiting for the queue to drain

    async def _read_loop(self) -> None:
        try:
            while True:
                if self._queued_bytes > self._max_queued:
                    self._space.clear()
                    await self._space.wait()
                bufs = await self._ep.recv_multi()
                if not bufs:
                    raise ProtocolError("ucx: empty message (no kind frame)")
                kind = bytes(memoryview(bufs[0]))
                if kind == KIND_FIN:
                    self._eof = True
                    break
                if kind == KIND_MSG:
                    frames: Message = [_own(b) for b in bufs[1:]]
                    self._queue.append(frames)
                    self._queued_bytes += sum(_nbytes(f) for f in frames)
                elif kind == KIND_BATCH:
                    self._unbatch(bufs)
                elif kind == KIND_SPLIT:
                    frames = await self._recv_split(bufs)
                    self._queue.append(frames)
                    self._queued_bytes += sum(_nbytes(f) for f in frames)
                else:
                    raise ProtocolError(f"ucx: unknown message kind {kind!r}; closing")
                self._have_data.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, ProtocolError):  # bad input from the peer: one clear line
                log.warning("ucx: bad message from peer; connection closed", peer=self.peer_address, error=str(exc))
            elif not self._closed and not _is_cancel(exc):
                log.debug("ucx receive ended", peer=self.peer_address, error=repr(exc))
            self._failure = exc
        finally:
            self._eof = True
            self._have_data.set()

    # ------------------------------------------------------------------ contract
    @property
    def closed(self) -> bool:
        return self._closed

    def _ended(self) -> ConnectionClosed:
        err = ConnectionClosed(f"ucx connection to {self.peer_address} closed")
        err.__cause__ = self._failure
        return err

    def _unbatch(self, bufs: list[Any]) -> None:
        counts = memoryview(bufs[1]).cast("B")
        if len(counts) % 4:
            raise ProtocolError("ucx: malformed batch header; closing")
        sizes = struct.unpack(f"<{len(counts) // 4}I", counts)
        if sum(sizes) != len(bufs) - 2 or not sizes:
            raise ProtocolError("ucx: batch header does not match its frames; closing")
        i = 2
        for n in sizes:
            frames: Message = [_own(b) for b in bufs[i : i + n]]
            i += n
            self._queue.append(frames)
            self._queued_bytes += sum(_nbytes(f) for f in frames)

    async def _recv_split(self, bufs: list[Any]) -> Message:
        """The frames of a KIND_SPLIT message: its inline ones, then each out-of-line frame
        received into a buffer of the announced size (device memory where this side can hold
        it, else host memory). Sizes are checked against the limits before anything is
        allocated."""
        if len(bufs) < 2:
            raise ProtocolError("ucx: split message without its layout; closing")
        layout = split_layout(bufs[1], len(bufs) - 2, self._limits)
        inline = iter(bufs[2:])
        frames: Message = []
        for where, n in layout:
            if where == _INLINE:
                frames.append(_own(next(inline)))
                continue
            buf = _device_empty(n) if where == _OOL_DEVICE and self.moves_device_memory else _host_empty(n)
            await self._ep.recv(buf, tag=_OOL_TAG)
            frames.append(buf if where == _OOL_DEVICE and self.moves_device_memory else memoryview(buf))
        return frames

    def _out_of_line(self, f: Any) -> bool:
        if hasattr(f, "__cuda_array_interface__"):
            return _nbytes(f) > 0
        return self._tagged > 0 and _nbytes(f) >= self._tagged

    def write_nowait(self, frames: Sequence[Buffer]) -> Awaitable[None] | None:
        """Queue one message for the sender task. Small messages are copied (the caller may
        reuse its buffers at once) and return None unless the queue is above its high-water
        mark; a larger one returns an awaitable that completes when ucxx has sent it."""
        if self._closed or self._ep is None or self._failure is not None:
            raise self._ended()
        nbytes = sum(_nbytes(f) for f in frames)
        done: asyncio.Future[None] | None = None
        split = False
        if nbytes < _SMALL and not any(hasattr(f, "__cuda_array_interface__") for f in frames):
            out = [f if type(f) is bytes else bytes(memoryview(f).cast("B")) for f in frames]
        else:
            out = list(frames)
            done = asyncio.get_running_loop().create_future()
            split = any(self._out_of_line(f) for f in out)
        self._outq.append((out, nbytes, done, split))
        self._out_bytes += nbytes
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._send_loop())
            self._sender.add_done_callback(_consume)
        if done is not None:
            return done
        if self._out_bytes > _HIGH_WATER:
            room = asyncio.get_running_loop().create_future()
            self._room.append(room)
            return room
        return None

    async def send(self, frames: Sequence[Buffer]) -> None:
        aw = self.write_nowait(frames)
        if aw is not None:
            await aw

    async def _send_loop(self) -> None:
        q = self._outq
        try:
            while q and self._failure is None and self._ep is not None:
                batch = [q.popleft()]
                size = batch[0][1]
                ool: list[Any] = []
                parts: list[Any]
                if not batch[0][3]:  # a message with out-of-line frames goes alone
                    while q and len(batch) < _BATCH_MESSAGES and not q[0][3] and size + q[0][1] <= _BATCH_BYTES:
                        item = q.popleft()
                        batch.append(item)
                        size += item[1]
                if batch[0][3]:
                    parts, ool = self._split(batch[0][0])
                elif len(batch) == 1:
                    parts = [KIND_MSG, *batch[0][0]]
                else:
                    counts = struct.pack(f"<{len(batch)}I", *(len(m[0]) for m in batch))
                    parts = [KIND_BATCH, counts]
                    for m in batch:
                        parts.extend(m[0])
                try:
                    await self._ep.send_multi(parts)
                    for f in ool:  # in order, on their own tag: the receiver posts them so
                        await self._ep.send(f, tag=_OOL_TAG)
                except asyncio.CancelledError:  # aborted: this batch may not have gone out
                    for _, _, fut, _ in batch:
                        if fut is not None and not fut.done():
                            fut.set_exception(self._ended())
                    raise
                except Exception as exc:
                    self._failure = self._failure or exc
                    for _, _, fut, _ in batch:
                        if fut is not None and not fut.done():
                            fut.set_exception(self._ended())
                    break
                self._out_bytes -= size
                for _, _, fut, _ in batch:
                    if fut is not None and not fut.done():
                        fut.set_result(None)
                if self._out_bytes <= _HIGH_WATER:
                    self._wake_writers(None)
        finally:
            self._sender = None
            if self._failure is not None or self._ep is None:  # fail what can no longer go out
                err = self._ended()
                while q:
                    fut = q.popleft()[2]
                    if fut is not None and not fut.done():
                        fut.set_exception(err)
                self._out_bytes = 0
                self._wake_writers(err)
            elif not q:
                self._wake_writers(None)

    def _split(self, frames: list[Any]) -> tuple[list[Any], list[Any]]:
        """The ``send_multi`` parts of a message with out-of-line frames, and those frames."""
        layout = bytearray()
        parts: list[Any] = [KIND_SPLIT, b""]
        ool: list[Any] = []
        for f in frames:
            if self._out_of_line(f):
                where = _OOL_DEVICE if hasattr(f, "__cuda_array_interface__") else _OOL_HOST
                ool.append(f)
            else:
                where = _INLINE
                parts.append(f)
            layout += _LAYOUT.pack(where, _nbytes(f))
        parts[1] = bytes(layout)
        return parts, ool

    def _wake_writers(self, err: BaseException | None) -> None:
        room, self._room = self._room, []
        for fut in room:
            if not fut.done():
                if err is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(err)

    async def _flush(self) -> None:
        """Wait until everything queued so far has been handed to ucxx."""
        while self._sender is not None:
            task = self._sender
            with contextlib.suppress(Exception):
                await asyncio.shield(task)

    def _pop(self) -> Message:
        msg = self._queue.popleft()
        self._queued_bytes -= sum(_nbytes(f) for f in msg)
        if self._queued_bytes <= self._max_queued:
            self._space.set()
        return msg

    async def recv(self) -> Message:
        while not self._queue:
            if self._closed or self._eof:
                raise self._ended()
            self._have_data.clear()
            await self._have_data.wait()
        return self._pop()

    async def recv_many(self) -> list[Message]:
        out = [await self.recv()]
        while self._queue:
            out.append(self._pop())
        return out

    async def close(self) -> None:
        if self._closed:
            return
        if self._failure is None and self._ep is not None and not self._ep.closed:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    await self._flush()  # everything queued before close goes out first
                    await self._ep.send_multi([KIND_FIN])
        self._closed = True
        self._have_data.set()
        self._reader.cancel()
        with contextlib.suppress(BaseException):
            await self._reader
        ep, self._ep = self._ep, None
        if ep is not None:
            with contextlib.suppress(Exception):
                await ep.close(period=10**9)

    def abort(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._have_data.set()
        self._reader.cancel()
        if self._sender is not None:
            self._sender.cancel()
        ep, self._ep = self._ep, None
        if ep is not None:
            with contextlib.suppress(Exception):
                ep.abort(period=10**8)

    def stats(self) -> ConnectionStats:
        return ConnectionStats(
            local=self.local_address,
            remote=self.peer_address,
            queued_recv_bytes=self._queued_bytes,
            extra={"moves_device_memory": self.moves_device_memory},
        )


def _consume(task: asyncio.Task[Any]) -> None:
    """Done callback of a connection's own tasks: their failure is already recorded on the
    connection (or the task was aborted), so retrieve it rather than leave it unretrieved."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.debug("ucx connection task ended", error=repr(exc))


def _own(buf: Any) -> Any:
    """Host frames as flat writable memoryviews; device buffers are passed through."""
    if hasattr(buf, "__cuda_array_interface__"):
        return buf
    mv = memoryview(buf)
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def split_layout(raw: Any, inline: int, limits: LimitsSection) -> list[tuple[int, int]]:
    """``(where, nbytes)`` per frame of a KIND_SPLIT message whose layout frame is ``raw`` and
    which arrived with ``inline`` inline frames: ProtocolError (or its FrameTooLarge /
    TooManyFrames) unless well formed and within ``limits``, checked before anything is
    allocated for it."""
    raw = memoryview(raw).cast("B")
    if len(raw) % _LAYOUT.size:
        raise ProtocolError("ucx: malformed split layout; closing")
    layout = list(_LAYOUT.iter_unpack(raw))
    if len(layout) > limits.max_frames:
        raise TooManyFrames(f"ucx: message has {len(layout)} frames; limit is {limits.max_frames} (limits.max_frames)")
    if any(where not in (_INLINE, _OOL_HOST, _OOL_DEVICE) for where, _ in layout):
        raise ProtocolError("ucx: unknown frame placement in split layout; closing")
    if sum(1 for where, _ in layout if where == _INLINE) != inline:
        raise ProtocolError("ucx: split layout does not match its frames; closing")
    if (big := max((n for _, n in layout), default=0)) > limits.max_frame_bytes:
        raise FrameTooLarge(f"ucx: frame of {big} bytes; limit is {limits.max_frame_bytes} (limits.max_frame_bytes)")
    if (total := sum(n for _, n in layout)) > limits.max_message_bytes:
        raise FrameTooLarge(
            f"ucx: message of {total} bytes; limit is {limits.max_message_bytes} (limits.max_message_bytes)"
        )
    return layout


def _host_empty(n: int) -> Any:
    import numpy as np

    return np.empty(n, dtype=np.uint8)


def _device_empty(n: int) -> Any:
    import cupy

    return cupy.empty(n, dtype=cupy.uint8)


def _nbytes(f: Any) -> int:
    n = getattr(f, "nbytes", None)
    return int(n) if n is not None else len(f)


async def _host_ips(loop: asyncio.AbstractEventLoop, host: str, url: str) -> set[str]:
    """The IP addresses ``host`` names (the addresses a listener on it serves)."""
    with contextlib.suppress(ValueError):
        ip = ipaddress.ip_address(host)
        return {str(getattr(ip, "ipv4_mapped", None) or ip)}
    with map_errors({OSError: lambda e: TransportError(f"ucx: cannot listen on {url}: cannot resolve {host!r}: {e}")}):
        infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return {str(info[4][0]).split("%", 1)[0] for info in infos}


class UCXListener(Listener):
    def __init__(self, transport: UCXTransport, listener: Any, url: str) -> None:
        self._transport = transport
        self._listener = listener
        self._url = url

    @property
    def address(self) -> str:
        return self._url

    async def close(self) -> None:
        lst, self._listener = self._listener, None
        if lst is not None:
            lst.close()
            self._transport._listeners.discard(self)
            del lst
            await asyncio.sleep(0)


#: ``[transport] ucx = {...}``; see UCXTransport.
SCHEMA: MappingProxyType[str, Option] = MappingProxyType(
    {
        "tls": Option("", string),  # UCX_TLS, e.g. "tcp"
        "ucx_options": Option(MappingProxyType({}), table),  # extra UCX settings without the UCX_ prefix
        "max_queued_bytes": Option(64 << 20, size, positive, "must be positive"),
        "probe": Option(True, boolean),
        "tagged_frame_bytes": Option(0, size),
    }
)


class UCXTransport(Transport):
    """``ucx://host:port``. Options: ``tls`` (UCX_TLS, e.g. ``"tcp"``), ``ucx_options``
    (extra UCX settings without the ``UCX_`` prefix), ``max_queued_bytes`` (64 MiB),
    ``probe`` (True: a TCP probe makes connecting to a dead address fail at once instead of
    at the timeout; turn off where the UCX listener is reachable only over RDMA CM),
    ``tagged_frame_bytes`` (0: off; host frames at least this large, in messages of 64 KiB or
    more, go out of line as device frames always do)."""

    schemes = ("ucx",)

    def __init__(self, options: dict[str, Any] | None = None, limits: Any = None) -> None:
        super().__init__(options, limits)
        self.options = parse_options("ucx", SCHEMA, self.options)
        self._ucxx: Any = None
        self._max_queued: int = self.options["max_queued_bytes"]
        self._probe: bool = self.options["probe"]
        self._tagged: int = self.options["tagged_frame_bytes"]
        self._conns: weakref.WeakSet[UCXConnection] = weakref.WeakSet()
        self._listeners: set[UCXListener] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._device: bool | None = None
        self._query: _EpQuery | None = None

    @classmethod
    def check_available(cls) -> None:
        _import_ucxx()

    def _ensure(self, *, loopback_only: bool = False) -> Any:
        if self._ucxx is None:
            self._ucxx = _SHARED.acquire(self, self.options, loopback_only=loopback_only)
        return self._ucxx

    def _moves_device_memory(self) -> bool:
        if self._device is None:
            from ..devices import Devices

            ok = False
            if Devices(use_nvml=False).cuda_available():
                with contextlib.suppress(Exception):
                    ok = "cuda" in " ".join(self._ucxx.get_active_transports())
            self._device = ok
        return self._device

    def _wrap(self, ep: Any, local: str, peer: str) -> UCXConnection:
        conn = UCXConnection(
            ep,
            local=local,
            peer=peer,
            max_queued_bytes=self._max_queued,
            device=self._moves_device_memory(),
            limits=self.limits,
            tagged_frame_bytes=self._tagged,
        )
        self._conns.add(conn)
        return conn

    async def listen(self, url: str, handler: ConnectionHandler) -> Listener:
        addr = Address.parse(url)
        loop = asyncio.get_running_loop()
        # ucxx (0.52) always listens on every interface. What it cannot bind, the listener
        # enforces per connection: UCX reports each accepted endpoint's local and remote socket
        # address, so a connection that arrived on an address other than the requested host is
        # refused before aionet sees it, and the peer is labelled with its real address (the
        # node's "no token: local peers only" rule then holds). Where UCX cannot be asked, peers
        # are labelled unknown, which such a node refuses.
        allowed: set[str] | None = None
        if addr.host not in ("", "0.0.0.0", "::"):
            allowed = await _host_ips(loop, addr.host, url)
        loopback = allowed is not None and all(ipaddress.ip_address(a).is_loopback for a in allowed)
        ucxx = self._ensure(loopback_only=loopback)
        if self._query is None:
            self._query = _EpQuery()
        query = self._query
        if not query.available:
            log.warning(
                "ucx: UCX cannot report who connected (ucp_ep_query not found), so this listener "
                "accepts on every interface and cannot prove any peer local; a node without a "
                "cluster token will refuse its peers: set security.token",
                listen=url,
            )
        bound = url

        async def on_endpoint(ep: Any) -> None:
            found = query.addresses(ep)
            peer = "ucx://peer"  # unknown: never local
            if found is not None:
                (local_ip, _), (remote_ip, remote_port) = found
                if allowed is not None and local_ip not in allowed:
                    log.warning(
                        "ucx connection arrived on an address this listener does not serve; refused",
                        listener=bound,
                        arrived_on=local_ip,
                        peer=remote_ip,
                    )
                    with contextlib.suppress(Exception):
                        ep.abort(period=10**8)
                    return
                peer = Address("ucx", remote_ip, remote_port, "").url()
            conn = self._wrap(ep, bound, peer)
            self._own(loop.create_task(handler(conn)))  # return at once: ucxx tracks this callback

        with map_errors({Exception: lambda e: TransportError(f"ucx: cannot listen on {url}: {e}")}):  # ucxx errors
            lst = ucxx.create_listener(on_endpoint, port=addr.port or 0)
        host = addr.host if addr.host not in ("", "0.0.0.0", "::") else lst.ip
        bound = Address("ucx", host, int(lst.port), "").url()
        listener = UCXListener(self, lst, bound)
        self._listeners.add(listener)
        return listener

    def _own(self, task: asyncio.Task[Any]) -> None:
        """Keep ``task`` until it ends and consume its outcome (aclose awaits what is left)."""
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("ucx connection handler failed", error=repr(exc))

    async def connect(self, url: str, *, timeout: float | None = None) -> Connection:
        addr = Address.parse(url)
        if not addr.host or not addr.port:
            raise TransportError(f"ucx: URL needs host and port: {url!r}")
        ucxx = self._ensure()
        timeout = float(timeout if timeout is not None else 5.0)
        # OSError, TimeoutError and ucxx's own errors alike
        with map_errors({Exception: lambda e: TransportError(f"ucx: cannot connect to {url}: {e!r}")}):
            async with asyncio.timeout(timeout):
                if self._probe:  # UCX would only notice a dead address at the handshake timeout
                    _r, w = await asyncio.open_connection(addr.host, addr.port)
                    w.close()
                    with contextlib.suppress(OSError):
                        await w.wait_closed()
                ep = await ucxx.create_endpoint(addr.host, addr.port, connect_timeout=timeout)
        return self._wrap(ep, "ucx://local", url)

    async def aclose(self) -> None:
        for lst in list(self._listeners):
            await lst.close()
        for conn in list(self._conns):
            conn.abort()
            with contextlib.suppress(BaseException):
                await conn._reader
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(BaseException):
                await t
        self._conns = weakref.WeakSet()
        if self._ucxx is not None:
            self._ucxx = None
            _SHARED.release(self)
