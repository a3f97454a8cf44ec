#!/usr/bin/env python
"""What the reliable link costs: the Node (sequence numbers, acks, replay buffer, router)
versus the same TCP transport and Serializer driven by hand.

Two processes on 127.0.0.1 per measurement (a server child and a client child, fresh for
every repeat, in rotating order):

* ``node`` -- ``aionet.Node`` over ``tcp://``: ``await cli.request("srv", "aionet.echo", p)``
  and ``await cli.send("srv", "sink", array)``, the receiver draining with ``recv_batch``;
* ``bare`` -- ``TCPTransport`` connections with the same ``Serializer`` and envelopes of the
  same shape (``[kind, seq, ack, ...]``) but no link: the client sends a request message, the
  server decodes it and sends the reply; one-way arrays are decoded and counted. Both ends use
  the transport's fastest path, as the node does: push-mode receive (``start_receiving``)
  and synchronous enqueue (``write_nowait``).

Rows: request/reply round trip of a 64 B payload (sequential, one outstanding; p50 and p99
in microseconds), and one-way throughput of 64 MiB numpy arrays of random bytes (GB/s, timed
from the first send until the receiver confirmed the byte count). Two more rows show the CPU
time both processes spent per round trip and per GB: on a machine shared with other jobs,
CPU time is a steadier measure of the link's cost than wall-clock time. Bar: the link costs at most
10% -- node p50 <= 1.10 x bare p50 and node throughput >= 0.90 x bare throughput, comparing
medians over the repeats. Spread (min-max over repeats) is shown; these machines are noisy.

    python benchmarks/link_overhead.py                  # 5 repeats
    python benchmarks/link_overhead.py --quick          # 2 repeats, smaller volumes
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C

SCRIPT = Path(__file__).resolve()
IMPLS = ("node", "bare")
SEND, REQ, REP, CPU, COUNT = 1, 2, 3, 8, 9


@dataclass
class Params:
    warmup: int = 1000
    requests: int = 10000
    array_mib: int = 64
    arrays: int = 16
    warmup_arrays: int = 2


def _quiet_config() -> Any:
    from aionet.config import Config

    return Config.from_dict({"log": {"level": "warning"}}, env={})


def make_array(nbytes: int, seed: int) -> Any:
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)


def _result(samples: list[int], p: Params, seconds: float, *cpu: tuple[float, float]) -> dict[str, Any]:
    """Latency stats, throughput, and CPU seconds (client + server) per round trip / per GB:
    CPU time is what other processes on a busy machine cannot inflate much, unlike wall time."""
    rt_cpu = (cpu[1][0] - cpu[0][0]) + (cpu[1][1] - cpu[0][1])
    bulk_cpu = (cpu[3][0] - cpu[2][0]) + (cpu[3][1] - cpu[2][1])
    nbytes = p.arrays * p.array_mib * C.MiB
    return {
        "rtt": C.latency_stats_us(samples),
        "gbps": nbytes / seconds / 1e9,
        "seconds": seconds,
        "cpu_us_per_rt": rt_cpu / p.requests * 1e6,
        "cpu_s_per_gb": bulk_cpu / (nbytes / 1e9),
    }


# --------------------------------------------------------------------------- node


async def node_server() -> None:
    import aionet

    async with aionet.Node(name="srv", listen="tcp://127.0.0.1:0", config=_quiet_config()) as srv:
        received = {"bytes": 0}
        changed = asyncio.Event()

        @srv.service("bench.cpu")
        def cpu(_: Any) -> float:
            return time.process_time()

        @srv.service("bench.count")
        async def count(want: int) -> int:
            while received["bytes"] < want:
                changed.clear()
                await asyncio.wait_for(changed.wait(), 120)
            return received["bytes"]

        async def drain() -> None:
            while True:
                for arr in await srv.recv_batch("sink"):
                    received["bytes"] += arr.nbytes
                changed.set()

        task = asyncio.ensure_future(drain())
        C.emit("READY", {"url": srv.address})
        try:
            await asyncio.Event().wait()
        finally:
            task.cancel()


async def node_client(url: str, p: Params) -> dict[str, Any]:
    import aionet

    # Made before the node starts: generating 128 MiB of random bytes blocks the loop for
    # most of a second, which the peer's failure detector rightly takes for a hung node.
    size = p.array_mib * C.MiB
    arrays = [make_array(size, i) for i in range(2)]
    async with aionet.Node(name="cli", listen="tcp://127.0.0.1:0", join=[url], config=_quiet_config()) as cli:
        payload = os.urandom(64)
        request = cli.request
        for _ in range(p.warmup):
            await request("srv", "aionet.echo", payload, timeout=10)
        samples = []
        now = time.perf_counter_ns
        cpu0 = (await request("srv", "bench.cpu"), time.process_time())
        for _ in range(p.requests):  # no timeout: the bare client has none either
            t = now()
            await request("srv", "aionet.echo", payload)
            samples.append(now() - t)
        cpu1 = (await request("srv", "bench.cpu"), time.process_time())
        sent = 0
        for i in range(p.warmup_arrays):
            await cli.send("srv", "sink", arrays[i % 2])
            sent += size
        await cli.request("srv", "bench.count", sent, timeout=120)
        gc.collect()
        cpu2 = (await request("srv", "bench.cpu"), time.process_time())
        t0 = time.perf_counter()
        for i in range(p.arrays):
            await cli.send("srv", "sink", arrays[i % 2])
            sent += size
        got = await cli.request("srv", "bench.count", sent, timeout=300)
        seconds = time.perf_counter() - t0
        cpu3 = (await request("srv", "bench.cpu"), time.process_time())
        assert got == sent, (got, sent)
        return _result(samples, p, seconds, cpu0, cpu1, cpu2, cpu3)


# --------------------------------------------------------------------------- bare transport


async def bare_server() -> None:
    from aionet.codecs.serialize import Serializer
    from aionet.transports.tcp import TCPTransport

    ser = Serializer()
    transport = TCPTransport()

    async def handle(conn: Any) -> None:
        # Push mode and synchronous enqueue: the transport's fastest path, as the node uses it.
        received = 0
        seq = 0
        waiting: list[tuple[int, int]] = []
        closed = asyncio.get_running_loop().create_future()

        def reply(rid: int, ack: int, payload: Any) -> Any:
            nonlocal seq
            seq += 1
            return conn.write_nowait(ser.dumps([REP, seq, ack, rid, payload]))

        def on_messages(batch: list[Any]) -> Any:
            nonlocal received
            pending = None
            for frames in batch:
                env = ser.loads(frames)
                kind = env[0]
                if kind == REQ:  # [REQ, seq, ack, rid, service, payload]
                    pending = reply(env[3], env[1], env[5]) or pending
                elif kind == SEND:  # [SEND, seq, ack, channel, array]
                    received += env[4].nbytes
                elif kind == COUNT:  # [COUNT, seq, ack, rid, want]
                    waiting.append((env[3], env[4]))
                elif kind == CPU:  # [CPU, seq, ack, rid]
                    pending = reply(env[3], env[1], time.process_time()) or pending
            while waiting and received >= waiting[0][1]:
                pending = reply(waiting.pop(0)[0], 0, received) or pending
            return pending

        def on_closed(_exc: BaseException) -> None:
            if not closed.done():
                closed.set_result(None)

        conn.start_receiving(on_messages, on_closed)
        await closed

    lst = await transport.listen("tcp://127.0.0.1:0", handle)
    C.emit("READY", {"url": lst.address})
    await asyncio.Event().wait()


async def bare_client(url: str, p: Params) -> dict[str, Any]:
    from aionet.codecs.serialize import Serializer
    from aionet.transports.tcp import TCPTransport

    ser = Serializer()
    loop = asyncio.get_running_loop()
    size = p.array_mib * C.MiB
    arrays = [make_array(size, i) for i in range(2)]  # before connecting, as in node_client
    conn = await TCPTransport().connect(url, timeout=10)
    dumps, loads = ser.dumps, ser.loads
    seq = 0
    waiters: dict[int, asyncio.Future[Any]] = {}

    def on_messages(batch: list[Any]) -> None:
        for frames in batch:
            rep = loads(frames)  # [REP, seq, ack, rid, payload]
            waiters.pop(rep[3]).set_result(rep[4])

    def on_closed(exc: BaseException) -> None:
        for fut in waiters.values():
            if not fut.done():
                fut.set_exception(exc)

    conn.start_receiving(on_messages, on_closed)

    async def post(kind: int, *fields: Any) -> None:
        nonlocal seq
        seq += 1
        w = conn.write_nowait(dumps([kind, seq, 0, *fields]))
        if w is not None:
            await w

    async def call(kind: int, *fields: Any) -> Any:  # [kind, seq, ack, rid(=seq), *fields]
        fut = waiters[seq + 1] = loop.create_future()
        await post(kind, seq + 1, *fields)
        return await fut

    payload = os.urandom(64)
    for _ in range(p.warmup):
        await call(REQ, "aionet.echo", payload)
    samples = []
    now = time.perf_counter_ns
    cpu0 = (await call(CPU), time.process_time())
    for _ in range(p.requests):
        t = now()
        await call(REQ, "aionet.echo", payload)
        samples.append(now() - t)
    cpu1 = (await call(CPU), time.process_time())
    sent = 0
    for i in range(p.warmup_arrays):
        await post(SEND, "sink", arrays[i % 2])
        sent += size
    await call(COUNT, sent)
    gc.collect()
    cpu2 = (await call(CPU), time.process_time())
    t0 = time.perf_counter()
    for i in range(p.arrays):
        await post(SEND, "sink", arrays[i % 2])
        sent += size
    got = await call(COUNT, sent)
    seconds = time.perf_counter() - t0
    cpu3 = (await call(CPU), time.process_time())
    assert got == sent, (got, sent)
    await conn.close()
    return _result(samples, p, seconds, cpu0, cpu1, cpu2, cpu3)


# --------------------------------------------------------------------------- parent


def run_pair(impl: str, p: Params, verbose: bool) -> dict[str, Any]:
    ppid = str(os.getpid())
    children: list[C.Child] = []
    try:
        srv = C.Child(C.python_argv(SCRIPT, "--_role", f"{impl}-server", "--_ppid", ppid), label=f"lo-{impl}-srv")
        children.append(srv)
        info = srv.expect("READY", timeout=60)
        cli = C.Child(
            C.python_argv(SCRIPT, "--_role", f"{impl}-client", "--_ppid", ppid, "--_url", info["url"],
                          "--_params", json.dumps(asdict(p))),
            label=f"lo-{impl}-cli",
        )  # fmt: skip
        children.append(cli)
        return cli.expect("RESULT", timeout=900)
    except C.ChildError as exc:
        return {"error": str(exc)}
    finally:
        for ch in children:
            if verbose:
                tail = ch.log_tail(10)
                if tail:
                    print(f"--- log tail of {ch.label} (pid {ch.pid}) ---\n{tail}", file=sys.stderr)
            ch.kill()
            if not verbose:
                ch.remove_log()


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="fresh process pairs per implementation")
    ap.add_argument("--quick", action="store_true", help="2 repeats, fewer requests, 256 MiB of arrays")
    ap.add_argument("--max-overhead", type=float, default=0.10, help="bar: allowed cost of the link (0.10 = 10%%)")
    ap.add_argument("--json", default=str(C.RESULTS_DIR / "link_overhead.json"), help="JSON output path")
    ap.add_argument("--plain", action="store_true", help="plain-text table instead of rich")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a bar fails")
    ap.add_argument("-v", "--verbose", action="store_true", help="show child logs")
    ap.add_argument("--_role", help=argparse.SUPPRESS)
    ap.add_argument("--_url", help=argparse.SUPPRESS)
    ap.add_argument("--_ppid", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_params", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._role:
        signal.signal(signal.SIGINT, lambda *_: os._exit(130))
        if args._ppid:
            C.parent_watchdog(args._ppid)
        C.hard_deadline(1200)
        impl, role = args._role.split("-")
        if role == "server":
            C.run_async(node_server() if impl == "node" else bare_server())
        else:
            p = Params(**json.loads(args._params))
            client = node_client if impl == "node" else bare_client
            C.emit("RESULT", C.run_async(client(args._url, p)))
        return 0

    C.install_cleanup()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    p = Params()
    repeat = args.repeat
    if args.quick:
        p = Params(warmup=300, requests=3000, arrays=4, warmup_arrays=1)
        repeat = min(repeat, 2)
    runs: dict[str, list[dict[str, Any]]] = {impl: [] for impl in IMPLS}
    errors: list[str] = []
    try:
        for r in range(repeat):
            order = IMPLS if r % 2 == 0 else tuple(reversed(IMPLS))
            for impl in order:
                print(f"link_overhead: repeat {r + 1}/{repeat}: {impl} ...", flush=True)
                res = run_pair(impl, p, args.verbose)
                if "error" in res:
                    errors.append(f"{impl}: {res['error']}")
                else:
                    runs[impl].append(res)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
    finally:
        C._cleanup_children()

    summary: dict[str, dict[str, Any]] = {}
    for impl in IMPLS:
        summary[impl] = {
            "p50_us": C.summarize(x["rtt"]["p50"] for x in runs[impl]),
            "p99_us": C.summarize(x["rtt"]["p99"] for x in runs[impl]),
            "gbps": C.summarize(x["gbps"] for x in runs[impl]),
            "cpu_us_per_rt": C.summarize(x["cpu_us_per_rt"] for x in runs[impl]),
            "cpu_s_per_gb": C.summarize(x["cpu_s_per_gb"] for x in runs[impl]),
        }
    med = {impl: {k: v["median"] for k, v in s.items()} for impl, s in summary.items()}
    p50_ratio = _ratio(med["node"]["p50_us"], med["bare"]["p50_us"])
    p99_ratio = _ratio(med["node"]["p99_us"], med["bare"]["p99_us"])
    gbps_ratio = _ratio(med["node"]["gbps"], med["bare"]["gbps"])
    cpu_rt_ratio = _ratio(med["node"]["cpu_us_per_rt"], med["bare"]["cpu_us_per_rt"])
    cpu_gb_ratio = _ratio(med["node"]["cpu_s_per_gb"], med["bare"]["cpu_s_per_gb"])
    bars = {
        "p50": p50_ratio is not None and p50_ratio <= 1 + args.max_overhead,
        "throughput": gbps_ratio is not None and gbps_ratio >= 1 - args.max_overhead,
    }

    def verdict(ok: bool | None) -> str:
        return "-" if ok is None else "PASS" if ok else "FAIL"

    rows = [
        ["req/rep 64 B p50 (us)", C.fmt_summary(summary["node"]["p50_us"]), C.fmt_summary(summary["bare"]["p50_us"]),
         C.fmt_num(p50_ratio), f"<= {1 + args.max_overhead:.2f}", verdict(bars["p50"])],
        ["req/rep 64 B p99 (us)", C.fmt_summary(summary["node"]["p99_us"]), C.fmt_summary(summary["bare"]["p99_us"]),
         C.fmt_num(p99_ratio), "-", "-"],
        [f"one-way {p.array_mib} MiB arrays (GB/s)", C.fmt_summary(summary["node"]["gbps"]),
         C.fmt_summary(summary["bare"]["gbps"]), C.fmt_num(gbps_ratio), f">= {1 - args.max_overhead:.2f}",
         verdict(bars["throughput"])],
        ["req/rep CPU per round trip (us, both sides)", C.fmt_summary(summary["node"]["cpu_us_per_rt"]),
         C.fmt_summary(summary["bare"]["cpu_us_per_rt"]), C.fmt_num(cpu_rt_ratio), "-", "-"],
        [f"{p.array_mib} MiB arrays CPU per GB (s, both sides)", C.fmt_summary(summary["node"]["cpu_s_per_gb"]),
         C.fmt_summary(summary["bare"]["cpu_s_per_gb"]), C.fmt_num(cpu_gb_ratio), "-", "-"],
    ]  # fmt: skip
    footer = (
        f"median (min-max) over {repeat} repeats, fresh process pairs, {C.loop_name()}; "
        f"{p.requests} round trips after {p.warmup} warm-up; {p.arrays} x {p.array_mib} MiB timed"
    )
    if errors:
        footer += "\nerrors: " + "; ".join(errors)
    C.print_table(
        "cost of the reliable link: Node vs bare TCPTransport + Serializer",
        ["row", "node", "bare", "node/bare", "bar", "verdict"],
        rows,
        footer=footer,
        plain=args.plain,
    )
    passed = not errors and all(bars.values())
    print("PASS" if passed else "FAIL")
    out = {
        "benchmark": "link_overhead",
        "environment": C.environment(),
        "params": asdict(p),
        "repeat": repeat,
        "runs": runs,
        "summary": summary,
        "ratios": {
            "p50": p50_ratio,
            "p99": p99_ratio,
            "throughput": gbps_ratio,
            "cpu_per_round_trip": cpu_rt_ratio,
            "cpu_per_gb": cpu_gb_ratio,
        },
        "bars": bars,
        "errors": errors,
        "pass": passed,
    }
    print(f"wrote {C.write_json(args.json, out)}")
    print(json.dumps({"pass": passed, "ratios": out["ratios"], "bars": bars}))
    return 0 if passed or not args.strict else 1


if __name__ == "__main__":
    sys.exit(main())
