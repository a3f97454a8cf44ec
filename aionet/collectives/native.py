"""The native ring: a group's large allreduces and reduce-scatters over TCP streams of its own,
moved by C.

On one host a rank's kernel time for a ring allreduce is the same whether Python or C drives
the sockets; what the event loop, the framing and the acks add is a few ms of user time per call
and rank (BENCHMARKS.md). So a group whose members all listen on plain ``tcp://`` and have the
compiled ring (``aionet/collectives/_ring.c``, built at install where a C compiler is found) sets
up, at its first native call, one stream from each rank to its right neighbour:

- every rank opens a listener on its node's listen host and tells the others its port and a
  fresh 32-byte secret, in an allgather over the group's links (authenticated by the cluster
  token when one is set);
- each rank dials its right neighbour and proves that neighbour's secret; a connection that
  does not prove it is closed with one log line;
- an allreduce of the outcome makes every rank agree: all streams up, or none used.

Each native call then runs ``aionet_ring_allreduce`` (or ``aionet_ring_reduce_scatter``) in a
thread of the group's own (ctypes releases the GIL), watching an abort pipe. The call's failure
rules stay the group's: a member declared dead, a peer's abort or a timeout writes the pipe and
the call raises what the group says. A native call that does not complete leaves the streams out
of step, so it breaks the group on every member (``shrink()`` goes on, with a new group and new
streams).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import hmac
import importlib.util
import os
import secrets
import socket
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .aligned import empty_aligned

#: numpy dtype -> the C ring's dtype code
DTYPES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.int32): 2, np.dtype(np.int64): 3}
#: op -> the C ring's op code (mean is a sum divided afterwards, as everywhere else)
OPS = {"sum": 0, "mean": 0, "prod": 1, "min": 2, "max": 3}

RC_OK, RC_ABORTED, RC_LEFT_CLOSED, RC_LEFT_ERROR, RC_RIGHT_ERROR, RC_MISMATCH = 0, -1, -2, -3, -4, -5
RC_BAD_ARGS = -6
_RC_TEXT = {
    RC_ABORTED: "aborted",
    RC_LEFT_CLOSED: "the stream from the left neighbour closed",
    RC_LEFT_ERROR: "the stream from the left neighbour failed",
    RC_RIGHT_ERROR: "the stream to the right neighbour failed",
    RC_MISMATCH: "the left neighbour called another collective or cut it differently",
    RC_BAD_ARGS: "bad arguments",
    -7: "poll failed",
}

# pieces of a chunk, alternated call by call in the same ranks (page-aligned arrays, 2026-11-29):
# 4 MiB was the slowest or tied at 2 and 4 ranks, 16 and 64 MiB; 1 and 2 MiB were within each
# other's spread; 512 KiB was level except at 2 ranks, 64 MiB; 256 KiB (2 ranks, 16 MiB only) lost
# to all (BENCHMARKS.md, "Piece size")
SEGMENT_BYTES = 1 << 20
_HELLO = b"aionet-ring/1\0\0\0"  # 16 bytes, then the right neighbour's secret and the dialer's rank
_AUTH = struct.Struct("!16s32sI")


class NativeFailure(Exception):
    """A native call that did not complete: ``rc`` (RC_*), ``err`` (errno), ``peer`` (the left
    neighbour's header on RC_MISMATCH: seq, count, dtype code, op code)."""

    def __init__(self, rc: int, err: int, peer: tuple[int, ...]) -> None:
        text = _RC_TEXT.get(rc, f"error {rc}")
        super().__init__(f"{text}{f' ({os.strerror(err)})' if err else ''}")
        self.rc, self.err, self.peer = rc, err, peer


class NativeRing:
    """The compiled ring, loaded with ctypes (calls release the GIL)."""

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        fn = lib.aionet_ring_allreduce
        c = ctypes
        fn.argtypes = [c.c_int, c.c_int, c.c_int, c.c_void_p, c.c_void_p, c.c_void_p, c.c_longlong, c.c_int, c.c_int,
                       c.c_int, c.c_int, c.c_longlong, c.c_ulonglong, c.POINTER(c.c_int),
                       c.POINTER(c.c_ulonglong)]  # fmt: skip
        fn.restype = c.c_int
        self._fn = fn
        rs = lib.aionet_ring_reduce_scatter
        rs.argtypes = [c.c_int, c.c_int, c.c_int, c.c_void_p, c.c_void_p, c.c_longlong, c.c_int, c.c_int, c.c_int,
                       c.c_int, c.c_longlong, c.c_ulonglong, c.POINTER(c.c_longlong), c.c_ulonglong,
                       c.POINTER(c.c_int), c.POINTER(c.c_ulonglong)]  # fmt: skip
        rs.restype = c.c_int
        self._rs = rs

    def allreduce(
        self, left: int, right: int, abort: int, x: np.ndarray, res: np.ndarray, scratch: np.ndarray | None,
        dtype: int, op: int, n: int, rank: int, seg_items: int, seq: int,
    ) -> tuple[int, int, tuple[int, ...]]:  # fmt: skip
        err = ctypes.c_int(0)
        peer = (ctypes.c_ulonglong * 4)()
        rc = self._fn(left, right, abort, x.ctypes.data, res.ctypes.data,
                      None if scratch is None else scratch.ctypes.data, x.size, dtype, op, n, rank, seg_items, seq,
                      ctypes.byref(err), peer)  # fmt: skip
        return rc, err.value, tuple(peer)

    def reduce_scatter(
        self, left: int, right: int, abort: int, x: np.ndarray, res: np.ndarray, dtype: int, op: int, n: int,
        rank: int, seg_items: int, seq: int, bounds: np.ndarray, check: int,
    ) -> tuple[int, int, tuple[int, ...]]:  # fmt: skip
        """``res[bounds[rank]:bounds[rank + 1]]`` = the reduction of every rank's ``x`` there
        (``bounds``: int64, n + 1 offsets; the rest of ``res`` is scratch; ``res`` is not ``x``)."""
        err = ctypes.c_int(0)
        peer = (ctypes.c_ulonglong * 4)()
        rc = self._rs(left, right, abort, x.ctypes.data, res.ctypes.data, x.size, dtype, op, n, rank, seg_items, seq,
                      bounds.ctypes.data_as(ctypes.POINTER(ctypes.c_longlong)), check, ctypes.byref(err),
                      peer)  # fmt: skip
        return rc, err.value, tuple(peer)


def load_native() -> NativeRing | str:
    """The compiled ring, or why there is none (said where a group cannot use it)."""
    try:
        spec = importlib.util.find_spec("aionet.collectives._ring")
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        return (
            "aionet's native ring was not built (no C compiler when aionet was installed: install one, "
            "e.g. apt-get install gcc, and reinstall aionet)"
        )
    try:
        return NativeRing(spec.origin)
    except (OSError, AttributeError) as exc:
        return f"aionet's native ring could not be loaded: {exc}"


class NativeSupport:
    """What a node gives its groups for the native ring: the threshold, where to listen, and the
    compiled ring (loaded at the first group that wants it)."""

    def __init__(self, min_bytes: int, endpoint: Callable[[], tuple[str, str] | str] | None) -> None:
        self.min_bytes = min_bytes  # collectives.native_bytes (0: off)
        self._endpoint = endpoint  # (bind host, advertised host), or why this node cannot
        self._lib: NativeRing | str | None = None

    def lib(self) -> NativeRing | str:
        if self._lib is None:
            self._lib = load_native()
        return self._lib

    def offer(self, log: Any) -> tuple[RingStreams | None, dict[str, Any]]:
        """This rank's streams (listening) and its record for the setup's allgather."""
        if self._endpoint is None:
            return None, {"ok": False, "why": "no listen address for the native ring"}
        where = self._endpoint()
        if isinstance(where, str):
            return None, {"ok": False, "why": where}
        lib = self.lib()
        if isinstance(lib, str):
            return None, {"ok": False, "why": lib}
        streams = RingStreams(lib, log)
        try:
            return streams, streams.offer(*where)
        except OSError as exc:
            streams.close()
            return None, {"ok": False, "why": f"cannot listen on {where[0]!r}: {exc}"}


class RingStreams:
    """One group's streams for the native ring: a listener while they are set up, then a socket
    to the right neighbour and one from the left, an abort pipe and a thread of their own."""

    def __init__(self, lib: NativeRing, log: Any) -> None:
        self._lib = lib
        self.log = log
        self._listener: socket.socket | None = None
        self._secret = b""
        self._left: socket.socket | None = None
        self._right: socket.socket | None = None
        self._abort_r, self._abort_w = os.pipe()
        os.set_blocking(self._abort_r, False)
        self._pool: ThreadPoolExecutor | None = None
        self._scratch: np.ndarray | None = None
        self._closed = False

    # ------------------------------------------------------------------ setup
    def offer(self, bind_host: str, host: str) -> dict[str, Any]:
        """Listen, and say where and with which secret (this rank's allgather record)."""
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        ls = socket.socket(family, socket.SOCK_STREAM)
        try:
            ls.bind((bind_host, 0))
            ls.listen(4)
            ls.setblocking(False)
        except OSError:
            ls.close()
            raise
        self._listener = ls
        self._secret = secrets.token_bytes(32)
        return {"ok": True, "host": host, "port": ls.getsockname()[1], "secret": self._secret}

    async def connect(self, host: str, port: int, secret: bytes, rank: int, left: int, timeout: float) -> None:
        """Dial the right neighbour (proving its ``secret``) and take the left one's dial."""
        if type(secret) is not bytes or len(secret) != 32 or not 0 < port < 65536:  # from the network
            raise ValueError("the right neighbour's native ring record is malformed")
        dial = asyncio.ensure_future(self._dial(host, port, secret, rank))
        accept = asyncio.ensure_future(self._accept(left))
        got: list[socket.socket] = []
        try:
            async with asyncio.timeout(timeout):
                await asyncio.wait((dial, accept), return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for t in (dial, accept):
                t.cancel()
            await asyncio.wait((dial, accept))  # both ended: no task left behind
            got = [t.result() for t in (dial, accept) if not t.cancelled() and t.exception() is None]
            if len(got) != 2:  # one side failed (or the time ran out): keep nothing
                for sock in got:
                    sock.close()
        if len(got) != 2:
            failed = next((t.exception() for t in (dial, accept) if not t.cancelled() and t.exception()), None)
            raise failed or TimeoutError(f"the native ring's streams did not connect within {timeout} s")
        self._right, self._left = got
        assert self._listener is not None
        self._listener.close()
        self._listener = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aionet-ring")

    async def _dial(self, host: str, port: int, secret: bytes, rank: int) -> socket.socket:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, _type, proto, _name, addr = infos[0]
        s = socket.socket(family, socket.SOCK_STREAM, proto)
        try:
            s.setblocking(False)
            await loop.sock_connect(s, addr)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_sendall(s, _AUTH.pack(_HELLO, secret, rank))
        except BaseException:
            s.close()
            raise
        return s

    async def _accept(self, left: int) -> socket.socket:
        """The left neighbour's dial: the first connection that proves this rank's secret.

        Every connection is checked in a task of its own, so one that stays silent does not hold
        up the real one. The listener is read with add_reader, not loop.sock_accept: a cancelled
        sock_accept whose connection arrived in the same loop turn raises InvalidStateError in a
        loop callback (CPython 3.11) and loses that connection."""
        loop = asyncio.get_running_loop()
        ls = self._listener
        assert ls is not None
        won: asyncio.Future[socket.socket] = loop.create_future()
        checks: set[asyncio.Task[socket.socket | None]] = set()

        def checked(t: asyncio.Task[socket.socket | None]) -> None:
            checks.discard(t)
            s = None if t.cancelled() or t.exception() is not None else t.result()
            if s is not None and won.done():
                s.close()  # a second proof (a retried dial); the first one won
            elif s is not None:
                won.set_result(s)

        def readable() -> None:
            while not won.done():
                try:
                    s, addr = ls.accept()
                except (BlockingIOError, InterruptedError):
                    return
                except OSError as exc:
                    won.set_exception(exc)
                    return
                t = loop.create_task(self._check(s, addr, left))
                checks.add(t)
                t.add_done_callback(checked)

        loop.add_reader(ls.fileno(), readable)
        try:
            return await won
        except BaseException:  # cancelled: a connection that had just won is closed, not leaked
            if won.done() and not won.cancelled() and won.exception() is None:
                won.result().close()
            raise
        finally:
            loop.remove_reader(ls.fileno())
            for t in list(checks):
                t.cancel()
            if checks:
                await asyncio.wait(list(checks))

    async def _check(self, s: socket.socket, addr: Any, left: int) -> socket.socket | None:
        """``s`` if it proves the secret within 5 s (as rank ``left``), else None (closed, logged)."""
        loop = asyncio.get_running_loop()
        try:
            s.setblocking(False)
            buf = bytearray()
            while len(buf) < _AUTH.size:
                chunk = await asyncio.wait_for(loop.sock_recv(s, _AUTH.size - len(buf)), 5.0)
                if not chunk:
                    raise ConnectionError("closed before it proved the secret")
                buf += chunk
            hello, secret, rank = _AUTH.unpack(bytes(buf))
            if hello != _HELLO or not hmac.compare_digest(secret, self._secret) or rank != left:
                raise ConnectionError("it did not prove the group's secret")
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, TimeoutError, ConnectionError) as exc:
            s.close()
            self.log.warning("native ring: refused a connection", peer=str(addr), error=str(exc))
            return None
        except BaseException:
            s.close()
            raise
        return s

    # ------------------------------------------------------------------ calls
    async def allreduce(
        self, seq: int, x: np.ndarray, res: np.ndarray, op: str, n: int, rank: int, failed: asyncio.Future[Any]
    ) -> None:
        """``res`` = the reduction of every rank's ``x`` (``res`` may be ``x``). Raises
        NativeFailure, or what ``failed`` (the group's failure for this call) raises first."""
        chunk = -(-x.size // n)
        seg = max(1, min(chunk, SEGMENT_BYTES // x.itemsize))
        scratch = None
        if res is x:  # in place: a received partial sum needs a place of its own
            if self._scratch is None or self._scratch.dtype != x.dtype or self._scratch.size < seg:
                self._scratch = empty_aligned(seg, x.dtype)
            scratch = self._scratch
        await self._call(failed, self._lib.allreduce, x, res, scratch, DTYPES[x.dtype], OPS[op], n, rank, seg, seq)

    async def reduce_scatter(
        self, seq: int, x: np.ndarray, res: np.ndarray, op: str, n: int, rank: int, bounds: list[tuple[int, int]],
        failed: asyncio.Future[Any],
    ) -> None:  # fmt: skip
        """``res``'s block ``rank`` (``bounds``, element offsets) = the reduction of every rank's
        ``x`` there; the rest of ``res`` is scratch. Raises as :meth:`allreduce`."""
        offsets = np.array([a for a, _ in bounds] + [bounds[-1][1]], dtype=np.int64)
        # every rank must cut alike: the header carries a digest of the cuts, and one that differs
        # fails the call on every rank (RC_MISMATCH) instead of mixing blocks
        check = int.from_bytes(hashlib.blake2b(offsets.tobytes(), digest_size=8).digest(), "little")
        seg = max(1, min(max(b - a for a, b in bounds), SEGMENT_BYTES // x.itemsize))
        await self._call(
            failed, self._lib.reduce_scatter, x, res, DTYPES[x.dtype], OPS[op], n, rank, seg, seq, offsets, check
        )

    async def _call(self, failed: asyncio.Future[Any], fn: Callable[..., Any], *args: Any) -> None:
        """Run one compiled call in the ring's thread; stop it through the abort pipe if the group
        fails or this task is cancelled (the thread lets go of the arrays before this returns)."""
        assert self._left is not None and self._right is not None and self._pool is not None
        loop = asyncio.get_running_loop()
        job = loop.run_in_executor(self._pool, fn, self._left.fileno(), self._right.fileno(), self._abort_r, *args)
        try:
            await asyncio.wait((job, failed), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled (a timeout, the caller): the thread must be done with x first
            await self._stop(job)
            raise
        if not job.done():
            await self._stop(job)
            failed.result()  # raises the group's failure (a message here would be a protocol error)
            raise NativeFailure(RC_ABORTED, 0, ())
        rc, err, peer = job.result()
        if rc != RC_OK:
            raise NativeFailure(rc, err, peer)

    async def _stop(self, job: asyncio.Future[Any]) -> None:
        """Abort the C call and wait until its thread has let go of the arrays."""
        with contextlib.suppress(OSError):
            os.write(self._abort_w, b"x")
        cancelled = False
        while not job.done():
            try:
                await asyncio.shield(job)
            except asyncio.CancelledError:
                cancelled = True
            except Exception:
                break
        if cancelled:
            raise asyncio.CancelledError

    def close(self) -> None:
        """Close the streams (the ring's neighbours read EOF) and the thread. A call still
        running returns at once (the abort pipe); the descriptors close after it, in its thread."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            os.write(self._abort_w, b"x")
        if self._pool is not None:
            self._pool.submit(self._close_fds)
            self._pool.shutdown(wait=False)
        else:
            self._close_fds()

    def _close_fds(self) -> None:
        for s in (self._listener, self._left, self._right):
            if s is not None:
                s.close()
        for fd in (self._abort_r, self._abort_w):
            with contextlib.suppress(OSError):
                os.close(fd)


__all__ = ["DTYPES", "OPS", "NativeFailure", "NativeRing", "NativeSupport", "RingStreams", "load_native"]
