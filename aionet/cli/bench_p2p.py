"""``aionet bench p2p`` and ``aionet bench tasks``: point-to-point and task throughput between
local node processes, with a progress bar, a table, ``--json`` and ``--plot``.

p2p: this process and one peer process (``python -m aionet.cli.bench_p2p peer SEED``). At each
size: request/reply round trips (median and p99 of ``--iters``), then a one-way burst (``node.send``
of numpy payloads, timed until the peer confirms it has all of them) for bandwidth and messages/s.

tasks: this process submits (it runs none) to ``--nodes - 1`` worker processes: throughput of
no-op tasks submitted at once, latency of one task at a time, and a map of 10 ms tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from ..errors import PeerUnavailable
from ..scheduler.allow import BENCH_TASKS

MODULE = BENCH_TASKS  # the task functions (aionet.testing.benchtasks)
CHANNEL = "aionet.bench.p2p"
DONE = "aionet.bench.done"


async def peer(seed: str, listen: str) -> None:
    """The far side of ``bench p2p`` (or a task worker): echo, count bursts, leave when told."""
    from ..config import Config
    from ..node import Node

    cfg = Config.from_dict({"scheduler": {"allow_modules": [MODULE]}, "log": {"level": "warning"}})
    node = Node(name=f"bench-peer-{os.getpid()}", listen=listen, join=[seed], config=cfg)
    done = asyncio.Event()
    got = 0  # messages received on CHANNEL, counted as they arrive
    arrived = asyncio.Condition()

    async def consume() -> None:
        # a standing consumer: a full mailbox stops the link, so the burst must be drained as it
        # comes, not by the handler of a request queued behind it
        nonlocal got
        while True:
            batch = await node.recv_batch(CHANNEL)
            async with arrived:
                got += len(batch)
                arrived.notify_all()

    # registered before the node starts: the bench asks for them as soon as it sees this member
    @node.service("bench.burst")
    async def burst(n: int) -> int:  # wait until n more than `start` have arrived
        start, want = n
        async with arrived:
            await arrived.wait_for(lambda: got >= start + want)
        return got - start

    @node.service("bench.count")
    async def count(_: Any) -> int:
        return got

    @node.service("bench.bye")
    async def bye(_: Any) -> None:
        done.set()

    async with node:
        consumer = asyncio.ensure_future(consume())
        print("ready", flush=True)
        try:
            await done.wait()
        finally:
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer


async def run_p2p(
    sizes: list[int], iters: int, burst_bytes: int, listen: str, on_peer: Callable[[str], None],
    progress: Callable[[dict[str, Any]], None], check: Callable[[], None], device: str = "cpu",
) -> list[dict[str, Any]]:  # fmt: skip
    """Round trips and one-way bursts per size; ``device="gpu"`` sends CuPy arrays (staged through
    pinned host buffers, or as device frames where the transport moves GPU memory)."""
    from ..collectives.bench import warm_array_module
    from ..node import Node

    xp = warm_array_module(device)  # before any node runs: CuPy's set-up would stall the loop

    rows = []
    async with Node(name="bench-p2p", listen=listen) as node:
        on_peer(node.address)
        await _wait(lambda: node.wait_members(2, timeout=0.5), check)
        other = next(n for n in node.members() if n != node.name)
        for size in sizes:
            payload = xp.zeros(size, xp.uint8)
            for _ in range(3):  # warm up connections and buffers
                await node.request(other, "aionet.echo", payload)
            rtts = []
            for _ in range(iters):
                t = time.perf_counter()
                await node.request(other, "aionet.echo", payload)
                rtts.append(time.perf_counter() - t)
            count = max(8, min(50_000, burst_bytes // max(size, 1)))
            start = await node.request(other, "bench.count", None)
            t = time.perf_counter()
            for i in range(count):
                await node.send(other, CHANNEL, payload)
                if i & 1023 == 1023:
                    await asyncio.sleep(0)  # small sends never wait: let heartbeats and acks run
            await node.request(other, "bench.burst", [start, count])  # all arrived (and were consumed)
            dt = time.perf_counter() - t
            rtts.sort()
            row = {"size": size, "rtt_p50_us": statistics.median(rtts) * 1e6,
                   "rtt_p99_us": rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))] * 1e6,
                   "msgs_per_s": count / dt, "gbytes_per_s": count * size / dt / 1e9, "messages": count}  # fmt: skip
            rows.append(row)
            progress(row)
        await node.request(other, "bench.bye", None)
    return rows


async def run_tasks(
    workers: int, n_tasks: int, listen: str, on_peer: Callable[[str], None], progress: Callable[[dict[str, Any]], None],
    check: Callable[[], None],
) -> list[dict[str, Any]]:  # fmt: skip
    from ..config import Config
    from ..node import Node

    cfg = Config.from_dict({"scheduler": {"run_local": False}, "log": {"level": "warning"}})
    rows: list[dict[str, Any]] = []
    async with Node(name="bench-tasks", listen=listen, config=cfg) as node:
        for _ in range(workers):
            on_peer(node.address)
        await _wait(lambda: node.wait_workers(workers, timeout=0.5), check)
        path = f"{MODULE}:noop"
        await node.gather([node.submit(path, i) for i in range(200)])  # warm up
        t = time.perf_counter()
        await node.gather([node.submit(path, i) for i in range(n_tasks)])
        dt = time.perf_counter() - t
        rows.append({"metric": "no-op tasks submitted at once", "value": n_tasks / dt, "unit": "tasks/s"})
        progress(rows[-1])
        lat = []
        for i in range(min(500, n_tasks)):
            t = time.perf_counter()
            await node.submit(path, i)
            lat.append(time.perf_counter() - t)
        rows.append({"metric": "one task at a time, p50", "value": statistics.median(lat) * 1e6, "unit": "us"})
        progress(rows[-1])
        n10 = 20 * workers
        t = time.perf_counter()
        await node.map(f"{MODULE}:sleep10", range(n10))
        dt = time.perf_counter() - t
        rows.append({"metric": f"map of {n10} x 10 ms tasks", "value": dt, "unit": "s", "tasks_per_s": n10 / dt})
        progress(rows[-1])
        for name in [m for m in node.members() if m != node.name]:
            await node.request(name, "bench.bye", None, timeout=10)
    return rows


async def _wait(attempt: Callable[[], Any], check: Callable[[], None], limit: float = 60.0) -> None:
    """Retry a short wait until it succeeds, raising at once through ``check`` if a peer process died."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit
    while True:
        check()
        try:
            await attempt()
            return
        except (TimeoutError, PeerUnavailable):
            if loop.time() > end:
                raise


def plot_p2p(rows: list[dict[str, Any]], path: str, title: str) -> None:
    """Bandwidth and round-trip time versus message size (log-log), as a PNG."""
    plt = _pyplot()
    fig, (bw, rtt) = plt.subplots(1, 2, figsize=(11, 4.2))
    sizes = [r["size"] for r in rows]
    bw.plot(sizes, [r["gbytes_per_s"] for r in rows], marker="o")
    bw.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="GB/s (one way)", title="bandwidth")
    rtt.plot(sizes, [r["rtt_p50_us"] for r in rows], marker="o", label="p50")
    rtt.plot(sizes, [r["rtt_p99_us"] for r in rows], marker=".", linestyle="--", label="p99")
    rtt.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="us", title="request/reply round trip")
    rtt.legend()
    for ax in (bw, rtt):
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_collective(rows: list[dict[str, Any]], path: str, title: str) -> None:
    """busbw versus size for a collective (out of place, and in place when measured)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sizes = [r["size"] for r in rows]
    for v, label in (("out", "out of place"), ("in", "in place")):
        if all(r.get(v) for r in rows):
            ax.plot(sizes, [r[v]["busbw"] for r in rows], marker="o", label=label)
    ax.set(xscale="log", xlabel="size (bytes)", ylabel="busbw (GB/s)", title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        import click

        raise click.ClickException("--plot needs matplotlib: pip install 'aionet[plot]'") from None
    return plt


if __name__ == "__main__":  # python -m aionet.cli.bench_p2p peer SEED LISTEN
    asyncio.run(peer(sys.argv[2], sys.argv[3]))
