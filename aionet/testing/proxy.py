"""A loopback TCP proxy that injects faults: cut, reset, stall, delay.

The kernel here has no netem, so delay and loss are simulated in user space. Point a node's
``advertise`` at the proxy and its peers will dial (and redial) through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass


@dataclass
class ProxyStats:
    connections: int = 0
    cuts: int = 0
    bytes_up: int = 0
    bytes_down: int = 0


class _Pair:
    def __init__(
        self,
        proxy: FaultProxy,
        cr: asyncio.StreamReader,
        cw: asyncio.StreamWriter,
        sr: asyncio.StreamReader,
        sw: asyncio.StreamWriter,
    ):
        self.proxy = proxy
        self.writers = (cw, sw)
        self.tasks = [
            asyncio.ensure_future(self._pump(cr, sw, up=True)),
            asyncio.ensure_future(self._pump(sr, cw, up=False)),
        ]

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: bool) -> None:
        proxy = self.proxy
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                await proxy._flowing.wait()
                if proxy.delay:
                    await asyncio.sleep(proxy.delay)
                writer.write(data)
                if up:
                    proxy.stats.bytes_up += len(data)
                else:
                    proxy.stats.bytes_down += len(data)
                await writer.drain()
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            self.close(reset=False)

    def close(self, reset: bool) -> None:
        for w in self.writers:
            if reset:
                sock = w.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                w.transport.abort()
            else:
                w.close()
        for t in self.tasks:
            if t is not asyncio.current_task():
                t.cancel()
        self.proxy._pairs.discard(self)


class FaultProxy:
    """``async with FaultProxy("127.0.0.1", port) as proxy: proxy.address -> "tcp://127.0.0.1:N"``"""

    def __init__(self, target_host: str, target_port: int, host: str = "127.0.0.1", port: int = 0):
        self.target = (target_host, target_port)
        self.host, self.port = host, port
        self.delay = 0.0
        self.refuse = False  # when true, new connections are closed at once (a partition)
        self.stats = ProxyStats()
        self._pairs: set[_Pair] = set()
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._cutter: asyncio.Task[None] | None = None

    @classmethod
    def to(cls, url: str) -> FaultProxy:
        hostport = url.split("://", 1)[1]
        host, port = hostport.rsplit(":", 1)
        return cls(host, int(port))

    @property
    def address(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_client, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._cutter is not None:
            self._cutter.cancel()
        if self._server is not None:
            self._server.close()
        for p in list(self._pairs):
            p.close(reset=False)

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _on_client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        if self.refuse:
            cw.transport.abort()
            return
        try:
            sr, sw = await asyncio.open_connection(*self.target)
        except OSError:
            cw.transport.abort()
            return
        self.stats.connections += 1
        self._pairs.add(_Pair(self, cr, cw, sr, sw))

    # ------------------------------------------------------------------ faults
    def cut(self, reset: bool = False) -> int:
        """Close every proxied connection now (with an RST when ``reset``). Returns how many."""
        pairs = list(self._pairs)
        for p in pairs:
            p.close(reset=reset)
        if pairs:
            self.stats.cuts += 1
        return len(pairs)

    def stall(self, stalled: bool = True) -> None:
        """Stop (or resume) forwarding bytes without closing anything: a hung link."""
        if stalled:
            self._flowing.clear()
        else:
            self._flowing.set()

    def cut_every(self, interval: float, reset: bool = False) -> None:
        """Cut all connections every ``interval`` seconds until ``stop_cutting``."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval)
                self.cut(reset=reset)

        self.stop_cutting()
        self._cutter = asyncio.ensure_future(loop())

    def stop_cutting(self) -> None:
        if self._cutter is not None:
            self._cutter.cancel()
            self._cutter = None

    @property
    def active(self) -> int:
        return len(self._pairs)
