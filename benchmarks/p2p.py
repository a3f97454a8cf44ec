#!/usr/bin/env python
"""Point-to-point benchmark: aionet vs raw asyncio sockets vs pyzmq vs Dask comm.

Two separate processes on 127.0.0.1 (a server child and a client child, both started by this
script; the server binds port 0 and reports the real port on its stdout). Measured, per
implementation, in one invocation:

1. request/reply round trip of a 64 B payload: p50 and p99 over thousands of sequential round
   trips after a warm-up;
2. one-way throughput of 1 MiB and 64 MiB numpy arrays (random bytes, so compression cannot
   help): from the first send until the client holds the receiver's acknowledgement that every
   byte arrived;
3. small-message rate: 64 B one-way sends for a fixed time; the receiver counts every message
   and acknowledges the count at the end.

Implementations (columns): aionet (public Node API, one table per ``--transport``), raw
(asyncio + uvloop, ``BufferedProtocol``: the yardstick), pyzmq, dask (``distributed.comm``).
Each measurement is repeated ``--repeat`` times with a fresh pair of processes; the table shows
the median and the min-max spread, and the ratio aionet/raw. See benchmarks/README.md.

    python benchmarks/p2p.py                 # full run, tcp:// only
    python benchmarks/p2p.py --quick         # ~30 s smoke run
    python benchmarks/p2p.py --transport tcp,zmq+tcp --repeat 5 --json /tmp/p2p.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C

SCRIPT = Path(__file__).resolve()
HOST = "127.0.0.1"
SMALL = 64  # bytes: the request/reply and message-rate payload
SIZES = {"1mib": 1 * C.MiB, "64mib": 64 * C.MiB}

IMPLS = ("raw", "pyzmq", "dask", "aionet")

# metric key -> (label, unit, higher_is_better)
METRICS: dict[str, tuple[str, str, bool]] = {
    "lat_p50_us": ("req/rep 64 B p50", "us", False),
    "lat_p99_us": ("req/rep 64 B p99", "us", False),
    "tp_1mib_gbps": ("one-way 1 MiB arrays", "GB/s", True),
    "tp_64mib_gbps": ("one-way 64 MiB arrays", "GB/s", True),
    # aionet only: the same array marked read-only, so a send returns before its ack (README)
    "tp_1mib_ro_gbps": ("one-way 1 MiB read-only arrays", "GB/s", True),
    "rate_64b_msgs_s": ("send rate 64 B", "msgs/s", True),
    # aionet only (issue 18): timed at the receiver, first to last message of the round
    "rate_64b_rx_msgs_s": ("send rate 64 B, timed at receiver", "msgs/s", True),
    "rate_64b_nowait_msgs_s": ("send_nowait rate 64 B, timed at receiver", "msgs/s", True),
    "rate_64b_many_msgs_s": ("send_many(256) rate 64 B, timed at receiver", "msgs/s", True),
    "req_64_inflight_per_s": ("requests/s, 64 in flight", "req/s", True),
}

WHAT = {
    "raw": "uvloop BufferedProtocol: 4-byte-length ping-pong; 8-byte-length stream into a reused buffer; "
    "writelines batches of 256 x 64 B",
    "pyzmq": "sync REQ/REP; sync DEALER send(copy=False) / recv(copy=False); "
    "zmq.asyncio DEALER, NOBLOCK sends, poll-then-drain NOBLOCK receives",
    "dask": "distributed.comm tcp: write/read echo; write({'x': to_serialize(arr)}); sequential 64 B writes",
    "aionet": "Node.request(bench.echo); Node.send + recv_batch on the receiver; ack via Node.request; "
    "the rx-timed rates span the receiver's first to last message; send_nowait waits on wait_space "
    "when told to; 64 tasks each looping on request(bench.echo)",
}


@dataclass
class Params:
    lat_warmup: int = 2000
    lat_count: int = 20000
    lat_max_seconds: float = 10.0
    tp_bytes: dict[str, int] = field(default_factory=lambda: {"1mib": 1 * C.GiB, "64mib": 2 * C.GiB})
    tp_warmup_msgs: dict[str, int] = field(default_factory=lambda: {"1mib": 64, "64mib": 2})
    tp_max_seconds: float = 60.0
    rate_seconds: float = 2.0
    rate_warmup_seconds: float = 0.3
    rate_batch: int = 256

    @classmethod
    def quick(cls) -> Params:
        return cls(
            lat_warmup=300,
            lat_count=3000,
            lat_max_seconds=3.0,
            tp_bytes={"1mib": 256 * C.MiB, "64mib": 384 * C.MiB},
            # 2 x 64 MiB, as in the full run: a consumer that holds one batch while the next
            # arrives needs two receive buffers; with one warm-up message the first measured
            # message landed in fresh memory (1 of 6: 0.62x against 0.92x raw, bigmsg.py)
            tp_warmup_msgs={"1mib": 16, "64mib": 2},
            tp_max_seconds=30.0,
            rate_seconds=0.75,
            rate_warmup_seconds=0.1,
        )

    def session_timeout(self) -> float:
        """Upper bound for one client session (all metrics), generous on slow machines."""
        return 60 + self.lat_max_seconds * 2 + 3 * self.tp_max_seconds + 7 * (self.rate_seconds + 10)


def payload_small() -> bytes:
    return os.urandom(SMALL)


def make_array(nbytes: int, seed: int = 1234):
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)


def _nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


# =========================================================================== raw asyncio
# Three listeners, one per pattern, because uvloop binds get_buffer/buffer_updated once per
# connection (a protocol cannot switch strategies mid-stream cheaply).

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_ACK = struct.Struct("<QQ")  # messages, bytes
END32 = 0xFFFFFFFF
END64 = 0xFFFFFFFFFFFFFFFF


class _RawEcho(asyncio.BufferedProtocol):
    """Server side of the ping-pong: echo every complete length-prefixed message."""

    def __init__(self) -> None:
        self.buf = bytearray(64 * C.KiB)
        self.mv = memoryview(self.buf)
        self.n = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _nodelay(transport)
        self.tr = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.n == len(self.buf):
            self.buf.extend(bytes(len(self.buf)))
            self.mv = memoryview(self.buf)
        return self.mv[self.n :]

    def buffer_updated(self, nbytes: int) -> None:
        end = self.n + nbytes
        buf = self.buf
        pos = 0
        while end - pos >= 4:
            ln = _U32.unpack_from(buf, pos)[0]
            stop = pos + 4 + ln
            if stop > end:
                break
            pos = stop
        if pos:
            self.tr.write(bytes(self.mv[:pos]))  # one write for all complete messages
            rem = end - pos
            if rem:
                buf[:rem] = buf[pos:end]
            self.n = rem
        else:
            self.n = end


class _RawPing(asyncio.BufferedProtocol):
    """Client side of the ping-pong: resolve ``waiter`` when the echo is complete."""

    def __init__(self) -> None:
        self.buf = bytearray(64 * C.KiB)
        self.mv = memoryview(self.buf)
        self.n = 0
        self.waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _nodelay(transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.mv[self.n :]

    def buffer_updated(self, nbytes: int) -> None:
        end = self.n + nbytes
        if end < 4:
            self.n = end
            return
        ln = _U32.unpack_from(self.buf, 0)[0]
        if end < 4 + ln:
            self.n = end
            return
        self.n = 0  # strictly one outstanding request
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_exception(ConnectionError(f"connection lost: {exc}"))


class _RawSink(asyncio.BufferedProtocol):
    """Throughput receiver: ``<u64 len><body>`` messages read straight into a reused buffer.

    ``len == END64`` ends a round: reply ``<u64 messages><u64 bytes>`` and reset."""

    def __init__(self) -> None:
        self.hdr = bytearray(8)
        self.hdr_mv = memoryview(self.hdr)
        self.hpos = 0
        self.body = bytearray(0)
        self.body_mv = memoryview(self.body)
        self.blen = 0
        self.bpos = 0
        self.in_body = False
        self.msgs = 0
        self.nbytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _nodelay(transport)
        self.tr = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.in_body:
            return self.body_mv[self.bpos : self.blen]
        return self.hdr_mv[self.hpos :]

    def buffer_updated(self, nbytes: int) -> None:
        if self.in_body:
            self.bpos += nbytes
            if self.bpos == self.blen:
                self.in_body = False
                self.msgs += 1
                self.nbytes += self.blen
            return
        self.hpos += nbytes
        if self.hpos < 8:
            return
        self.hpos = 0
        ln = _U64.unpack_from(self.hdr, 0)[0]
        if ln == END64:
            self.tr.write(_ACK.pack(self.msgs, self.nbytes))
            self.msgs = self.nbytes = 0
        elif ln == 0:
            self.msgs += 1
        else:
            if ln > len(self.body):  # grow once; then reused for every message
                self.body_mv.release()
                self.body = bytearray(ln)
                self.body_mv = memoryview(self.body)
            self.blen = ln
            self.bpos = 0
            self.in_body = True


class _RawCounter(asyncio.BufferedProtocol):
    """Message-rate receiver: parse every ``<u32 len><body>`` frame and count it."""

    def __init__(self) -> None:
        self.buf = bytearray(256 * C.KiB)
        self.mv = memoryview(self.buf)
        self.n = 0
        self.msgs = 0
        self.nbytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _nodelay(transport)
        self.tr = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.mv[self.n :]

    def buffer_updated(self, nbytes: int) -> None:
        end = self.n + nbytes
        buf = self.buf
        unpack = _U32.unpack_from
        pos = 0
        count = 0
        payload = 0
        while end - pos >= 4:
            ln = unpack(buf, pos)[0]
            if ln == END32:
                self.msgs += count
                self.nbytes += payload
                count = payload = 0
                self.tr.write(_ACK.pack(self.msgs, self.nbytes))
                self.msgs = self.nbytes = 0
                pos += 4
                continue
            stop = pos + 4 + ln
            if stop > end:
                break
            pos = stop
            count += 1
            payload += ln
        self.msgs += count
        self.nbytes += payload
        rem = end - pos
        if rem and pos:
            buf[:rem] = buf[pos:end]
        self.n = rem


class _RawSource(asyncio.BufferedProtocol):
    """Sender with flow control (pause/resume_writing) that reads a 16-byte ack."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.paused = False
        self._drain: asyncio.Future[None] | None = None
        self.ack_buf = bytearray(_ACK.size)
        self.ack_mv = memoryview(self.ack_buf)
        self.apos = 0
        self._ack: asyncio.Future[tuple[int, int]] | None = None
        self.lost: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _nodelay(transport)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        d = self._drain
        if d is not None and not d.done():
            d.set_result(None)

    async def drain(self) -> None:
        if self.lost is not None:
            raise ConnectionError(f"connection lost: {self.lost}")
        if self.paused:
            self._drain = self.loop.create_future()
            await self._drain

    def expect_ack(self) -> asyncio.Future[tuple[int, int]]:
        self._ack = self.loop.create_future()
        return self._ack

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.ack_mv[self.apos :]

    def buffer_updated(self, nbytes: int) -> None:
        self.apos += nbytes
        if self.apos == _ACK.size:
            self.apos = 0
            a = self._ack
            if a is not None and not a.done():
                a.set_result(_ACK.unpack(self.ack_buf))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionError("closed")
        for f in (self._drain, self._ack):
            if f is not None and not f.done():
                f.set_exception(ConnectionError(f"connection lost: {exc}"))


async def raw_server(ready: Callable[[dict[str, Any]], None]) -> None:
    loop = asyncio.get_running_loop()
    servers = {
        "lat": await loop.create_server(_RawEcho, HOST, 0),
        "tp": await loop.create_server(_RawSink, HOST, 0),
        "rate": await loop.create_server(_RawCounter, HOST, 0),
    }
    ready({k: s.sockets[0].getsockname()[1] for k, s in servers.items()})
    await asyncio.Event().wait()


async def raw_client(info: dict[str, Any], p: Params) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    out = Results()

    async def lat() -> None:
        tr, proto = await loop.create_connection(_RawPing, HOST, info["lat"])
        msg = _U32.pack(SMALL) + payload_small()
        write = tr.write
        create_future = loop.create_future
        clock = time.perf_counter_ns
        samples: list[int] = []
        append = samples.append
        deadline = time.monotonic() + p.lat_max_seconds
        for i in range(p.lat_warmup + p.lat_count):
            fut = proto.waiter = create_future()
            t0 = clock()
            write(msg)
            await fut
            t1 = clock()
            if i >= p.lat_warmup:
                append(t1 - t0)
                if (i & 255) == 0 and time.monotonic() > deadline:
                    break
        tr.close()
        out.latency(samples)

    async def tp(key: str) -> None:
        size = SIZES[key]
        arr = make_array(size)
        body = memoryview(arr).cast("B")
        hdr = _U64.pack(size)
        end = _U64.pack(END64)
        tr, proto = await loop.create_connection(_RawSource, HOST, info["tp"])

        async def round_(n: int) -> float:
            ack = proto.expect_ack()
            t0 = time.perf_counter()
            for _ in range(n):
                tr.writelines((hdr, body))
                if proto.paused:
                    await proto.drain()
            tr.write(end)
            msgs, nbytes = await ack
            dt = time.perf_counter() - t0
            if msgs != n or nbytes != n * size:
                raise RuntimeError(f"receiver got {msgs} msgs/{nbytes} B, expected {n}/{n * size}")
            return dt

        await round_(p.tp_warmup_msgs[key])
        n = max(1, p.tp_bytes[key] // size)
        dt = await round_(n)
        tr.close()
        out.set(f"tp_{key}_gbps", n * size / dt / 1e9)

    async def rate() -> None:
        tr, proto = await loop.create_connection(_RawSource, HOST, info["rate"])
        frame = _U32.pack(SMALL) + payload_small()
        batch = [frame] * p.rate_batch
        end = _U32.pack(END32)
        writelines = tr.writelines

        async def round_(seconds: float) -> tuple[int, float]:
            ack = proto.expect_ack()
            sent = 0
            t0 = time.perf_counter()
            deadline = t0 + seconds
            while True:
                writelines(batch)
                sent += p.rate_batch
                if proto.paused:
                    await proto.drain()
                if time.perf_counter() >= deadline:
                    break
            tr.write(end)
            msgs, _ = await ack
            dt = time.perf_counter() - t0
            if msgs != sent:
                raise RuntimeError(f"receiver counted {msgs}, sent {sent}")
            return sent, dt

        await round_(p.rate_warmup_seconds)
        sent, dt = await round_(p.rate_seconds)
        tr.close()
        out.set("rate_64b_msgs_s", sent / dt)

    await out.run("lat", lat(), p.lat_max_seconds + 30)
    for key in SIZES:
        await out.run(f"tp_{key}", tp(key), p.tp_max_seconds)
    await out.run("rate", rate(), p.rate_seconds + 30)
    return out.as_dict()


# =========================================================================== pyzmq


def pyzmq_server(ready: Callable[[dict[str, Any]], None]) -> None:
    import zmq
    import zmq.asyncio

    ctx = zmq.Context()

    def bind(kind: int) -> tuple[Any, int]:
        s = ctx.socket(kind)
        s.linger = 0
        s.bind(f"tcp://{HOST}:0")
        return s, int(s.last_endpoint.decode().rsplit(":", 1)[1])

    rep, rep_port = bind(zmq.REP)
    sink, sink_port = bind(zmq.DEALER)

    def rep_loop() -> None:
        recv, send = rep.recv, rep.send
        while True:
            send(recv())

    def sink_loop() -> None:
        msgs = nbytes = 0
        while True:
            frame = sink.recv(copy=False)
            n = len(frame)
            if n == 0:
                sink.send(_ACK.pack(msgs, nbytes))
                msgs = nbytes = 0
            else:
                msgs += 1
                nbytes += n

    for target in (rep_loop, sink_loop):
        threading.Thread(target=target, daemon=True).start()

    async def rate_server() -> None:
        actx = zmq.asyncio.Context.shadow(ctx)
        asock = actx.socket(zmq.DEALER)
        asock.linger = 0
        asock.bind(f"tcp://{HOST}:0")
        port = int(asock.last_endpoint.decode().rsplit(":", 1)[1])
        sync = zmq.Socket.shadow(asock.underlying)  # NOBLOCK drains without a future per message
        ready({"lat": rep_port, "tp": sink_port, "rate": port})
        recv = sync.recv
        msgs = nbytes = 0
        while True:
            await asock.poll(zmq.POLLIN)
            while True:
                try:
                    m = recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if m:
                    msgs += 1
                    nbytes += len(m)
                else:
                    sync.send(_ACK.pack(msgs, nbytes))
                    msgs = nbytes = 0

    C.run_async(rate_server())


def pyzmq_client(info: dict[str, Any], p: Params) -> dict[str, Any]:
    import zmq
    import zmq.asyncio

    out = Results()
    ctx = zmq.Context()
    timeout_ms = int(max(p.tp_max_seconds, 30) * 1000)

    def sock(kind: int, port: int) -> Any:
        s = ctx.socket(kind)
        s.linger = 0
        s.rcvtimeo = timeout_ms
        s.sndtimeo = timeout_ms
        s.connect(f"tcp://{HOST}:{port}")
        return s

    def lat() -> None:
        s = sock(zmq.REQ, info["lat"])
        msg = payload_small()
        send, recv = s.send, s.recv
        clock = time.perf_counter_ns
        samples: list[int] = []
        deadline = time.monotonic() + p.lat_max_seconds
        for i in range(p.lat_warmup + p.lat_count):
            t0 = clock()
            send(msg)
            recv()
            t1 = clock()
            if i >= p.lat_warmup:
                samples.append(t1 - t0)
                if (i & 255) == 0 and time.monotonic() > deadline:
                    break
        s.close()
        out.latency(samples)

    def tp(key: str) -> None:
        size = SIZES[key]
        arr = make_array(size)
        s = sock(zmq.DEALER, info["tp"])

        def round_(n: int) -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                s.send(arr, copy=False)
            s.send(b"")
            msgs, nbytes = _ACK.unpack(s.recv())
            dt = time.perf_counter() - t0
            if msgs != n or nbytes != n * size:
                raise RuntimeError(f"receiver got {msgs} msgs/{nbytes} B, expected {n}/{n * size}")
            return dt

        round_(p.tp_warmup_msgs[key])
        n = max(1, p.tp_bytes[key] // size)
        dt = round_(n)
        s.close()
        out.set(f"tp_{key}_gbps", n * size / dt / 1e9)

    async def rate() -> None:
        actx = zmq.asyncio.Context.shadow(ctx)
        asock = actx.socket(zmq.DEALER)
        asock.linger = 0
        asock.connect(f"tcp://{HOST}:{info['rate']}")
        sync = zmq.Socket.shadow(asock.underlying)
        msg = payload_small()
        send = sync.send
        noblock = zmq.NOBLOCK

        async def round_(seconds: float) -> tuple[int, float]:
            sent = 0
            t0 = time.perf_counter()
            deadline = t0 + seconds
            while True:
                for _ in range(p.rate_batch):
                    try:
                        send(msg, noblock)
                    except zmq.Again:
                        await asock.poll(zmq.POLLOUT)
                        send(msg)  # writable now (HWM has room)
                    sent += 1
                if time.perf_counter() >= deadline:
                    break
            await asock.send(b"")
            msgs, _ = _ACK.unpack(await asock.recv())
            dt = time.perf_counter() - t0
            if msgs != sent:
                raise RuntimeError(f"receiver counted {msgs}, sent {sent}")
            return sent, dt

        await round_(p.rate_warmup_seconds)
        sent, dt = await round_(p.rate_seconds)
        asock.close()
        out.set("rate_64b_msgs_s", sent / dt)

    out.run_sync("lat", lat)
    for key in SIZES:
        out.run_sync(f"tp_{key}", lambda key=key: tp(key))
    out.run_sync("rate", lambda: C.run_async(asyncio.wait_for(rate(), p.rate_seconds + 30)))
    ctx.destroy(linger=0)
    return out.as_dict()


# =========================================================================== dask comm


async def dask_server(ready: Callable[[dict[str, Any]], None]) -> None:
    from distributed.comm import listen

    async def handle(comm: Any) -> None:
        try:
            mode = (await comm.read())["mode"]
            if mode == "lat":
                while True:
                    await comm.write(await comm.read())
            msgs = nbytes = 0
            while True:
                msg = await comm.read()
                if isinstance(msg, dict) and msg.get("op") == "end":
                    await comm.write({"msgs": msgs, "bytes": nbytes})
                    msgs = nbytes = 0
                elif mode == "tp":
                    msgs += 1
                    nbytes += msg["x"].nbytes
                else:
                    msgs += 1
                    nbytes += len(msg)
        except Exception as exc:  # CommClosedError at the end of each client connection
            C.log(f"dask comm handler ended: {type(exc).__name__}: {exc}")

    listener = listen(f"tcp://{HOST}:0", handle)
    await listener.start()
    ready({"address": listener.contact_address})
    await asyncio.Event().wait()


async def dask_client(info: dict[str, Any], p: Params) -> dict[str, Any]:
    from distributed.comm import connect
    from distributed.protocol import to_serialize

    out = Results()
    addr = info["address"]

    async def open_(mode: str) -> Any:
        comm = await connect(addr, timeout=30)
        await comm.write({"mode": mode})
        return comm

    async def lat() -> None:
        comm = await open_("lat")
        msg = payload_small()
        clock = time.perf_counter_ns
        samples: list[int] = []
        deadline = time.monotonic() + p.lat_max_seconds
        for i in range(p.lat_warmup + p.lat_count):
            t0 = clock()
            await comm.write(msg)
            await comm.read()
            t1 = clock()
            if i >= p.lat_warmup:
                samples.append(t1 - t0)
                if (i & 255) == 0 and time.monotonic() > deadline:
                    break
        await comm.close()
        out.latency(samples)

    async def tp(key: str) -> None:
        size = SIZES[key]
        arr = make_array(size)
        comm = await open_("tp")

        async def round_(n: int) -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                await comm.write({"x": to_serialize(arr)})
            await comm.write({"op": "end"})
            ack = await comm.read()
            dt = time.perf_counter() - t0
            if ack["msgs"] != n or ack["bytes"] != n * size:
                raise RuntimeError(f"receiver got {ack}, expected {n}/{n * size}")
            return dt

        await round_(p.tp_warmup_msgs[key])
        n = max(1, p.tp_bytes[key] // size)
        dt = await round_(n)
        await comm.close()
        out.set(f"tp_{key}_gbps", n * size / dt / 1e9)

    async def rate() -> None:
        comm = await open_("rate")
        msg = payload_small()

        async def round_(seconds: float) -> tuple[int, float]:
            sent = 0
            t0 = time.perf_counter()
            deadline = t0 + seconds
            while True:
                for _ in range(64):
                    await comm.write(msg)
                sent += 64
                if time.perf_counter() >= deadline:
                    break
            await comm.write({"op": "end"})
            ack = await comm.read()
            dt = time.perf_counter() - t0
            if ack["msgs"] != sent:
                raise RuntimeError(f"receiver counted {ack['msgs']}, sent {sent}")
            return sent, dt

        await round_(p.rate_warmup_seconds)
        sent, dt = await round_(p.rate_seconds)
        await comm.close()
        out.set("rate_64b_msgs_s", sent / dt)

    await out.run("lat", lat(), p.lat_max_seconds + 30)
    for key in SIZES:
        await out.run(f"tp_{key}", tp(key), p.tp_max_seconds)
    await out.run("rate", rate(), p.rate_seconds + 30)
    return out.as_dict()


# =========================================================================== aionet


def aionet_listen_url(scheme: str, role: str) -> str:
    if scheme == "inproc":
        return f"inproc://bench-{role}-{os.getpid()}"
    if scheme.endswith("+ipc") or scheme == "ipc":
        return f"{scheme}:///tmp/aionet-bench-{os.getpid()}-{role}"
    return f"{scheme}://{HOST}:0"


def aionet_unavailable_reason() -> str | None:
    try:
        import aionet

        aionet.Node  # noqa: B018
    except Exception as exc:
        return f"aionet.Node not available: {type(exc).__name__}: {exc}"
    return None


def _nbytes(obj: Any) -> int:
    n = getattr(obj, "nbytes", None)
    return int(n) if n is not None else len(obj)


def aionet_server_setup(srv: Any) -> list[asyncio.Task[None]]:
    """Register the benchmark services and start the counting consumers on ``srv``."""
    counters = {"tp": [0, 0], "rate": [0, 0]}  # messages, bytes (cumulative)
    waiters: dict[str, tuple[int, asyncio.Future[None]]] = {}
    # receiver-side clock per channel: [time of the first batch since bench.wait with reset, of the last]
    clock: dict[str, list[float]] = {"tp": [0.0, 0.0], "rate": [0.0, 0.0]}

    @srv.service("bench.echo")
    async def echo(x: Any) -> Any:
        return x

    @srv.service("bench.wait")
    async def wait(req: dict[str, Any]) -> dict[str, int]:
        """Reply once the consumer of ``req['chan']`` has received ``req['msgs']`` in total."""
        chan, target = req["chan"], int(req["msgs"])
        c = counters[chan]
        if c[0] < target:
            fut = asyncio.get_running_loop().create_future()
            waiters[chan] = (target, fut)
            await fut
        t = clock[chan]
        out = {"msgs": c[0], "bytes": c[1], "rx_seconds": t[1] - t[0]}
        if req.get("reset"):
            t[0] = 0.0  # the next batch starts the receiver's clock for the next round
        return out

    async def consume(chan: str) -> None:
        c = counters[chan]
        t = clock[chan]
        batch = getattr(srv, "recv_batch", None)
        now = time.perf_counter
        while True:
            msgs = await batch(chan) if batch is not None else [await srv.recv(chan)]
            t[1] = now()
            if not t[0]:
                t[0] = t[1]
            nb = 0
            for m in msgs:
                nb += _nbytes(m)
            c[0] += len(msgs)
            c[1] += nb
            w = waiters.get(chan)
            if w is not None and c[0] >= w[0]:
                del waiters[chan]
                if not w[1].done():
                    w[1].set_result(None)

    return [asyncio.get_running_loop().create_task(consume(ch)) for ch in counters]


async def aionet_server(ready: Callable[[dict[str, Any]], None], scheme: str) -> None:
    import aionet

    async with aionet.Node(name="srv", listen=aionet_listen_url(scheme, "srv")) as srv:
        tasks = aionet_server_setup(srv)
        ready({"url": srv.address})
        try:
            await asyncio.Event().wait()
        finally:
            for t in tasks:
                t.cancel()


async def aionet_client_session(cli: Any, p: Params) -> dict[str, Any]:
    out = Results()
    counts = {"tp": 0, "rate": 0}

    async def connect() -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                await cli.request("srv", "bench.echo", b"hello", timeout=2)
                return
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cannot reach srv: {type(exc).__name__}: {exc}") from exc
                await asyncio.sleep(0.1)

    async def ack(chan: str, sent: int, reset: bool = False) -> dict[str, Any]:
        counts[chan] += sent
        req = {"chan": chan, "msgs": counts[chan], "reset": reset}
        return await cli.request("srv", "bench.wait", req, timeout=120)

    async def lat() -> None:
        msg = payload_small()
        request = cli.request
        clock = time.perf_counter_ns
        samples: list[int] = []
        deadline = time.monotonic() + p.lat_max_seconds
        for i in range(p.lat_warmup + p.lat_count):
            t0 = clock()
            await request("srv", "bench.echo", msg, timeout=5)
            t1 = clock()
            if i >= p.lat_warmup:
                samples.append(t1 - t0)
                if (i & 255) == 0 and time.monotonic() > deadline:
                    break
        out.latency(samples)

    async def tp(key: str, readonly: bool = False) -> None:
        size = SIZES[key]
        arr = make_array(size)
        arr.flags.writeable = not readonly
        send = cli.send

        async def round_(n: int) -> float:
            before = await ack("tp", 0)
            t0 = time.perf_counter()
            for _ in range(n):
                await send("srv", "tp", arr)
            got = await ack("tp", n)
            dt = time.perf_counter() - t0
            if got["bytes"] - before["bytes"] != n * size:
                raise RuntimeError(f"receiver got {got['bytes'] - before['bytes']} B, expected {n * size}")
            return dt

        await round_(p.tp_warmup_msgs[key])
        n = max(1, p.tp_bytes[key] // size)
        dt = await round_(n)
        out.set(f"tp_{key}{'_ro' if readonly else ''}_gbps", n * size / dt / 1e9)

    async def rate() -> None:
        from aionet import WouldBlock

        msg = payload_small()
        send = cli.send
        send_nowait = getattr(cli, "send_nowait", None)
        send_many = getattr(cli, "send_many", None)
        chunk = [msg] * 256

        async def burst(api: str) -> int:
            """One burst of messages through ``api``; returns how many."""
            if api == "send":
                for _ in range(256):
                    await send("srv", "rate", msg)
            elif api == "nowait":
                i = 0
                while i < 256:
                    try:
                        send_nowait("srv", "rate", msg)
                        i += 1
                    except WouldBlock:
                        await cli.wait_space("srv")
            else:
                await send_many("srv", "rate", chunk)
            return 256

        async def round_(seconds: float, api: str) -> tuple[int, float, float]:
            await ack("rate", 0, reset=True)  # the receiver's clock starts at the next message
            sent = 0
            t0 = time.perf_counter()
            deadline = t0 + seconds
            while True:
                sent += await burst(api)
                if time.perf_counter() >= deadline:
                    break
            got = await ack("rate", sent)
            return sent, time.perf_counter() - t0, got["rx_seconds"]

        await round_(p.rate_warmup_seconds, "send")
        sent, dt, rx = await round_(p.rate_seconds, "send")
        out.set("rate_64b_msgs_s", sent / dt)
        out.set("rate_64b_rx_msgs_s", sent / rx)
        if send_nowait is not None:
            sent, dt, rx = await round_(p.rate_seconds, "nowait")
            out.set("rate_64b_nowait_msgs_s", sent / rx)
        if send_many is not None:
            sent, dt, rx = await round_(p.rate_seconds, "many")
            out.set("rate_64b_many_msgs_s", sent / rx)

    async def inflight() -> None:
        """Requests per second with 64 outstanding at all times (pipelined on one link)."""
        msg = payload_small()
        request = cli.request
        done = [0]

        async def worker(deadline: float) -> None:
            while time.perf_counter() < deadline:
                await request("srv", "bench.echo", msg, timeout=30)
                done[0] += 1

        async def round_(seconds: float) -> float:
            done[0] = 0
            t0 = time.perf_counter()
            await asyncio.gather(*(worker(t0 + seconds) for _ in range(64)))
            return done[0] / (time.perf_counter() - t0)

        await round_(p.rate_warmup_seconds)
        out.set("req_64_inflight_per_s", await round_(p.rate_seconds))

    await out.run("connect", connect(), 40)
    if "connect" in out.errors:
        return out.as_dict()
    await out.run("lat", lat(), p.lat_max_seconds + 30)
    for key in SIZES:
        await out.run(f"tp_{key}", tp(key), p.tp_max_seconds)
    await out.run("tp_1mib_ro", tp("1mib", readonly=True), p.tp_max_seconds)
    await out.run("rate", rate(), 3 * p.rate_seconds + 30)
    await out.run("inflight", inflight(), p.rate_seconds + 30)
    return out.as_dict()


async def aionet_client(info: dict[str, Any], p: Params, scheme: str) -> dict[str, Any]:
    import aionet

    async with aionet.Node(name="cli", listen=aionet_listen_url(scheme, "cli"), join=[info["url"]]) as cli:
        return await aionet_client_session(cli, p)


async def aionet_both(p: Params, scheme: str) -> dict[str, Any]:
    """Both nodes in this one process (for in-process transports such as inproc://)."""
    import aionet

    async with aionet.Node(name="srv", listen=aionet_listen_url(scheme, "srv")) as srv:
        tasks = aionet_server_setup(srv)
        try:
            async with aionet.Node(name="cli", listen=aionet_listen_url(scheme, "cli"), join=[srv.address]) as cli:
                return await aionet_client_session(cli, p)
        finally:
            for t in tasks:
                t.cancel()


# =========================================================================== per-session results


class Results:
    """What a client session measured, plus per-metric errors (one failure does not stop the rest)."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}
        self.detail: dict[str, Any] = {}
        self.errors: dict[str, str] = {}

    def set(self, key: str, value: float) -> None:
        self.metrics[key] = float(value)

    def latency(self, samples_ns: list[int]) -> None:
        st = C.latency_stats_us(samples_ns)
        self.detail["latency_us"] = st
        self.set("lat_p50_us", st["p50"])
        self.set("lat_p99_us", st["p99"])

    async def run(self, name: str, coro: Any, timeout: float) -> None:
        try:
            await asyncio.wait_for(coro, timeout)
        except TimeoutError:
            self.errors[name] = f"timed out after {timeout:.0f}s"
        except Exception as exc:
            self.errors[name] = f"{type(exc).__name__}: {exc}"[:300]

    def run_sync(self, name: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as exc:
            self.errors[name] = f"{type(exc).__name__}: {exc}"[:300]

    def as_dict(self) -> dict[str, Any]:
        return {"metrics": self.metrics, "detail": self.detail, "errors": self.errors}


# =========================================================================== child entry points


def split_impl(impl: str) -> tuple[str, str | None]:
    name, _, scheme = impl.partition(":")
    return name, scheme or None


def child_server(impl: str) -> None:
    name, scheme = split_impl(impl)

    def ready(info: dict[str, Any]) -> None:
        C.emit("READY", info)

    try:
        if name == "raw":
            C.run_async(raw_server(ready))
        elif name == "pyzmq":
            import zmq  # noqa: F401

            pyzmq_server(ready)
        elif name == "dask":
            import distributed.comm  # noqa: F401

            C.run_async(dask_server(ready))
        elif name == "aionet":
            why = aionet_unavailable_reason()
            if why:
                C.emit("READY", {"unavailable": why})
                return
            C.run_async(aionet_server(ready, scheme or "tcp"))
        else:
            raise SystemExit(f"unknown impl {impl!r}")
    except ImportError as exc:
        C.emit("READY", {"unavailable": f"{type(exc).__name__}: {exc}"})
    except Exception as exc:
        C.emit("READY", {"unavailable": f"server failed: {type(exc).__name__}: {exc}"[:400]})
        raise


def child_client(impl: str, info: dict[str, Any], p: Params) -> None:
    try:
        _child_client(impl, info, p)
    except Exception as exc:
        C.emit("RESULT", {"metrics": {}, "errors": {"session": f"{type(exc).__name__}: {exc}"[:400]}})
        raise


def _child_client(impl: str, info: dict[str, Any], p: Params) -> None:
    name, scheme = split_impl(impl)
    if name == "raw":
        res = C.run_async(raw_client(info, p))
    elif name == "pyzmq":
        res = pyzmq_client(info, p)
    elif name == "dask":
        res = C.run_async(dask_client(info, p))
    elif name == "aionet":
        why = aionet_unavailable_reason()
        if why:
            C.emit("RESULT", {"unavailable": why})
            return
        if info.get("same_process"):
            res = C.run_async(aionet_both(p, scheme or "tcp"))
        else:
            res = C.run_async(aionet_client(info, p, scheme or "tcp"))
    else:
        raise SystemExit(f"unknown impl {impl!r}")
    C.emit("RESULT", res)


IN_PROCESS_SCHEMES = {"inproc"}


# =========================================================================== orchestration


def run_session(impl: str, p: Params, verbose: bool) -> dict[str, Any]:
    """One fresh server process + one fresh client process; returns the client's RESULT."""
    name, scheme = split_impl(impl)
    params = json.dumps(asdict(p))
    children: list[C.Child] = []
    try:
        if name == "aionet" and scheme in IN_PROCESS_SCHEMES:
            info: dict[str, Any] = {"same_process": True}
        else:
            server = C.Child(
                C.python_argv(SCRIPT, "--_role", "server", "--_impl", impl, "--_ppid", str(os.getpid())),
                label=f"{impl.replace(':', '-').replace('+', '-')}-server",
            )
            children.append(server)
            info = server.expect("READY", timeout=90)
            if "unavailable" in info:
                return {"unavailable": info["unavailable"]}
        client = C.Child(
            C.python_argv(
                SCRIPT,
                "--_role",
                "client",
                "--_impl",
                impl,
                "--_ppid",
                str(os.getpid()),
                "--_info",
                json.dumps(info),
                "--_params",
                params,
            ),
            label=f"{impl.replace(':', '-').replace('+', '-')}-client",
        )
        children.append(client)
        try:
            res = client.expect("RESULT", timeout=p.session_timeout())
        except C.ChildError as exc:
            res = {"metrics": {}, "errors": {"session": str(exc)}}
        for ch in children:
            if not ch.alive() and ch is not client:
                res.setdefault("errors", {})["server"] = f"server died: {ch.last_error_line()}"
        if verbose or res.get("errors"):
            for ch in children:
                tail = ch.log_tail(8)
                if tail and (verbose or res.get("errors")):
                    print(f"--- log tail of {ch.label} (pid {ch.pid}) ---\n{tail}", file=sys.stderr)
        return res
    except C.ChildError as exc:
        return {"metrics": {}, "errors": {"session": str(exc)}}
    finally:
        for ch in children:
            ch.kill()
            if not verbose:
                ch.remove_log()


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def build_bars(scheme: str, agg: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    def med(impl: str, metric: str) -> float | None:
        return (agg.get(impl, {}).get(metric) or {}).get("median")

    a = f"aionet:{scheme}"
    bars: list[dict[str, Any]] = []

    def bar(name: str, value: float | None, limit: float, higher: bool, unit: str, basis: str) -> None:
        status = "n/a" if value is None else "PASS" if (value >= limit if higher else value <= limit) else "FAIL"
        bars.append(
            {
                "transport": scheme,
                "bar": name,
                "value": value,
                "limit": limit,
                "op": ">=" if higher else "<=",
                "unit": unit,
                "basis": basis,
                "status": status,
            }
        )

    bar("req/rep p50 <= 1.5x raw", ratio(med(a, "lat_p50_us"), med("raw", "lat_p50_us")), 1.5, False, "x", "raw")
    for key, what in (("tp_1mib_gbps", "1 MiB"), ("tp_1mib_ro_gbps", "1 MiB read-only")):
        bar(f"{what} throughput >= 0.85x raw", ratio(med(a, key), med("raw", "tp_1mib_gbps")), 0.85, True, "x", "raw")
    bar(
        "64 MiB throughput >= 0.9x raw",
        ratio(med(a, "tp_64mib_gbps"), med("raw", "tp_64mib_gbps")),
        0.9,
        True,
        "x",
        "raw",
    )
    bar("64 B send rate >= 500k msgs/s", med(a, "rate_64b_msgs_s"), 500_000, True, "msgs/s", "absolute")
    for key, api in (("rate_64b_rx_msgs_s", "send"), ("rate_64b_nowait_msgs_s", "send_nowait")):
        bar(f"64 B {api} rate at receiver >= 500k msgs/s", med(a, key), 500_000, True, "msgs/s", "absolute")
        bar(
            f"64 B {api} rate at receiver >= 1x pyzmq",
            ratio(med(a, key), med("pyzmq", "rate_64b_msgs_s")),
            1.0,
            True,
            "x",
            "pyzmq",
        )
    bar("requests/s with 64 in flight >= 50k", med(a, "req_64_inflight_per_s"), 50_000, True, "req/s", "absolute")
    if scheme.startswith("zmq"):
        bar(
            "64 B send rate >= pyzmq zmq.asyncio poll-then-drain",
            ratio(med(a, "rate_64b_msgs_s"), med("pyzmq", "rate_64b_msgs_s")),
            1.0,
            True,
            "x",
            "pyzmq",
        )
        bar(
            "req/rep p50 <= 1.2x pyzmq sync REQ/REP",
            ratio(med(a, "lat_p50_us"), med("pyzmq", "lat_p50_us")),
            1.2,
            False,
            "x",
            "pyzmq",
        )
        bar(
            "64 MiB throughput >= 0.9x pyzmq copy=False",
            ratio(med(a, "tp_64mib_gbps"), med("pyzmq", "tp_64mib_gbps")),
            0.9,
            True,
            "x",
            "pyzmq",
        )
    return bars


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--transport", default="tcp", help="comma list of aionet transports (default: tcp)")
    ap.add_argument(
        "--repeat", type=int, default=None, help="fresh process pairs per implementation (default 3; 2 with --quick)"
    )
    ap.add_argument("--quick", action="store_true", help="~30 s smoke run: fewer round trips, smaller volumes")
    ap.add_argument(
        "--impls",
        default=",".join(IMPLS),
        help=f"comma list of implementations to run (default: {','.join(IMPLS)})",
    )
    ap.add_argument("--json", default=str(C.RESULTS_DIR / "p2p.json"), help="where to write the JSON results")
    ap.add_argument("--plain", action="store_true", help="plain-text tables instead of rich")
    ap.add_argument("--strict", action="store_true", help="exit 1 if a bar fails or aionet is unavailable")
    ap.add_argument("-v", "--verbose", action="store_true", help="show child logs")
    # internal: child roles
    ap.add_argument("--_role", help=argparse.SUPPRESS)
    ap.add_argument("--_impl", help=argparse.SUPPRESS)
    ap.add_argument("--_info", help=argparse.SUPPRESS)
    ap.add_argument("--_params", help=argparse.SUPPRESS)
    ap.add_argument("--_ppid", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._role:
        signal.signal(signal.SIGINT, lambda *_: os._exit(130))
        if args._ppid:
            C.parent_watchdog(args._ppid)
        if args._role == "server":
            C.hard_deadline(3600)
            child_server(args._impl)
            return 0
        p = Params(**json.loads(args._params))
        C.hard_deadline(p.session_timeout() + 30)
        child_client(args._impl, json.loads(args._info), p)
        return 0

    C.install_cleanup()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    p = Params.quick() if args.quick else Params()
    repeat = args.repeat if args.repeat is not None else (2 if args.quick else 3)
    schemes = [s.strip() for s in args.transport.split(",") if s.strip()]
    wanted = [s.strip() for s in args.impls.split(",") if s.strip()]
    unknown = set(wanted) - set(IMPLS)
    if unknown:
        ap.error(f"unknown implementation(s): {', '.join(sorted(unknown))}")
    impls = [i for i in wanted if i != "aionet"]
    if "aionet" in wanted:
        impls += [f"aionet:{s}" for s in schemes]

    started = time.monotonic()
    raw_runs: dict[str, list[dict[str, Any]]] = {i: [] for i in impls}
    unavailable: dict[str, str] = {}
    print(
        f"p2p benchmark: {len(impls)} implementations x {repeat} repeats "
        f"({'quick' if args.quick else 'full'}), {os.cpu_count()} CPUs, loadavg "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    try:
        for rep in range(repeat):
            # rotate the order each repeat so slow drift on a shared machine spreads evenly
            order = impls[rep % len(impls) :] + impls[: rep % len(impls)]
            for impl in order:
                if impl in unavailable:
                    continue
                t0 = time.monotonic()
                res = run_session(impl, p, args.verbose)
                dt = time.monotonic() - t0
                if "unavailable" in res:
                    unavailable[impl] = res["unavailable"]
                    print(f"  [{rep + 1}/{repeat}] {impl:<16} n/a ({res['unavailable']})", flush=True)
                    continue
                raw_runs[impl].append(res)
                m = res.get("metrics", {})
                summary = "  ".join(f"{k}={C.fmt_num(m[k])}" for k in METRICS if k in m)
                print(f"  [{rep + 1}/{repeat}] {impl:<16} {dt:5.1f}s  {summary}", flush=True)
                for k, v in (res.get("errors") or {}).items():
                    print(f"      error in {k}: {v}", flush=True)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping children and reporting what was measured", file=sys.stderr)
    finally:
        C._cleanup_children()

    # aggregate
    agg: dict[str, dict[str, Any]] = {}
    for impl, runs in raw_runs.items():
        agg[impl] = {k: C.summarize(r.get("metrics", {}).get(k) for r in runs) for k in METRICS}

    all_bars: list[dict[str, Any]] = []
    tables: dict[str, list[dict[str, Any]]] = {}
    for scheme in schemes if "aionet" in wanted else [None]:
        a = f"aionet:{scheme}" if scheme else None
        cols = [
            "metric",
            f"aionet ({scheme})" if scheme else "aionet",
            "raw",
            "pyzmq",
            "dask",
            "aionet/raw",
            "aionet/pyzmq",
        ]
        rows: list[list[str]] = []
        trows: list[dict[str, Any]] = []
        for key, (label, unit, higher) in METRICS.items():

            def cell(impl: str | None, key: str = key) -> str:
                if impl is None or impl not in raw_runs:
                    return "-"
                if impl in unavailable:
                    return "n/a"
                return C.fmt_summary(agg[impl][key])

            def med(impl: str | None, key: str = key) -> float | None:
                if impl is None or impl not in agg:
                    return None
                return agg[impl][key]["median"]

            r_raw = ratio(med(a), med("raw"))
            r_zmq = ratio(med(a), med("pyzmq"))
            arrow = "higher is better" if higher else "lower is better"
            rows.append(
                [
                    f"{label} ({unit})",
                    cell(a),
                    cell("raw"),
                    cell("pyzmq"),
                    cell("dask"),
                    f"{r_raw:.2f}x" if r_raw is not None else "-",
                    f"{r_zmq:.2f}x" if r_zmq is not None else "-",
                ]
            )
            trows.append(
                {
                    "metric": key,
                    "label": label,
                    "unit": unit,
                    "better": arrow,
                    "aionet": agg.get(a, {}).get(key) if a else None,
                    "raw": agg.get("raw", {}).get(key),
                    "pyzmq": agg.get("pyzmq", {}).get(key),
                    "dask": agg.get("dask", {}).get(key),
                    "aionet_over_raw": r_raw,
                    "aionet_over_pyzmq": r_zmq,
                }
            )
        notes = [f"median (min-max) over {repeat} repeats, each a fresh process pair; GB = 1e9 B; us = microseconds"]
        if a and a in unavailable:
            notes.append(f"aionet: n/a ({unavailable[a]})")
        for impl in ("pyzmq", "dask"):
            if impl in unavailable:
                notes.append(f"{impl}: n/a ({unavailable[impl]})")
        errs = sorted(
            {
                f"{impl}: {k}: {v}"
                for impl in (a, "raw", "pyzmq", "dask")
                if impl
                for r in raw_runs.get(impl, [])
                for k, v in (r.get("errors") or {}).items()
            }
        )
        notes += [f"error {e}" for e in errs[:8]]
        title = f"aionet p2p over {scheme}://" if scheme else "p2p baselines"
        if scheme in IN_PROCESS_SCHEMES:
            title += "  (both aionet nodes in ONE process; baselines are two processes)"
        C.print_table(title, cols, rows, footer="\n".join(notes), plain=args.plain)
        tables[scheme or "-"] = trows
        if scheme:
            all_bars += build_bars(scheme, agg)

    if all_bars:
        brows = []
        for b in all_bars:
            v = b["value"]
            if v is None:
                shown = "-"
            elif b["unit"] == "x":
                shown = f"{v:.2f}x {b['basis']}"
            else:
                shown = f"{C.fmt_num(v)} {b['unit']}"
            brows.append([b["transport"], b["bar"], shown, b["status"]])
        C.print_table("bars (medians)", ["transport", "bar", "measured", "status"], brows, plain=args.plain)

    print("what each column ran:")
    for impl, what in WHAT.items():
        print(f"  {impl:<7} {what}")

    out = {
        "benchmark": "p2p",
        "environment": C.environment(),
        "config": {"quick": args.quick, "repeat": repeat, "transports": schemes, "params": asdict(p)},
        "unavailable": unavailable,
        "runs": raw_runs,
        "summary": agg,
        "tables": tables,
        "bars": all_bars,
        "elapsed_s": time.monotonic() - started,
    }
    path = C.write_json(args.json, out)
    print(f"\nwrote {path}  ({time.monotonic() - started:.0f}s total)")
    if args.strict:
        failed = any(b["status"] != "PASS" for b in all_bars) or any(i.startswith("aionet") for i in unavailable)
        return 1 if failed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
