"""Push mode's consumer rules (``aionet.transports.push_delivery``) on real connections of every
transport that hosts them: a consumer whose awaitable fails is told that error once, and the
connection closes so that its peer hears of it; every host sets what the mixin relies on."""

from __future__ import annotations

import asyncio
import typing
from collections.abc import AsyncIterator
from typing import Any

import pytest

from aionet.errors import ConnectionClosed
from aionet.transports.base import Connection, Transport
from aionet.transports.push_delivery import PushDelivery
from aionet.transports.tcp import TCPTransport
from aionet.transports.zmq import ZMQTransport

T = 10.0
URLS = {"tcp": "tcp://127.0.0.1:0", "zmq": "zmq+tcp://127.0.0.1:0"}


@pytest.fixture(params=sorted(URLS))
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Connection, Connection]]:
    """(dialer's connection, listener's connection for it) over each push-mode host transport."""
    transport: Transport = TCPTransport() if request.param == "tcp" else ZMQTransport()
    accepted: asyncio.Queue[Connection] = asyncio.Queue()
    served = asyncio.Event()

    async def handler(conn: Connection) -> None:
        accepted.put_nowait(conn)
        await served.wait()  # tcp closes an accepted connection once its handler returns

    listener = await transport.listen(URLS[request.param], handler)
    client = await transport.connect(listener.address, timeout=T)
    async with asyncio.timeout(T):
        server = await accepted.get()
    try:
        yield client, server
    finally:
        served.set()
        for conn in (client, server):
            await conn.close()
        await listener.close()
        await transport.aclose()


def test_every_host_sets_what_the_mixin_declares(pair: tuple[Connection, Connection]) -> None:
    declared = typing.get_type_hints(PushDelivery)  # fails here too if an annotation names nothing
    for conn in pair:
        assert isinstance(conn, PushDelivery)
        missing = [name for name in declared if not hasattr(conn, name)]
        assert not missing, f"{type(conn).__name__} lacks {missing}"


@pytest.mark.parametrize("how", ["fails", "cancelled"])
async def test_a_consumer_whose_awaitable_fails_hears_it_once_and_the_peer_sees_the_close(
    pair: tuple[Connection, Connection], how: str
) -> None:
    client, server = pair
    loop = asyncio.get_running_loop()
    ends: list[BaseException] = []
    told = asyncio.Event()
    batches: list[list[Any]] = []
    work: asyncio.Future[None] = loop.create_future()

    def on_closed(exc: BaseException) -> None:
        ends.append(exc)
        told.set()

    def on_messages(batch: list[Any]) -> asyncio.Future[None]:
        batches.append(batch)
        return work

    server.start_receiving(on_messages, on_closed)
    await client.send([b"x"])
    async with asyncio.timeout(T):
        while not batches:
            await asyncio.sleep(0.005)
    if how == "cancelled":
        work.cancel()
    else:
        work.set_exception(RuntimeError("consumer bug"))
    async with asyncio.timeout(T):
        await told.wait()
        with pytest.raises(ConnectionClosed):  # the peer learns the connection is gone
            while True:
                await client.recv()
    if how == "cancelled":
        assert isinstance(ends[0], asyncio.CancelledError)
    else:
        assert isinstance(ends[0], RuntimeError) and str(ends[0]) == "consumer bug"
    assert server.closed
    await asyncio.sleep(0.05)  # time for a wrong second report to show
    assert len(ends) == 1 and len(batches) == 1
