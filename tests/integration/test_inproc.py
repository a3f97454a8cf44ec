"""inproc:// specifics beyond the conformance suite: sharing, naming, loop scope, bounds."""

from __future__ import annotations

import asyncio
import gc

import pytest

from aionet.errors import ConfigError, ConnectionClosed, TransportError
from aionet.transports import inproc
from aionet.transports.base import Connection
from aionet.transports.inproc import InprocTransport

T = 5.0


async def _pair(t: InprocTransport, url: str = "inproc://") -> tuple[Connection, Connection, str]:
    accepted: asyncio.Queue[Connection] = asyncio.Queue()

    async def handler(conn: Connection) -> None:
        accepted.put_nowait(conn)

    listener = await t.listen(url, handler)
    client = await t.connect(listener.address)
    async with asyncio.timeout(T):
        server = await accepted.get()
    return client, server, listener.address


async def test_receiver_gets_the_very_same_objects() -> None:
    t = InprocTransport()
    client, server, _ = await _pair(t)
    frames = [b"header", bytearray(b"payload"), memoryview(bytearray(1 << 20))]
    await client.send(frames)
    got = await server.recv()
    assert all(a is b for a, b in zip(got, frames, strict=True))
    assert got is not frames  # a new list: the caller may reuse its own list
    await t.aclose()


@pytest.mark.parametrize("name", ["", "0", "*"])
async def test_auto_names_are_unique(name: str) -> None:
    t = InprocTransport()

    async def handler(conn: Connection) -> None:
        pass

    a = await t.listen(f"inproc://{name}", handler)
    b = await t.listen(f"inproc://{name}", handler)
    assert a.address != b.address
    assert a.address.split("://", 1)[1] not in ("", "0", "*")
    await t.aclose()


async def test_names_conflict_and_free_on_close() -> None:
    t = InprocTransport()

    async def handler(conn: Connection) -> None:
        pass

    listener = await t.listen("inproc://Node-A", handler)
    assert listener.address == "inproc://Node-A"  # names keep their case
    with pytest.raises(TransportError, match="in use"):
        await t.listen("inproc://Node-A", handler)
    await listener.close()
    await listener.close()
    with pytest.raises(TransportError, match="no inproc listener"):
        await t.connect("inproc://Node-A")
    again = await t.listen("inproc://Node-A", handler)
    await again.close()
    await t.aclose()


def test_namespace_is_scoped_to_the_event_loop() -> None:
    async def handler(conn: Connection) -> None:
        pass

    async def first() -> str:
        listener = await InprocTransport().listen("inproc://shared-name", handler)
        return listener.address  # deliberately left open

    async def second(address: str) -> None:
        with pytest.raises(TransportError):
            await InprocTransport().connect(address)
        # and the name is free here
        await (await InprocTransport().listen(address, handler)).close()

    address = asyncio.run(first())
    asyncio.run(second(address))
    gc.collect()
    assert len(inproc._NAMESPACES) == 0  # the closed loops took their tables with them


async def test_send_blocks_on_byte_bound_and_admits_in_fifo_order() -> None:
    t = InprocTransport({"max_queued_bytes": 1000})
    client, server, _ = await _pair(t)
    await client.send([b"a" * 600])
    order: list[int] = []

    async def send(i: int) -> None:
        await client.send([bytes([i]) * 600])
        order.append(i)

    waiters = [asyncio.ensure_future(send(i)) for i in range(1, 4)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)  # 600 + 600 > 1000: everybody waits
    got = []
    async with asyncio.timeout(T):
        for _ in range(4):
            got.append((await server.recv())[0][0])
        await asyncio.gather(*waiters)
    assert got == [ord("a"), 1, 2, 3]
    assert order == [1, 2, 3]
    await t.aclose()


async def test_message_count_bound_and_oversized_message() -> None:
    t = InprocTransport({"max_queued_messages": 2, "max_queued_bytes": 10})
    client, server, _ = await _pair(t)
    await client.send([b"x" * 100])  # larger than the byte bound: admitted into an empty queue
    blocked = asyncio.ensure_future(client.send([b"y"]))
    await asyncio.sleep(0)
    assert not blocked.done()
    assert (await server.recv())[0] == b"x" * 100
    async with asyncio.timeout(T):
        await blocked
    await client.send([b"z"])  # two small ones fit the count bound
    blocked = asyncio.ensure_future(client.send([b"w"]))
    await asyncio.sleep(0)
    assert not blocked.done()
    assert [m[0] for m in await server.recv_many()] == [b"y", b"z"]
    async with asyncio.timeout(T):
        await blocked
    await t.aclose()


async def test_cancelled_sender_does_not_block_the_queue() -> None:
    t = InprocTransport({"max_queued_messages": 1})
    client, server, _ = await _pair(t)
    await client.send([b"1"])
    cancelled = asyncio.ensure_future(client.send([b"never"]))
    later = asyncio.ensure_future(client.send([b"2"]))
    await asyncio.sleep(0)
    cancelled.cancel()
    async with asyncio.timeout(T):
        assert (await server.recv())[0] == b"1"
        await later
        assert (await server.recv())[0] == b"2"
    await t.aclose()


async def test_blocked_sender_fails_when_the_peer_closes() -> None:
    t = InprocTransport({"max_queued_messages": 1})
    client, server, _ = await _pair(t)
    await client.send([b"1"])
    blocked = asyncio.ensure_future(client.send([b"2"]))
    await asyncio.sleep(0)
    await server.close()
    with pytest.raises(ConnectionClosed):
        async with asyncio.timeout(T):
            await blocked
    await t.aclose()


async def test_send_nowait_ignores_the_bound_and_keeps_order() -> None:
    t = InprocTransport({"max_queued_messages": 1})
    client, server, _ = await _pair(t)
    client.send_nowait([b"1"])
    client.send_nowait([b"2"])
    assert [m[0] for m in await server.recv_many()] == [b"1", b"2"]
    await client.close()
    with pytest.raises(ConnectionClosed):
        client.send_nowait([b"3"])
    await t.aclose()


async def test_aclose_closes_everything() -> None:
    t = InprocTransport()
    client, server, address = await _pair(t)
    await t.aclose()
    assert client.closed and server.closed
    with pytest.raises(TransportError):
        await InprocTransport().connect(address)


def test_options_are_validated() -> None:
    with pytest.raises(ConfigError, match="max_queud_bytes"):
        InprocTransport({"max_queud_bytes": 1})
    with pytest.raises(ConfigError):
        InprocTransport({"max_queued_bytes": 0})
    assert InprocTransport({"max_queued_bytes": "1MiB"})._max_bytes == 2**20
