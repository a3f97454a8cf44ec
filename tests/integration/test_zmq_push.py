"""zmq push mode (``start_receiving``): batches delivered from the socket's service pass, and
what a consumer sends while it handles one. The hang-prone part is ZMQ_FD's edge trigger: a
send made during delivery may consume the socket's signal, so a message that arrived meanwhile
is only found if the socket is read again before the loop sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from aionet import Node
from aionet.errors import ConnectionClosed
from aionet.testing.proxy import FaultProxy
from aionet.transports.base import Connection
from aionet.transports.zmq import ZMQTransport
from tests.push_consumer import GatedConsumer

T = 10.0


@pytest.fixture
async def transport() -> AsyncIterator[ZMQTransport]:
    t = ZMQTransport()
    yield t
    await t.aclose()


async def _pair(t: ZMQTransport) -> tuple[Connection, Connection]:
    """(dialer's connection, listener's connection for it)."""
    accepted: asyncio.Queue[Connection] = asyncio.Queue()

    async def handler(conn: Connection) -> None:
        accepted.put_nowait(conn)

    listener = await t.listen("zmq+tcp://127.0.0.1:0", handler)
    client = await t.connect(listener.address, timeout=T)
    async with asyncio.timeout(T):
        server = await accepted.get()
    return client, server


@pytest.mark.parametrize("side", ["listener", "dialer"])
async def test_a_waiting_consumer_holds_later_batches_and_hears_the_end_after_the_last(
    transport: ZMQTransport, side: str
) -> None:
    client, server = await _pair(transport)
    receiver, sender = (server, client) if side == "listener" else (client, server)
    c = GatedConsumer()
    receiver.start_receiving(c.on_messages, c.on_closed)
    await sender.send([b"0"])
    async with asyncio.timeout(T):
        await c.first.wait()
    for i in range(1, 50):
        await sender.send([str(i).encode()])
    async with asyncio.timeout(T):  # the 49 arrive and are held behind the gate
        while len(receiver._rq) < 49:
            await asyncio.sleep(0.005)
    assert len(c.batches) == 1
    c.gate.set()
    async with asyncio.timeout(T):
        await c.arrived(50)
    assert not c.closed.done()
    await sender.close()
    async with asyncio.timeout(T):
        exc = await c.closed
    assert isinstance(exc, ConnectionClosed)
    assert c.payloads() == [str(i).encode() for i in range(50)]


@pytest.mark.parametrize("sends", [1, 3])
async def test_replies_sent_during_delivery_arrive_without_further_traffic(transport: ZMQTransport, sends: int) -> None:
    """A ping-pong run entirely inside the push callbacks of both ends: every reply is sent
    while a batch is delivered, and the next ping only when the last reply arrived. A send
    that consumed the socket's signal without the socket being read again afterwards would
    stall the exchange (libzmq lets a send process commands about once a millisecond, so a
    few thousand rounds cross that many times)."""
    client, server = await _pair(transport)
    rounds = 3000
    done = asyncio.get_running_loop().create_future()
    seen: list[int] = []

    def serve(batch: list[Any]) -> None:
        for m in batch:
            for k in range(sends):  # the reply, then (with 3) two more in the same callback
                server.write_nowait([m[0] + b".%d" % k])

    def on_reply(batch: list[Any]) -> None:
        for m in batch:
            seq, _, k = m[0].partition(b".")
            if k == b"%d" % (sends - 1):  # the last message of this round: next ping
                n = int(seq)
                seen.append(n)
                if n + 1 == rounds:
                    done.set_result(None)
                else:
                    client.write_nowait([b"%d" % (n + 1)])

    server.start_receiving(serve, lambda exc: None)
    client.start_receiving(on_reply, lambda exc: None)
    client.write_nowait([b"0"])
    async with asyncio.timeout(T * 3):
        await done
    assert seen == list(range(rounds))


async def test_sends_during_delivery_with_traffic_in_flight_never_strand_a_message(transport: ZMQTransport) -> None:
    """Both ends answer inside their push callbacks while 32 messages are in flight, so
    messages keep arriving while a callback sends. A send that processed the command
    announcing one of them, with the socket not read again before the loop slept, would
    strand that message and every later one from the peer (their pipe looks awake to zmq, so
    nothing signals again): the exchange would stop short."""
    client, server = await _pair(transport)
    total, window = 20000, 32
    done = asyncio.get_running_loop().create_future()
    sent = window
    got = 0

    def serve(batch: list[Any]) -> None:
        for m in batch:
            server.write_nowait([m[0]])

    def on_reply(batch: list[Any]) -> None:
        nonlocal sent, got
        got += len(batch)
        for _ in batch:
            if sent < total:
                client.write_nowait([b"%d" % sent])
                sent += 1
        if got == total and not done.done():
            done.set_result(None)

    server.start_receiving(serve, lambda exc: None)
    client.start_receiving(on_reply, lambda exc: None)
    for i in range(window):
        client.write_nowait([b"%d" % i])
    async with asyncio.timeout(T * 3):
        await done
    assert got == total


async def test_sends_from_tasks_with_traffic_in_flight_never_strand_a_message(transport: ZMQTransport) -> None:
    """The same with sends made outside a service pass (tasks reading with ``recv_many``):
    the first send of a loop iteration reads EVENTS itself, and must have the socket read when
    that shows a message waiting, or the message (and the rest of its stream) is stranded."""
    client, server = await _pair(transport)
    total, window = 20000, 32
    room = asyncio.Semaphore(window)
    got = 0

    async def echo() -> None:
        while True:
            for m in await server.recv_many():
                server.write_nowait([m[0]])

    async def send_all() -> None:
        for i in range(total):
            await room.acquire()
            client.write_nowait([b"%d" % i])

    async def receive_all() -> None:
        nonlocal got
        while got < total:
            batch = await client.recv_many()
            got += len(batch)
            for _ in batch:
                room.release()

    tasks = [asyncio.ensure_future(echo()), asyncio.ensure_future(send_all())]
    try:
        async with asyncio.timeout(T * 3):
            await receive_all()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert got == total


async def test_a_consumer_that_raises_closes_the_connection_and_is_told_why(transport: ZMQTransport) -> None:
    client, server = await _pair(transport)
    closed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    def on_messages(batch: list[Any]) -> None:
        raise RuntimeError("consumer bug")

    server.start_receiving(on_messages, closed.set_result)
    await client.send([b"x"])
    async with asyncio.timeout(T):
        exc = await closed
    assert isinstance(exc, RuntimeError) and str(exc) == "consumer bug"
    assert server.closed


async def test_messages_queued_before_push_mode_starts_are_delivered_first(transport: ZMQTransport) -> None:
    client, server = await _pair(transport)
    for i in range(5):
        await client.send([b"%d" % i])
    assert await server.recv() == [b"0"]  # pull mode first (a handshake reads like this)
    got: list[bytes] = []
    await asyncio.sleep(0.05)  # the rest is read into the receive queue meanwhile
    server.start_receiving(lambda batch: got.extend(m[0] for m in batch), lambda exc: None)
    await client.send([b"5"])
    async with asyncio.timeout(T):
        while len(got) < 5:
            await asyncio.sleep(0.005)
    assert got == [b"1", b"2", b"3", b"4", b"5"]


async def test_flush_pending_is_set_by_a_send_until_the_socket_is_serviced(transport: ZMQTransport) -> None:
    """The link batches what follows a message sent in this loop iteration and sends a lone
    one at once; the zmq connection tells it which is which. (The first send reads the
    socket's EVENTS itself, which counts as servicing it.)"""
    client, server = await _pair(transport)
    assert client.flush_pending is False
    assert client.write_nowait([b"a"]) is None  # a lone message: sent, the socket checked at once
    assert client.flush_pending is False
    assert client.write_nowait([b"b"]) is None  # a second one in this iteration: checked later
    assert client.flush_pending is True  # so a third would join a batch
    for _ in range(3):
        await asyncio.sleep(0)  # the post-send check of the socket runs
    assert client.flush_pending is False
    assert await asyncio.wait_for(server.recv(), T) == [b"a"]
    assert await asyncio.wait_for(server.recv(), T) == [b"b"]


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_node_requests_over_zmq_are_answered_once_each_in_sequence_and_concurrently(kind: str) -> None:
    """Through the node: a sync service answers inside the delivery of its request, an async
    one on a task of its own; sequential and 200 concurrent requests each get their answer."""
    async with Node(name="srv", listen="zmq+tcp://127.0.0.1:0") as srv:
        calls = 0
        if kind == "sync":

            @srv.service("inc")
            def inc(x: int) -> int:
                nonlocal calls
                calls += 1
                return x + 1
        else:

            @srv.service("inc")
            async def ainc(x: int) -> int:
                nonlocal calls
                calls += 1
                return x + 1

        async with Node(name="cli", listen="zmq+tcp://127.0.0.1:0", join=[srv.address]) as cli:
            async with asyncio.timeout(30):
                for i in range(300):
                    assert await cli.request("srv", "inc", i, timeout=T) == i + 1
                got = await asyncio.gather(*(cli.request("srv", "inc", i, timeout=T) for i in range(200)))
            assert got == [i + 1 for i in range(200)]
            assert calls == 500


@pytest.mark.timeout(120)
async def test_node_messages_over_zmq_exactly_once_in_order_across_cuts() -> None:
    """Push delivery under the link layer over zmq+tcp://: connections cut every 50 ms (by
    proxies both nodes advertise) lose, duplicate and reorder nothing, and a request sent
    meanwhile gets its one reply."""
    a = Node(name="a", listen="zmq+tcp://127.0.0.1:0")
    b = Node(name="b", listen="zmq+tcp://127.0.0.1:0")
    await a.start()
    await b.start()
    pa = FaultProxy.to(a.addresses[0].replace("zmq+", ""))
    pb = FaultProxy.to(b.addresses[0].replace("zmq+", ""))
    await pa.start()
    await pb.start()
    try:
        a.config.node.advertise = "zmq+" + pa.address
        b.config.node.advertise = "zmq+" + pb.address
        calls = 0

        @a.service("count")
        def count(x: int) -> int:
            nonlocal calls
            calls += 1
            return x

        await b.connect("zmq+" + pa.address)
        n = 20_000
        received: list[int] = []

        async def consume() -> None:
            while len(received) < n:
                received.extend(await a.recv_batch("seq"))

        consumer = asyncio.ensure_future(consume())
        for p in (pa, pb):
            p.cut_every(0.05)
        for i in range(n):
            await b.send("a", "seq", i)
            if i % 500 == 499:
                assert await b.request("a", "count", i, timeout=30) == i
            if i % 100 == 99:
                await asyncio.sleep(0.002)  # pace: the stream still flows while the proxies cut
        await asyncio.wait_for(consumer, 90)
        for p in (pa, pb):
            p.stop_cutting()
        assert pa.stats.cuts + pb.stats.cuts >= 3, "the proxies hardly cut: the test proved little"
        assert received == list(range(n))  # 0 lost, 0 duplicated, 0 reordered
        assert calls == n // 500  # each request handled once
    finally:
        for p in (pa, pb):
            p.stop_cutting()
        await b.stop()
        await a.stop()
        await pa.stop()
        await pb.stop()
