"""Regression tests for the zmq parts of issue 11 items 16 and 18: ipc socket files left
after a clean exit, a host:port given to zmq+ipc:// becoming a file in the working
directory, and stray loop errors ("Task exception was never retrieved", "Task was destroyed
but it is pending") from tasks and futures the zmq transport starts."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import zmq

from aionet import Node
from aionet.errors import ConfigError, ConnectionClosed, TransportError
from aionet.transports.base import Connection
from aionet.transports.zmq import PROTOCOL, ZMQTransport
from tests.conftest import wait_for

T = 5.0
IPC_HINT = "zmq\\+ipc:///tmp/aionet-a.sock"


async def _noop(conn: Connection) -> None:
    return None


# ------------------------------------------------------------------------------------------
# item 18: ipc socket files are removed on a clean exit
# ------------------------------------------------------------------------------------------
async def test_node_on_zmq_ipc_leaves_no_socket_file(tmp_path: Path) -> None:
    a = Node(name="a", listen=f"zmq+ipc://{tmp_path}/a.sock")
    await a.start()
    b = Node(name="b", listen=f"zmq+ipc://{tmp_path}/b.sock", join=a.address)
    try:
        await b.start()

        @a.service("echo")
        def echo(x: Any) -> Any:
            return x

        assert await b.request("a", "echo", 7, timeout=T) == 7
        assert sorted(os.listdir(tmp_path)) == ["a.sock", "b.sock"]
    finally:
        await b.stop(grace=1.0)
        await a.stop(grace=1.0)
    assert os.listdir(tmp_path) == []


async def test_listener_close_and_aclose_remove_the_socket_file(tmp_path: Path) -> None:
    t = ZMQTransport()
    try:
        path = tmp_path / "l.sock"
        listener = await t.listen(f"zmq+ipc://{path}", _noop)
        assert path.exists()
        await listener.close()
        assert not path.exists()

        # closed while a client is connected: the file goes at once, the connection stays
        accepted: asyncio.Queue[Connection] = asyncio.Queue()
        listener = await t.listen(f"zmq+ipc://{path}", accepted.put)
        client = await t.connect(listener.address, timeout=T)
        server = await asyncio.wait_for(accepted.get(), T)
        await listener.close()
        assert not path.exists()
        await client.send([b"still here"])
        assert await asyncio.wait_for(server.recv(), T) == [b"still here"]

        # the automatic path (zmq+ipc://) is ours as well; aclose removes it
        auto = await t.listen("zmq+ipc://", _noop)
        auto_path = Path(auto.address.split("://", 1)[1])
        assert auto_path.exists()
    finally:
        await t.aclose()
    assert not auto_path.exists()
    assert os.listdir(tmp_path) == []


async def test_listener_close_never_removes_a_file_it_did_not_bind(tmp_path: Path) -> None:
    t = ZMQTransport()
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        path = tmp_path / "l.sock"
        gone = await t.listen(f"zmq+ipc://{path}", _noop)
        path.unlink()  # already gone when the listener closes: fine
        await gone.close()

        listener = await t.listen(f"zmq+ipc://{path}", _noop)
        path.unlink()
        other.bind(str(path))  # someone else's socket now lives at that path
        await listener.close()
        assert path.exists()
        await t.aclose()
        assert path.exists()
    finally:
        other.close()
        await t.aclose()


# ------------------------------------------------------------------------------------------
# item 18: zmq+ipc://host:port is refused instead of becoming a file named "host:port"
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "url",
    ["zmq+ipc://127.0.0.1:0", "zmq+ipc://localhost:7700", "zmq+ipc://[::1]:5", "zmq+ipc://10.0.0.2", "zmq+ipc://h:1/x"],
)
async def test_ipc_url_naming_a_host_port_is_a_config_error(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    t = ZMQTransport()
    try:
        with pytest.raises(ConfigError, match=IPC_HINT):
            await t.listen(url, _noop)
        with pytest.raises(ConfigError, match=IPC_HINT):
            await t.connect(url, timeout=1.0)
    finally:
        await t.aclose()
    assert os.listdir(tmp_path) == []


async def test_relative_ipc_path_resolves_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    t = ZMQTransport()
    try:
        accepted: asyncio.Queue[Connection] = asyncio.Queue()
        listener = await t.listen("zmq+ipc://rel.sock", accepted.put)
        assert listener.address == f"zmq+ipc://{tmp_path}/rel.sock"  # what peers are told
        client = await t.connect("zmq+ipc://rel.sock", timeout=T)
        server = await asyncio.wait_for(accepted.get(), T)
        await client.send([b"x"])
        assert await asyncio.wait_for(server.recv(), T) == [b"x"]
        await listener.close()
    finally:
        await t.aclose()
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------------------
# item 16: no stray loop errors from the zmq transport's tasks and futures
# ------------------------------------------------------------------------------------------
class _LoopErrors:
    """Records every call of the loop's exception handler."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.calls.append(context)

    def describe(self) -> list[str]:
        return [
            f"{c.get('message')}: {c.get('exception')!r} {c.get('task') or c.get('future') or ''}" for c in self.calls
        ]


async def _abrupt_session(url: str) -> None:
    """Connections that end every way but cleanly, with the caller dropping what it can."""
    t = ZMQTransport({"hwm": 4, "linger": 0})
    accepted: asyncio.Queue[Connection] = asyncio.Queue()
    stuck = asyncio.Event()

    async def handler(conn: Connection) -> None:
        await accepted.put(conn)
        await stuck.wait()  # a handler that never ends on its own

    listener = await t.listen(url, handler)
    address = listener.address
    big = b"x" * (256 << 10)

    # 1. the peer closes mid-stream while the writer is blocked and dropped its awaitables
    client = await t.connect(address, timeout=T)
    server = await asyncio.wait_for(accepted.get(), T)
    for _ in range(64):  # 16 MiB against hwm=4 and an unread receiver: back-pressure
        client.write_nowait([big])
    server.abort()
    await wait_for(lambda: client.closed or client.stats().extra["eof"] is not None, T)
    with pytest.raises(ConnectionClosed):
        await client.recv()

    # 2. the dialer vanishes mid-stream (zmq close without linger, no bye), push mode on both ends
    closed: list[BaseException] = []
    client = await t.connect(address, timeout=T)
    server = await asyncio.wait_for(accepted.get(), T)
    server.start_receiving(lambda batch: None, closed.append)
    for _ in range(16):
        client.write_nowait([b"y" * 1000])
    client.abort()
    await wait_for(lambda: bool(closed), T)

    # 3. a send blocked on back-pressure is cancelled, then its connection dies
    client = await t.connect(address, timeout=T)
    server = await asyncio.wait_for(accepted.get(), T)
    sender = asyncio.ensure_future(client.send([bytearray(big)]))
    blocked = [asyncio.ensure_future(client.send([big])) for _ in range(32)]
    await asyncio.sleep(0.05)
    sender.cancel()
    for b in blocked[::2]:
        b.cancel()
    server.abort()
    for b in [sender, *blocked]:
        try:
            await asyncio.wait_for(b, T)
        except (asyncio.CancelledError, ConnectionClosed):
            pass

    # 4. connects cut short by a timeout, and to an address nobody listens on
    for _ in range(3):
        dial = asyncio.ensure_future(t.connect(address, timeout=T))
        await asyncio.sleep(0)
        dial.cancel()
        try:
            (await dial).abort()
        except asyncio.CancelledError:
            pass
    dead = await t.listen(url if url.startswith("zmq+tcp") else url + ".dead", _noop)
    await dead.close()
    with pytest.raises(TransportError):
        await t.connect(dead.address, timeout=0.5)

    # 5. a raw peer that says hello and drops the TCP/ipc connection without a bye
    ctx = zmq.Context()
    try:
        raw = ctx.socket(zmq.DEALER)
        raw.connect(address.split("+", 1)[1])
        raw.send_multipart([b"", b"H", PROTOCOL])
        await asyncio.wait_for(accepted.get(), T)
        raw.close(linger=0)
    finally:
        ctx.destroy(linger=0)

    # 6. listener closed while clients are connected, handlers still running; then aclose
    clients = [await t.connect(address, timeout=T) for _ in range(3)]
    for _ in clients:
        await asyncio.wait_for(accepted.get(), T)
    for c in clients:
        c.write_nowait([big])
    await listener.close()
    await t.aclose()


@pytest.mark.parametrize("scheme", ["zmq+tcp", "zmq+ipc"])
async def test_abrupt_closes_leave_no_stray_loop_errors(scheme: str, tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    errors = _LoopErrors()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(errors)
    try:
        url = "zmq+tcp://127.0.0.1:0" if scheme == "zmq+tcp" else f"zmq+ipc://{tmp_path}/s.sock"
        await asyncio.wait_for(_abrupt_session(url), 30)
        for _ in range(3):  # let callbacks scheduled by the closes run, then collect the garbage
            await asyncio.sleep(0.01)
        gc.collect()
        await asyncio.sleep(0)
        gc.collect()
    finally:
        loop.set_exception_handler(previous)
    assert errors.calls == [], errors.describe()


@pytest.mark.parametrize("scheme", ["zmq+tcp", "zmq+ipc"])
async def test_cancelled_connects_log_no_protocol_violation(
    scheme: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A welcome that arrives just after connect() was cancelled is not the listener's fault."""
    t = ZMQTransport()
    try:
        url = "zmq+tcp://127.0.0.1:0" if scheme == "zmq+tcp" else f"zmq+ipc://{tmp_path}/s.sock"
        listener = await t.listen(url, _noop)
        with caplog.at_level(logging.WARNING, logger="aionet"):
            for _ in range(200):
                try:
                    conn = await asyncio.wait_for(t.connect(listener.address, timeout=T), 0.0005)
                except TimeoutError:
                    continue
                conn.abort()
            await asyncio.sleep(0.05)
    finally:
        await t.aclose()
    assert not [r.getMessage() for r in caplog.records if "violated" in r.getMessage()]
