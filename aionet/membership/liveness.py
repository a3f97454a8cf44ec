"""Process liveness that a busy event loop cannot fake (issue 13).

A node's loop is shared with user code; a handler that computes for seconds must not get its
node declared dead. So each node that listens on an IP address starts a responder sidecar
(:mod:`aionet.membership.responder_main`, standard library only) and stamps a shared tick from
its loop. Peers that suspect the node ping the responder over UDP, beside (never behind) the
data connection: an answer proves the *process* runs and says how long its loop has been
blocked; silence means the process is stopped or gone. Membership then keeps a busy node
alive (flagged ``stalled``) until its loop has been blocked longer than
``heartbeat.max_loop_stall``.

Where the sidecar cannot run (no ``/proc``: not Linux; an ``inproc://``-only node, which shares
its process with its peers anyway), nothing changes: liveness is judged from heartbeats and
probes as before, and a loop blocked past the detector's window looks dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import math
import mmap
import os
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from . import responder_main as wire
from .probe import GONE

MAX_PENDING = 1024  # pings awaiting replies at once (a bound, not an expected load)
PING_GRACE = 0.05  # s a verification still waits for a responder after the probes found nothing
NOTHING_LISTENS = "nothing listens at its address: its process is gone"


def available() -> bool:
    """The sidecar needs /proc to see whether its node is stopped or gone."""
    return sys.platform.startswith("linux") and os.path.isdir("/proc/self")


def host_of(url: str) -> str | None:
    """The IP host of a listen/advertise URL (None for inproc:// and other non-IP schemes)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if parts.scheme in ("inproc", "zmq+ipc") or not parts.hostname:
        return None
    return parts.hostname


def parse_address(value: Any) -> tuple[str, int] | None:
    """``"host:port"`` from a peer's load report -> (host, port), or None when malformed."""
    if not isinstance(value, str) or len(value) > 300:
        return None
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


class LoopTick:
    """The monotonic time of the loop's last tick, in a small shared file the sidecar maps."""

    def __init__(self) -> None:
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, self.path = tempfile.mkstemp(prefix="aionet-tick-", dir=shm)
        try:
            os.write(fd, struct.pack("<d", time.monotonic()))
            self._map = mmap.mmap(fd, 8)
        finally:
            os.close(fd)

    def stamp(self) -> None:
        struct.pack_into("<d", self._map, 0, time.monotonic())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._map.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class Responder:
    """Starts and stops this node's sidecar (one per node; killed by PID at stop)."""

    def __init__(self, bind_host: str, advertise_host: str, token: bytes | None) -> None:
        self.bind_host = bind_host
        self.advertise_host = advertise_host
        self.token = token
        self.tick = LoopTick()
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def address(self) -> str:
        host = self.advertise_host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    async def start(self, timeout: float = 10.0) -> None:
        script = Path(wire.__file__)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        token = self.token.hex() if self.token else "-"
        self.proc.stdin.write(f"{os.getpid()} {self.bind_host} {self.tick.path} {token}\n".encode())
        self.proc.stdin.close()
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout)
        if not line.strip().isdigit():
            await self.stop()
            raise RuntimeError(f"liveness responder did not start (said {line[:200]!r})")
        self.port = int(line)

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            await asyncio.to_thread(proc.wait, 5)
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()
        self.tick.close()


@dataclass(frozen=True)
class Answer:
    """A responder's reply: its loop last ticked ``stall`` seconds ago (inf: the process is
    stopped or gone)."""

    stall: float


class _Pinger(asyncio.DatagramProtocol):
    def __init__(self, owner: Pinger) -> None:
        self.owner = owner

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.owner._on_reply(data)


class Pinger:
    """Pings peers' responders from one UDP socket of this node."""

    def __init__(self, token: bytes | None) -> None:
        self._key = token or b"\0" * 16
        self._transport: asyncio.DatagramTransport | None = None
        self._waiting: dict[bytes, asyncio.Future[Answer]] = {}
        self.sent = 0
        self.answered = 0
        self.rejected = 0

    async def _socket(self, family: int) -> asyncio.DatagramTransport:
        if self._transport is None:
            loop = asyncio.get_running_loop()
            self._transport, _ = await loop.create_datagram_endpoint(lambda: _Pinger(self), family=family)
        return self._transport

    async def ping(self, addr: tuple[str, int], timeout: float) -> Answer | None:
        """The responder's answer, or None if it stays silent for ``timeout`` s."""
        import socket

        if len(self._waiting) >= MAX_PENDING:
            return None
        family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
        try:
            transport = await self._socket(family)
        except OSError:
            return None
        nonce = os.urandom(8)
        fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiting[nonce] = fut
        try:
            transport.sendto((wire.PING + nonce).ljust(wire.PING_SIZE, b"\0"), addr)
            self.sent += 1
            return await asyncio.wait_for(fut, timeout)
        except (TimeoutError, OSError):
            return None
        finally:
            self._waiting.pop(nonce, None)

    def _on_reply(self, data: bytes) -> None:
        if len(data) != 32 or data[:4] != wire.REPLY:
            self.rejected += 1
            return
        body, mac = data[:16], data[16:]
        if not hmac.compare_digest(hmac.new(self._key, body, hashlib.sha256).digest()[:16], mac):
            self.rejected += 1  # not our cluster's responder (or forged)
            return
        fut = self._waiting.get(body[4:12])
        if fut is not None and not fut.done():
            self.answered += 1
            (stall_ms,) = struct.unpack(">I", body[12:16])
            fut.set_result(Answer(math.inf if stall_ms == wire.NOT_RUNNING else stall_ms / 1000.0))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        for fut in self._waiting.values():
            if not fut.done():
                fut.cancel()
        self._waiting.clear()


class Liveness:
    """What membership's service uses: this node's responder, a pinger for others', and
    which members are stalled (answering through their responder while their loop is busy)."""

    def __init__(self, *, enabled: bool, token: bytes | None, max_loop_stall: float, log: Any) -> None:
        self.enabled = enabled and available()
        self.token = token
        self.max_loop_stall = max_loop_stall
        self.log = log
        self.responder: Responder | None = None
        self.pinger = Pinger(token)
        self.stalled: dict[str, float] = {}  # member -> loop stall its responder last reported (s)

    async def start(self, advertised: list[str]) -> str | None:
        """Start the sidecar for the first IP address we advertise; returns its address."""
        host = next((h for h in map(host_of, advertised) if h), None)
        if not self.enabled or host is None:
            return None
        bind = host if _is_ip(host) else "0.0.0.0"
        responder = Responder(bind, host, self.token)
        try:
            await responder.start()
        except asyncio.CancelledError:  # the node stopped while starting: no sidecar left behind
            await responder.stop()
            raise
        except Exception as exc:  # no sidecar: liveness falls back to heartbeats and probes
            self.log.warning("liveness responder did not start; a busy loop may look dead", error=str(exc))
            await responder.stop()
            return None
        self.responder = responder
        return responder.address

    def stamp(self) -> None:
        if self.responder is not None:
            self.responder.tick.stamp()

    async def stop(self) -> None:
        self.pinger.close()
        if self.responder is not None:
            responder, self.responder = self.responder, None
            await responder.stop()

    async def check(self, load_extra: dict[str, Any] | None, timeout: float) -> Answer | None:
        """Ask a member's responder (its address comes in its load report); None: silent/unknown."""
        addr = parse_address((load_extra or {}).get("live"))
        if addr is None or not self.enabled:
            return None
        return await self.pinger.ping(addr, timeout)

    async def verify_round(
        self, name: str, load: Any, probe: Awaitable[str], timeout: float, spawn: Callable[..., asyncio.Task[Any]]
    ) -> tuple[str, str, float | None]:
        """One verification round of a suspect: its responder and the probes race.

        Returns (outcome: "alive", "dead" or "" for unknown; a reason replacing the
        suspicion's when the responder or a refused probe decided; the stall to report when the
        member has just become stalled). A probe that found nothing listening (``GONE``) is
        conclusive: it waits for no responder (a killed node's responder may already have
        exited) and outranks one that says the process still runs (it is still exiting)."""
        extra = load.extra if load is not None else None
        ping = spawn(self.check(extra, timeout), "aionet-ping")
        probing = spawn(probe, "aionet-probe")
        outcome = ""
        try:
            await asyncio.wait((ping, probing), return_when=asyncio.FIRST_COMPLETED)
            answer = ping.result() if ping.done() else None
            if probing.done() and probing.result() == GONE:
                return "dead", NOTHING_LISTENS, None
            if answer is None:  # no word from a responder yet: the probes decide, unless it speaks
                outcome = await probing
                if outcome == GONE:
                    return "dead", NOTHING_LISTENS, None
                if outcome != "alive" and not ping.done():
                    await asyncio.wait((ping,), timeout=PING_GRACE)
                answer = ping.result() if ping.done() and outcome != "alive" else None
        finally:
            ping.cancel()
            probing.cancel()
        if answer is None:
            return outcome, "", None
        alive, new = self.verdict(name, answer)
        if alive:
            return "alive", "", answer.stall if new else None
        if math.isinf(answer.stall):
            return "dead", "its process is stopped or gone (its liveness responder says so)", None
        return "dead", f"event loop blocked {answer.stall:.1f} s > heartbeat.max_loop_stall", None

    def verdict(self, name: str, answer: Answer) -> tuple[bool, bool]:
        """(alive, newly stalled) for a member whose responder answered."""
        if answer.stall > self.max_loop_stall:
            self.stalled.pop(name, None)
            return False, False
        new = name not in self.stalled
        self.stalled[name] = answer.stall
        return True, new

    def resumed(self, name: str) -> bool:
        """The member answered on its own again (its loop runs): True if it was stalled."""
        return self.stalled.pop(name, None) is not None


def _is_ip(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


__all__ = ["Answer", "Liveness", "LoopTick", "Pinger", "Responder", "available", "host_of", "parse_address"]
