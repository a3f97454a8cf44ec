"""A transport peer in its own process, so the conformance suite can SIGKILL it.

    python -m aionet.testing._transport_peer connect URL [OPTIONS_JSON]
        connect to URL, send [b"hello"], print "ready", then echo every message back.
    python -m aionet.testing._transport_peer listen URL [OPTIONS_JSON]
        listen on URL, print "ready <address>", echo every message on every connection.

It only uses the public transport contract and the registry, so it works for any scheme.
"""

from __future__ import annotations

import asyncio
import json
import sys

import structlog

from aionet.errors import ConnectionClosed
from aionet.transports.base import Connection
from aionet.transports.registry import TransportRegistry


async def _echo(conn: Connection) -> None:
    try:
        while True:
            for msg in await conn.recv_many():
                await conn.send(msg)
    except ConnectionClosed:
        pass


async def main(role: str, url: str, options: dict) -> None:
    registry = TransportRegistry()
    scheme = url.split("://", 1)[0]
    transport = registry.get(url, {scheme.split("+", 1)[0]: options})
    if role == "connect":
        conn = await transport.connect(url, timeout=10.0)
        await conn.send([b"hello"])
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        await _echo(conn)
    elif role == "listen":
        listener = await transport.listen(url, _echo)
        sys.stdout.write(f"ready {listener.address}\n")
        sys.stdout.flush()
        await asyncio.Event().wait()  # until killed
    else:
        raise SystemExit(f"unknown role {role!r}")
    await registry.aclose()


if __name__ == "__main__":
    # stdout carries the "ready" line; logs go to stderr
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}))
