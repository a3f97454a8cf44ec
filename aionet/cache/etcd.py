"""Coordination on etcd (``[cache] coordination = "etcd://host:2379"``): locks, fencing tokens
and versions on a consensus store, values still in the nodes' memory.

Why: the embedded authority (each key's primary as membership places it) can split in a
partition; etcd's Raft log cannot. Here:

- a lock is the etcd key ``/aionet/cache/lock/<name>`` created in a transaction only if absent,
  attached to an etcd lease of the lock's ttl; its **token is the revision that created it**
  (etcd revisions rise cluster-wide, so every later grant has a higher token); renewing is a
  lease keep-alive, releasing a lease revoke, and a holder that dies loses the lock when etcd
  expires its lease;
- a fenced write is checked against that key (alive, and created at the lease's token);
- a cache key's version is the etcd revision of ``/aionet/cache/v/<key>``: ``put`` writes it,
  ``cas`` is a transaction comparing its revision with the expected version, ``delete`` removes
  it. The key's primary still stores the value and replicates it.

The client speaks etcd's v3 JSON gateway (HTTP/1.1, ``/v3/...``) with asyncio streams, so no
gRPC dependency is needed; one short connection per call.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigError, PeerUnavailable

_PREFIX = "/aionet/cache/"
_MIN_TTL = 2  # s: etcd rounds lease ttls up to whole seconds (and has a minimum near 1.5 s)


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def parse_url(url: str) -> tuple[str, int]:
    """``etcd://host:2379`` -> (host, port)."""
    parts = urlsplit(url)
    if parts.scheme != "etcd" or not parts.hostname:
        raise ConfigError(f'cache.coordination must be "" or "etcd://host:port", not {url!r}')
    return parts.hostname, parts.port or 2379


class EtcdError(PeerUnavailable):
    """etcd could not be reached or answered an error (the cache call fails; retried as a
    peer that is unavailable)."""


class EtcdClient:
    """The few etcd v3 calls the cache needs, over the JSON gateway. Unary calls reuse
    keep-alive connections (a small pool); the streaming keep-alive call gets its own."""

    def __init__(self, url: str, timeout: float = 5.0, pool: int = 8) -> None:
        self.host, self.port = parse_url(url)
        self.timeout = timeout
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._pool = pool

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        stream = path == "lease/keepalive"
        data = json.dumps(body).encode()
        req = (
            f"POST /v3/{path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: {'close' if stream else 'keep-alive'}\r\n\r\n"
        ).encode() + data
        try:
            async with asyncio.timeout(self.timeout):
                for attempt in (0, 1):
                    conn = self._idle.pop() if self._idle and not stream else None
                    if conn is None:
                        conn = await asyncio.open_connection(self.host, self.port)
                        attempt = 1
                    try:
                        status, headers, payload = await self._exchange(conn, req, stream)
                        break
                    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
                        conn[1].close()
                        if attempt:
                            raise
                if not stream and b"connection: close" not in headers and len(self._idle) < self._pool:
                    self._idle.append(conn)
                else:
                    conn[1].close()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            raise EtcdError(
                f"etcd at {self.host}:{self.port} unreachable ({exc!r}): check cache.coordination"
            ) from None
        text = payload.strip().split(b"\n", 1)[0]  # streaming endpoints answer one JSON object per line
        try:
            out = json.loads(text) if text else {}
        except ValueError:
            raise EtcdError(f"etcd answered {status!r} with something that is not JSON") from None
        if not isinstance(out, dict):
            raise EtcdError(f"etcd {path}: answered {type(out).__name__}, not a JSON object")
        if b" 200 " not in status + b" " or "error" in out:
            raise EtcdError(f"etcd {path}: {out.get('error') or out.get('message') or status!r}")
        result = out.get("result", out)
        return result if isinstance(result, dict) else {}

    async def _exchange(
        self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], req: bytes, to_eof: bool
    ) -> tuple[bytes, bytes, bytes]:
        reader, writer = conn
        writer.write(req)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0]
        headers = head.lower()
        if to_eof:
            payload = await reader.read(1 << 20)  # the first message of the stream
            if b"chunked" in headers:
                payload = _dechunk(payload)
            return status, headers, payload
        for line in headers.split(b"\r\n"):
            if line.startswith(b"content-length:"):
                n = int(line.split(b":", 1)[1])
                if n > 16 << 20:
                    raise ValueError("etcd reply too large")
                return status, headers, await reader.readexactly(n)
        if b"chunked" in headers:
            out = bytearray()
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    return status, headers, bytes(out)
                if len(out) + size > 16 << 20:
                    raise ValueError("etcd reply too large")
                out += await reader.readexactly(size)
                await reader.readexactly(2)
        return status, headers + b"connection: close", await reader.read(16 << 20)

    def close(self) -> None:
        for _r, w in self._idle:
            w.close()
        self._idle.clear()


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        try:
            size = int(size_line.split(b";")[0], 16)
        except ValueError:
            break
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2 :]
    return bytes(out)


class EtcdCoordination:
    """Locks and versions on etcd; see the module docstring."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.client = EtcdClient(url, timeout)
        self.url = url

    def close(self) -> None:
        self.client.close()

    # ------------------------------------------------------------------ locks
    def _lock_key(self, name: str) -> str:
        return _b64(_PREFIX + "lock/" + name)

    async def acquire(self, name: str, owner: str, ttl: float) -> tuple[int, int]:
        """Try once: ``(token, lease id)``, or ``(0, 0)`` when someone holds it."""
        c = self.client
        lease = await c.call("lease/grant", {"TTL": str(max(_MIN_TTL, math.ceil(ttl)))})
        lease_id = lease["ID"]
        key = self._lock_key(name)
        txn = {
            "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": {"key": key, "value": _b64(owner), "lease": lease_id}}],
        }
        r = await c.call("kv/txn", txn)
        if r.get("succeeded"):
            return int(r["header"]["revision"]), int(lease_id)
        await c.call("lease/revoke", {"ID": lease_id})
        return 0, 0

    async def renew(self, lease_id: int) -> bool:
        r = await self.client.call("lease/keepalive", {"ID": str(lease_id)})
        return int(r.get("TTL", 0)) > 0

    async def release(self, lease_id: int) -> None:
        await self.client.call("lease/revoke", {"ID": str(lease_id)})

    async def valid(self, name: str, token: int) -> bool:
        """Whether ``token`` is the live grant of lock ``name``."""
        r = await self.client.call("kv/range", {"key": self._lock_key(name)})
        kvs = r.get("kvs") or []
        return bool(kvs) and int(kvs[0].get("create_revision", 0)) == token

    # ------------------------------------------------------------------ versions
    async def write(self, key: str, expect: int | None, delete: bool = False) -> int:
        """The new version of ``key`` (an etcd revision), or 0 when ``expect`` (the version
        the caller read; 0: absent) is no longer current, or when deleting an absent key."""
        k = _b64(_PREFIX + "v/" + key)
        op: dict[str, Any] = (
            {"request_delete_range": {"key": k}} if delete else {"request_put": {"key": k, "value": ""}}
        )
        if expect is None and not delete:
            r = await self.client.call("kv/txn", {"success": [op]})
            return int(r["header"]["revision"])
        if delete:  # only if present: deleting nothing does not create a version
            cmp = {"key": k, "target": "CREATE", "result": "GREATER", "create_revision": "0"}
        else:
            cmp = {"key": k, "target": "MOD", "result": "EQUAL", "mod_revision": str(expect)}
        r = await self.client.call("kv/txn", {"compare": [cmp], "success": [op]})
        return int(r["header"]["revision"]) if r.get("succeeded") else 0

    async def version(self, key: str) -> int:
        r = await self.client.call("kv/range", {"key": _b64(_PREFIX + "v/" + key)})
        kvs = r.get("kvs") or []
        return int(kvs[0]["mod_revision"]) if kvs else 0


__all__ = ["EtcdClient", "EtcdCoordination", "EtcdError", "parse_url"]
