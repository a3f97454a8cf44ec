"""Where a 64 B request round trip over tcp:// spends its time, hop by hop, against raw uvloop.

Two processes on 127.0.0.1 (uvloop). Both record ``perf_counter_ns`` (CLOCK_MONOTONIC: one
clock for both processes on one host) at: the caller's request, the socket write after it
(``TCPConnection.write_nowait`` / ``_flush`` returning), the server's read callback, its
handler (``--handler async``), its write, the client's read callback and the caller resumed.
It prints the median of each hop, then the same hops of a raw uvloop ping-pong (a protocol
that echoes in ``data_received``). A hop that costs more than raw's is where Python runs on
the round trip's critical path. The stamps themselves add about 1 us per hop.

    python3 benchmarks/tcp_rtt_stamps.py -n 5000 --handler async   # as p2p.py's latency row
    chrt -f 10 python3 benchmarks/tcp_rtt_stamps.py -n 5000 --handler sync

(``chrt -f 10``: real-time priority, near-quiet numbers on a shared machine.)
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HOPS = ("client: request -> write", "wire -> server read", "server: read -> write", "wire -> client read")
HOPS += ("client: read -> caller resumed", "round trip")
ns = time.perf_counter_ns


def _instrument(stamps: list[tuple[str, int]]) -> None:
    """Wrap the TCP connection's read callback and writes to record stamps."""
    from aionet.transports import tcp

    cls = tcp.TCPConnection
    read, write, flush = cls.buffer_updated, cls.write_nowait, cls._flush

    def buffer_updated(self: Any, n: int) -> None:
        stamps.append(("rd", ns()))
        read(self, n)
        stamps.append(("rd_end", ns()))

    def write_nowait(self: Any, frames: Any) -> Any:
        out = write(self, frames)
        stamps.append(("w", ns()))
        return out

    def _flush(self: Any) -> None:
        had = bool(self._wbuf or self._wlist)
        flush(self)
        if had:
            stamps.append(("w", ns()))

    cls.buffer_updated, cls.write_nowait, cls._flush = buffer_updated, write_nowait, _flush  # type: ignore[method-assign]


def _aionet_server(q: Any, handler: str) -> None:
    import uvloop

    import aionet

    stamps: list[tuple[str, int]] = []
    _instrument(stamps)

    async def main() -> None:
        async with aionet.Node(name="srv", listen="tcp://127.0.0.1:0") as srv:

            async def aecho(x: Any) -> Any:
                stamps.append(("h", ns()))
                return x

            srv.add_service("echo", aecho if handler == "async" else (lambda x: x))
            srv.add_service("stamps", lambda _x: list(stamps))
            srv.add_service("clear", lambda _x: stamps.clear())
            q.put(srv.address)
            await asyncio.Event().wait()

    uvloop.run(main())


async def _aionet_client(url: str, n: int) -> tuple[list[Any], list[Any]]:
    import aionet

    stamps: list[tuple[str, int]] = []
    _instrument(stamps)
    async with aionet.Node(name="cli", listen="tcp://127.0.0.1:0", join=[url]) as cli:
        msg = b"x" * 64
        for _ in range(2000):  # warm-up (and joining)
            await cli.request("srv", "echo", msg, timeout=5)
        await cli.request("srv", "clear", None)
        stamps.clear()
        for _ in range(n):
            stamps.append(("call", ns()))
            await cli.request("srv", "echo", msg, timeout=5)
            stamps.append(("back", ns()))
        mine = list(stamps)
        theirs = await cli.request("srv", "stamps", None)
    return mine, theirs


def _hops(client: list[Any], server: list[Any]) -> dict[str, list[int]]:
    """Per round trip: the client's first write and read after its call, the server's read
    and its first write after it."""
    trips: list[dict[str, int]] = []
    cur: dict[str, int] | None = None
    for e, t in client:
        if e == "call":
            cur = {"call": t}
        elif cur is not None and e == "back":
            cur["back"] = t
            trips.append(cur)
            cur = None
        elif cur is not None and e in ("w", "rd") and e not in cur:
            cur[e] = t
    srv: list[dict[str, int]] = []
    s: dict[str, int] | None = None
    for e, t in server:
        if e == "rd" and s is None:
            s = {"rd": t}
        elif s is not None and e not in s and e in ("w", "h", "rd_end"):
            s[e] = t
            if e == "w":
                srv.append(s)
                s = None
    reads = [x["rd"] for x in srv]
    out: dict[str, list[int]] = {h: [] for h in HOPS}
    for tr in trips:
        i = bisect.bisect_left(reads, tr["call"])
        if i == len(srv) or "w" not in tr or "rd" not in tr:
            continue
        sv = srv[i]
        for hop, v in zip(
            HOPS,
            (tr["w"] - tr["call"], sv["rd"] - tr["w"], sv["w"] - sv["rd"], tr["rd"] - sv["w"], tr["back"] - tr["rd"]),
            strict=False,
        ):
            out[hop].append(v)
        out["round trip"].append(tr["back"] - tr["call"])
    return out


# --------------------------------------------------------------------------- raw uvloop
class _RawServer(asyncio.Protocol):
    def __init__(self, stamps: list[tuple[int, int]]) -> None:
        self.stamps = stamps

    def connection_made(self, transport: Any) -> None:
        self.t = transport

    def data_received(self, data: bytes) -> None:
        t0 = ns()
        if data == b"stamps":
            self.t.write(repr(self.stamps).encode() + b"\n")
            return
        self.t.write(data)
        self.stamps.append((t0, ns()))


def _raw_server(q: Any) -> None:
    import uvloop

    async def main() -> None:
        stamps: list[tuple[int, int]] = []
        server = await asyncio.get_running_loop().create_server(lambda: _RawServer(stamps), "127.0.0.1", 0)
        q.put(server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    uvloop.run(main())


class _RawClient(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.t = transport
        self.buf = b""
        self.dump = False
        self.rd = 0

    def data_received(self, data: bytes) -> None:
        self.rd = ns()
        if self.dump:
            self.buf += data
            if not data.endswith(b"\n"):
                return
            data = self.buf
        self.fut.set_result(data)


async def _raw_client(port: int, n: int) -> dict[str, list[int]]:
    import ast

    loop = asyncio.get_running_loop()
    t, p = await loop.create_connection(_RawClient, "127.0.0.1", port)
    trips = []
    msg = b"x" * 64
    for i in range(2000 + n):
        p.fut = loop.create_future()
        t0 = ns()
        t.write(msg)
        t1 = ns()
        await p.fut
        t2 = ns()
        if i >= 2000:
            trips.append((t0, t1, p.rd, t2))
    p.dump = True
    p.fut = loop.create_future()
    t.write(b"stamps")
    server = ast.literal_eval((await p.fut).decode())
    reads = [x[0] for x in server]
    out: dict[str, list[int]] = {h: [] for h in HOPS}
    for t0, t1, rd, t2 in trips:
        i = bisect.bisect_left(reads, t0)
        if i == len(server):
            continue
        a, b = server[i]
        for hop, v in zip(HOPS, (t1 - t0, a - t1, b - a, rd - b, t2 - rd, t2 - t0), strict=True):
            out[hop].append(v)
    t.close()
    return out


def _run(target: Any, args: tuple[Any, ...], client: Any) -> Any:
    import uvloop

    q: Any = mp.Queue()
    proc = mp.Process(target=target, args=(q, *args), daemon=True)
    proc.start()
    try:
        return uvloop.run(client(q.get(timeout=60)))
    finally:
        proc.kill()
        proc.join(5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5000, help="measured round trips")
    ap.add_argument("--handler", choices=("async", "sync"), default="async", help="the server's echo service")
    args = ap.parse_args()

    async def aionet_client(url: str) -> tuple[list[Any], list[Any]]:
        return await _aionet_client(url, args.n)

    async def raw_client(port: int) -> dict[str, list[int]]:
        return await _raw_client(port, args.n)

    mine, theirs = _run(_aionet_server, (args.handler,), aionet_client)
    ours = _hops(mine, theirs)
    raw = _run(_raw_server, (), raw_client)
    print(f"median per hop, us ({args.n} round trips, {args.handler} echo handler)")
    print(f"{'hop':32s} {'aionet':>8s} {'raw':>8s}")
    for hop in HOPS:
        print(f"{hop:32s} {statistics.median(ours[hop]) / 1e3:8.1f} {statistics.median(raw[hop]) / 1e3:8.1f}")
    srv = _server_handler_hops(theirs)
    if srv:
        cb, hop, rest = (statistics.median(x) / 1e3 for x in zip(*srv, strict=True))
        print(f"server (async handler): read callback {cb:.1f}, to the handler {hop:.1f}, handler to write {rest:.1f}")


def _server_handler_hops(server: list[Any]) -> list[tuple[int, int, int]]:
    """(read callback, read end -> handler, handler -> write) per request of an async handler."""
    out = []
    s: dict[str, int] | None = None
    for e, t in server:
        if e == "rd" and s is None:
            s = {"rd": t}
        elif s is not None and e not in s and e in ("w", "h", "rd_end"):
            s[e] = t
            if e == "w":
                if "h" in s and "rd_end" in s and s["rd_end"] < s["h"]:
                    out.append((s["rd_end"] - s["rd"], s["h"] - s["rd_end"], s["w"] - s["h"]))
                s = None
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
