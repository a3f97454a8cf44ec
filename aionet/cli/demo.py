"""``aionet demo``: three node processes on free loopback ports exchanging messages and a
large numpy array, with a short readable summary. Also the ``--app aionet.cli.demo:setup``
services those processes run.

numpy and the Node are imported inside the functions that use them: ``aionet --help`` loads
this module for the command's one-line help."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

import click

from ..config import Config

if TYPE_CHECKING:
    import numpy as np

    from ..node import Node


# ---------------------------------------------------------------- services run by the nodes
def setup(node: Node) -> None:
    """Register the demo services on a node (``aionet serve --app aionet.cli.demo:setup``)."""
    import numpy as np

    @node.service("demo.sink")
    def sink(arr: Any) -> dict[str, Any]:
        flat = np.asarray(arr).reshape(-1)
        return {"nbytes": int(flat.nbytes), "checksum": _checksum(flat)}

    @node.service("demo.ship")
    async def ship(spec: dict[str, Any]) -> dict[str, Any]:
        n = int(spec["size_mb"]) * 2**20 // 8
        arr = np.arange(n, dtype=np.float64)
        t0 = time.perf_counter()
        got = await node.request(spec["to"], "demo.sink", arr, timeout=60)
        dt = time.perf_counter() - t0
        return {"seconds": dt, "nbytes": arr.nbytes, "ok": got["checksum"] == _checksum(arr)}

    @node.service("demo.count")
    async def count(n: int) -> dict[str, Any]:
        got = 0
        t0 = None
        while got < n:
            batch = await node.recv_batch("demo.msgs")
            if t0 is None:
                t0 = time.perf_counter()
            got += len(batch)
        return {"count": got, "seconds": time.perf_counter() - (t0 or time.perf_counter())}


def _checksum(flat: np.ndarray) -> float:
    import numpy as np

    if flat.size == 0:
        return 0.0
    idx = np.linspace(0, flat.size - 1, num=min(flat.size, 1024)).astype(np.int64)
    return float(flat[idx].astype(np.float64).sum()) + float(flat.size)


# ---------------------------------------------------------------- the demo driver
#: transports the demo can run: three processes on this host need one that crosses processes
MULTI_PROCESS = ("tcp", "tls", "zmq+tcp", "zmq+ipc", "ucx", "rdma")


class DemoError(Exception):
    """Why the demo cannot run or did not finish, in one line for the user."""


def check_transport(scheme: str) -> None:
    """DemoError naming the fix when ``scheme`` cannot carry the demo on this machine."""
    from ..errors import AionetError
    from ..transports.registry import TransportRegistry

    if scheme == "inproc":
        raise DemoError(
            "inproc:// connects nodes inside one process and the demo runs three node processes; "
            f"use one of: {', '.join(MULTI_PROCESS)}"
        )
    try:
        TransportRegistry().transport_class(scheme).check_available()
    except AionetError as exc:
        raise DemoError(f"{scheme}:// is not available here: {exc}") from None


def _listen_url(scheme: str, tmp: str, name: str) -> str:
    if scheme == "zmq+ipc":  # a socket file per node, in the demo's own temporary directory
        return f"zmq+ipc://{tmp}/{name}.sock"
    return f"{scheme}://127.0.0.1:0"


def _security(scheme: str, tmp: str) -> dict[str, str]:
    """``[security]`` for this demo's cluster: a fresh token, and throwaway TLS keys for tls://."""
    sec = {"token": secrets.token_hex(16)}
    if scheme == "tls":
        from ..security.keys import KeygenError, generate

        try:
            ks = generate(os.path.join(tmp, "keys"))
        except KeygenError as exc:
            raise DemoError(f"tls:// needs a certificate and the demo could not make one: {exc}") from None
        sec |= {"tls_cert": str(ks.node_cert), "tls_key": str(ks.node_key), "tls_ca": str(ks.ca_cert)}
    return sec


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the node gets SIGTERM if the demo dies without stopping it (even by SIGKILL)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _describe(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


async def _start(
    name: str, listen: str, join: str | None, security: dict[str, str], procs: dict[str, asyncio.subprocess.Process]
) -> str:
    """Start one ``aionet serve`` (recorded in ``procs`` at once) and return its address."""
    args = [sys.executable, "-m", "aionet", "serve", "--name", name, "--listen", listen]
    args += ["--app", "aionet.cli.demo:setup", "--log-level", "warning"]
    if join:
        args += ["--join", join]
    env = {**os.environ, **{f"AIONET_SECURITY_{k.upper()}": v for k, v in security.items()}}
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdout=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
        env=env,
        start_new_session=True,  # a Ctrl-C reaches the demo, which stops its nodes in order
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
    )
    procs[name] = proc
    assert proc.stdout is not None
    while True:
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
        except TimeoutError:
            raise DemoError(f"node {name} did not start within 60 s") from None
        if not line:
            code = await proc.wait()
            raise DemoError(f"node {name} exited before it was ready ({_describe(code)}); its error is above")
        if line.startswith(b"ready "):
            return str(json.loads(line[6:])["addresses"][0])


async def _stop(procs: dict[str, asyncio.subprocess.Process], timeout: float = 15.0) -> dict[str, int]:
    """SIGTERM each node, wait for it (SIGKILL past ``timeout``); name -> exit code."""
    for p in procs.values():
        if p.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
    codes = {}
    for name, p in procs.items():
        try:
            codes[name] = await asyncio.wait_for(p.wait(), timeout)
        except TimeoutError:
            _kill(p)
            codes[name] = await p.wait()
    return codes


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)


async def _demo(size_mb: int, scheme: str, n_msgs: int, n_reqs: int) -> int:
    """Run the demo; 0 when everything arrived intact and the nodes stopped cleanly. A
    SIGINT/SIGTERM/SIGHUP stops the nodes and returns 128 + signal (a second one kills them)."""
    from rich.console import Console

    check_transport(scheme)
    console = Console()
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    assert me is not None
    procs: dict[str, asyncio.subprocess.Process] = {}
    signalled: list[int] = []

    def on_signal(sig: signal.Signals) -> None:
        if signalled:  # impatient: no more waiting for the nodes
            for p in procs.values():
                _kill(p)
            return
        signalled.append(sig)
        me.cancel()

    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    for sig in sigs:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        with tempfile.TemporaryDirectory(prefix="aionet-demo-") as tmp:
            codes: dict[str, int] = {}
            try:
                security = _security(scheme, tmp)
                t0 = time.perf_counter()
                addr_a = await _start("demo-a", _listen_url(scheme, tmp, "demo-a"), None, security, procs)
                await asyncio.gather(
                    *(_start(n, _listen_url(scheme, tmp, n), addr_a, security, procs) for n in ("demo-b", "demo-c"))
                )
                startup = time.perf_counter() - t0
                console.print(f"3 nodes up over {scheme}:// in {startup:.2f} s; measuring ...")
                body = asyncio.ensure_future(
                    _measure(scheme, tmp, addr_a, security, size_mb, n_msgs, n_reqs, startup, console)
                )
                deaths = [asyncio.ensure_future(p.wait()) for p in procs.values()]
                try:
                    await asyncio.wait([body, *deaths], return_when=asyncio.FIRST_COMPLETED)
                    if not body.done() or body.exception() is not None:
                        # a node that died makes the client's calls fail too: name the death
                        await asyncio.wait(deaths, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in deaths:
                        w.cancel()
                    if not body.done():
                        body.cancel()
                    await asyncio.gather(body, *deaths, return_exceptions=True)
                dead = [n for n, p in procs.items() if p.returncode is not None]
                if dead:
                    why = ", ".join(f"{n} ({_describe(procs[n].returncode)})" for n in dead)
                    raise DemoError(f"node {why} died during the demo over {scheme}://")
                ok = body.result()
            finally:
                codes = await _stop(procs)
            bad = {n: c for n, c in codes.items() if c != 0}
            console.print(
                f"nodes shut down cleanly: {not bad} (exit codes {list(codes.values())})"
                + "".join(f"; {n}: {_describe(c)}" for n, c in bad.items())
            )
            return 0 if ok and not bad else 1
    except asyncio.CancelledError:
        if signalled:
            console.print(f"demo stopped by {signal.Signals(signalled[0]).name}; its nodes were stopped")
            return 128 + signalled[0]
        raise
    finally:
        for sig in sigs:
            loop.remove_signal_handler(sig)


async def _measure(
    scheme: str,
    tmp: str,
    addr_a: str,
    security: dict[str, str],
    size_mb: int,
    n_msgs: int,
    n_reqs: int,
    startup: float,
    console: Any,
) -> bool:
    import numpy as np
    from rich.table import Table

    from ..errors import AionetError
    from ..node import Node

    cfg = Config.from_dict({"security": security})
    listen = _listen_url(scheme, tmp, "demo-client")
    try:
        async with Node(name=f"demo-client-{os.getpid()}", listen=listen, join=[addr_a], config=cfg) as me:
            names = ["demo-a", "demo-b", "demo-c"]
            infos = [await me.request(n, "aionet.info", timeout=10) for n in names]

            # request/reply latency, 64-byte payload
            payload = b"x" * 64
            for _ in range(min(200, n_reqs)):
                await me.request("demo-a", "aionet.echo", payload, timeout=5)
            lat = []
            for _ in range(n_reqs):
                s = time.perf_counter()
                await me.request("demo-a", "aionet.echo", payload, timeout=5)
                lat.append(time.perf_counter() - s)
            lat.sort()

            # one-way small messages into a mailbox on demo-b
            counter = asyncio.ensure_future(me.request("demo-b", "demo.count", n_msgs, timeout=60))
            try:
                t_send = time.perf_counter()
                for i in range(n_msgs):
                    await me.send("demo-b", "demo.msgs", i)
                counted = await counter
            finally:
                if not counter.done():
                    counter.cancel()
                    await asyncio.gather(counter, return_exceptions=True)
            counted["seconds"] = time.perf_counter() - t_send  # first send to last one counted

            # a large numpy array from demo-b to demo-c (the client only asks)
            shipped = await me.request("demo-b", "demo.ship", {"to": "demo-c", "size_mb": size_mb}, timeout=120)
            # and one from this client to demo-a, checked end to end
            arr = np.random.default_rng(1).standard_normal(2**20)
            sunk = await me.request("demo-a", "demo.sink", arr, timeout=30)
            direct_ok = sunk["checksum"] == _checksum(arr)
            members = me.members()
    except (TimeoutError, AionetError, OSError) as exc:
        raise DemoError(f"the demo over {scheme}:// failed: {exc or type(exc).__name__}") from None

    table = Table(title=f"aionet demo over {scheme}://")
    table.add_column("what")
    table.add_column("result", justify="right")
    table.add_row("nodes started", f"3 processes in {startup:.2f} s")
    for inf in infos:
        table.add_row(f"  {inf['name']}", f"pid {inf['pid']}  {inf['listen'][0]}")
    if lat:
        table.add_row("request/reply 64 B p50", f"{statistics.median(lat) * 1e6:.0f} us")
        table.add_row("request/reply 64 B p99", f"{lat[int(len(lat) * 0.99)] * 1e6:.0f} us")
    rate = counted["count"] / max(counted["seconds"], 1e-9)
    table.add_row("one-way small messages", f"{counted['count']} at {rate:,.0f} msg/s")
    gbps = shipped["nbytes"] / shipped["seconds"] / 1e9
    table.add_row(
        f"{size_mb} MiB array demo-b -> demo-c",
        f"{shipped['seconds'] * 1e3:.1f} ms, {gbps:.2f} GB/s, intact={shipped['ok']}",
    )
    table.add_row("8 MiB array client -> demo-a", f"intact={direct_ok}")
    table.add_row("members seen by the client", ", ".join(sorted(members)))
    console.print(table)
    return bool(shipped["ok"] and direct_ok and counted["count"] == n_msgs)


def run_demo(size_mb: int = 64, scheme: str = "tcp", messages: int = 50_000, requests: int = 2000) -> int:
    """The exit code of ``aionet demo``; raises DemoError with a one-line reason."""
    from ..runner import run

    return run(_demo(size_mb, scheme.lower(), messages, requests))


@click.command()
@click.option("--size-mb", default=64, show_default=True, help="Size of the numpy array shipped between nodes.")
@click.option(
    "--transport", default="tcp", show_default=True, help="tcp, tls, zmq+tcp, zmq+ipc, ucx or rdma (what is installed)."
)
@click.option("--messages", default=50_000, show_default=True, help="One-way small messages to time.")
@click.option("--requests", default=2000, show_default=True, help="Request/reply round trips to time.")
def demo(size_mb: int, transport: str, messages: int, requests: int) -> None:
    """Start three local node processes, exchange messages and a large array, print a summary.

    SIGINT, SIGTERM or SIGHUP stop the node processes before the demo exits; temporary
    files (zmq+ipc sockets, tls keys) are removed."""
    from ..log import configure as configure_logging

    configure_logging("warning")
    try:
        code = run_demo(size_mb=size_mb, scheme=transport, messages=messages, requests=requests)
    except DemoError as exc:
        raise click.ClickException(str(exc)) from None
    sys.exit(code)
