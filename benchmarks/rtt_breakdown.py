"""Where a 64 B request/reply round trip goes: latency, syscalls and loop wake-ups per round trip.

Runs one server process and one client process (like ``p2p.py``'s latency row) doing
``node.request(peer, "echo", 64 B)`` in a loop (``aionet``), pyzmq's synchronous REQ/REP
(``pyzmq``), or a DEALER/ROUTER echo driven from uvloop through ``ZMQ_FD`` with no aionet at
all (``zmqloop``: the floor for any asyncio zmq transport), and prints the p50/p90 round
trip. Two extra modes explain the number:

* ``--stamps``: both processes record ``perf_counter_ns`` (CLOCK_MONOTONIC, comparable across
  processes) at request start, each zmq send, each zmq receive and when the caller resumes, and
  the parent prints the median time of each hop (aionet over zmq only).
* ``--count``: run under ``strace -f -c`` twice (``-n`` and ``2 * -n`` round trips) and print
  the difference per round trip for each syscall, so setup and teardown cancel out.

    python3 benchmarks/rtt_breakdown.py --impl aionet --transport zmq+tcp -n 3000
    python3 benchmarks/rtt_breakdown.py --impl pyzmq --count -n 2000
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import end_children

HERE = Path(__file__).resolve().parent
PAYLOAD = b"x" * 64


# --------------------------------------------------------------------------- stamps
class Stamps:
    """(label, perf_counter_ns) pairs recorded in one process; written as JSON at exit."""

    def __init__(self) -> None:
        self.items: list[tuple[str, int]] = []

    def add(self, label: str) -> None:
        self.items.append((label, time.perf_counter_ns()))

    def install_zmq(self) -> None:
        """Wrap the zmq transport's send and drain so each records a stamp."""
        from aionet.transports.zmq import connection, listener, pump

        real_send = pump.bsend
        add = self.add

        def bsend(sock: Any, data: Any, flags: int = 0, copy: bool = True, track: bool = False) -> Any:
            if not flags & pump.zmq.SNDMORE:
                add("send")
            return real_send(sock, data, flags, copy=copy, track=track)

        connection.bsend = bsend
        listener.bsend = bsend
        for cls in (connection.DealerConnection, listener.RouterListener):
            real_drain = cls._drain

            def drain(self: Any, budget: int, force: bool = False, _real: Any = real_drain) -> bool:
                before = self._queued_msgs
                out = _real(self, budget, force)
                if self._queued_msgs != before:
                    add("recv")
                return out

            cls._drain = drain  # type: ignore[method-assign]
        real_service = pump.Pump._service

        def service(self: Any, *args: Any) -> None:
            add("wake")
            real_service(self, *args)

        pump.Pump._service = service  # type: ignore[method-assign]

    def dump(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.items, f)


# --------------------------------------------------------------------------- aionet
def url(transport: str) -> str:
    return f"{transport}://127.0.0.1:0"


async def aionet_server(transport: str, stamps_path: str | None) -> None:
    import aionet

    st = Stamps()
    if stamps_path and transport.startswith("zmq"):
        st.install_zmq()
    async with aionet.Node(name="srv", listen=url(transport)) as srv:

        @srv.service("echo")
        async def echo(x: Any) -> Any:
            return x

        print(json.dumps({"url": srv.address}), flush=True)
        try:
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        finally:
            if stamps_path:
                st.dump(stamps_path)


async def aionet_client(transport: str, server_url: str, n: int, warmup: int, stamps_path: str | None) -> list[int]:
    import aionet

    st = Stamps()
    if stamps_path and transport.startswith("zmq"):
        st.install_zmq()
    async with aionet.Node(name="cli", listen=url(transport), join=[server_url]) as cli:
        request = cli.request
        for _ in range(warmup):
            await request("srv", "echo", PAYLOAD, timeout=5)
        if INFLIGHT:
            return await inflight(request, n)
        add = st.add if stamps_path else None
        clock = time.perf_counter_ns
        samples = []
        for _ in range(n):
            t0 = clock()
            if add:
                add("request")
            await request("srv", "echo", PAYLOAD, timeout=5)
            if add:
                add("resumed")
            samples.append(clock() - t0)
        if stamps_path:
            st.dump(stamps_path)
    return samples


INFLIGHT = int(os.environ.get("RTT_INFLIGHT", "0"))


async def inflight(request: Any, n: int) -> list[int]:
    """``INFLIGHT`` tasks each looping on request until ``n`` are answered; one "sample":
    the nanoseconds per request."""
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await request("srv", "echo", PAYLOAD, timeout=10)

    t0 = time.perf_counter_ns()
    await asyncio.gather(*(worker() for _ in range(INFLIGHT)))
    return [(time.perf_counter_ns() - t0) // n]


# --------------------------------------------------------------------------- pyzmq
def pyzmq_server() -> None:
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.REP)
    port = s.bind_to_random_port("tcp://127.0.0.1")
    print(json.dumps({"url": f"tcp://127.0.0.1:{port}"}), flush=True)
    s.rcvtimeo = 200
    while True:
        try:
            m = s.recv()
        except zmq.Again:
            if not sys.stdin.readable():
                break
            continue
        if m == b"STOP":
            s.send(b"")
            break
        s.send(m)
    s.close(0)
    ctx.term()


def pyzmq_client(server_url: str, n: int, warmup: int) -> list[int]:
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.REQ)
    s.connect(server_url)
    clock = time.perf_counter_ns
    for _ in range(warmup):
        s.send(PAYLOAD)
        s.recv()
    samples = []
    for _ in range(n):
        t0 = clock()
        s.send(PAYLOAD)
        s.recv()
        samples.append(clock() - t0)
    s.send(b"STOP")
    s.recv()
    s.close(0)
    ctx.term()
    return samples


# --------------------------------------------------------------------------- zmq on the loop, no aionet
def _zmq_pump(sock: Any, on_message: Any) -> Any:
    """Drive ``sock`` from the running loop through ZMQ_FD (edge-triggered): drain on wake-up;
    returns the check to run after a send (EVENTS, then drain if something waits)."""
    import zmq

    loop = asyncio.get_running_loop()

    def drain() -> None:
        while True:
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return  # the failed receive left ZMQ_FD armed
            on_message(parts)

    def after_send() -> None:
        if sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            loop.call_soon(drain)

    loop.add_reader(sock.getsockopt(zmq.FD), drain)
    loop.call_soon(drain)
    return after_send


async def zmqloop_server() -> None:
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    port = s.bind_to_random_port("tcp://127.0.0.1")
    print(json.dumps({"url": f"tcp://127.0.0.1:{port}"}), flush=True)

    def echo(parts: list[bytes]) -> None:
        s.send_multipart(parts, zmq.NOBLOCK)
        after()

    after = _zmq_pump(s, echo)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    s.close(0)
    ctx.term()


async def zmqloop_client(server_url: str, n: int, warmup: int) -> list[int]:
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(server_url)
    loop = asyncio.get_running_loop()
    box: list[asyncio.Future[None]] = []
    after = _zmq_pump(s, lambda parts: box.pop().set_result(None))
    clock = time.perf_counter_ns
    samples = []
    for i in range(warmup + n):
        fut = loop.create_future()
        box.append(fut)
        t0 = clock()
        s.send(PAYLOAD, zmq.NOBLOCK)
        after()
        await fut
        if i >= warmup:
            samples.append(clock() - t0)
    s.close(0)
    ctx.term()
    return samples


# --------------------------------------------------------------------------- orchestration
CALLBACKS_OUT = os.environ.get("RTT_CALLBACKS_OUT")


def _callback_name(cb: Any) -> str:
    fn = getattr(cb, "__func__", cb)
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    if name.endswith("task_wakeup") or name.endswith("__step") or type(cb).__name__ == "builtin_function_or_method":
        owner = getattr(cb, "__self__", None)
        if isinstance(owner, asyncio.Task):
            coro = owner.get_coro()
            return f"task {getattr(coro, '__qualname__', '?')}"
    return name


def run_async(coro: Any) -> Any:
    """uvloop; with RTT_CALLBACKS_OUT set, a loop that counts what is scheduled (call_soon,
    call_later/call_at, by callback name), written to that file at exit."""
    import uvloop

    if not CALLBACKS_OUT:
        return uvloop.run(coro)
    counts: dict[str, int] = {}

    class CountingLoop(uvloop.Loop):  # type: ignore[misc]
        def call_soon(self, callback: Any, *args: Any, context: Any = None) -> Any:
            k = "soon " + _callback_name(callback)
            counts[k] = counts.get(k, 0) + 1
            return super().call_soon(callback, *args, context=context)

        def call_later(self, delay: float, callback: Any, *args: Any, context: Any = None) -> Any:
            # (uvloop's call_at goes through call_later)
            k = "timer " + _callback_name(callback)
            counts[k] = counts.get(k, 0) + 1
            return super().call_later(delay, callback, *args, context=context)

    try:
        with asyncio.Runner(loop_factory=CountingLoop) as runner:
            return runner.run(coro)
    finally:
        with open(CALLBACKS_OUT, "w") as f:
            json.dump(counts, f)


def child(args: argparse.Namespace) -> None:
    if args.role == "server":
        if args.impl == "pyzmq":
            pyzmq_server()
        elif args.impl == "zmqloop":
            run_async(zmqloop_server())
        else:
            run_async(aionet_server(args.transport, args.stamps))
        return
    if args.impl == "pyzmq":
        samples = pyzmq_client(args.url, args.n, args.warmup)
    elif args.impl == "zmqloop":
        samples = run_async(zmqloop_client(args.url, args.n, args.warmup))
    else:
        samples = run_async(aionet_client(args.transport, args.url, args.n, args.warmup, args.stamps))
    print(json.dumps({"samples": samples}), flush=True)


def session(args: argparse.Namespace, n: int, strace_out: str | None, stamps_dir: str | None) -> list[int]:
    """One server and one client process (each under ``strace -f -c`` writing
    ``<strace_out>.<role>`` when given); the client's samples."""

    def prefix(role: str) -> list[str]:
        if strace_out and args.callbacks:
            return ["env", f"RTT_CALLBACKS_OUT={strace_out}.{role}"]
        return ["strace", "-f", "-c", "-o", f"{strace_out}.{role}"] if strace_out else []

    base = [sys.executable, __file__, "--impl", args.impl, "--transport", args.transport]
    srv_stamps = os.path.join(stamps_dir, "srv.json") if stamps_dir else None
    cli_stamps = os.path.join(stamps_dir, "cli.json") if stamps_dir else None
    extra = ["--stamps", srv_stamps] if srv_stamps else []
    srv = subprocess.Popen(
        [*prefix("server"), *base, "--role", "server", *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert srv.stdout is not None
        info = json.loads(srv.stdout.readline())
        extra = ["--stamps", cli_stamps] if cli_stamps else []
        cmd = [*prefix("client"), *base, "--role", "client", "--url", info["url"], "-n", str(n)]
        cmd += ["--warmup", str(args.warmup)]
        out = subprocess.run([*cmd, *extra], stdout=subprocess.PIPE, text=True, timeout=300, check=True).stdout
        samples = json.loads(out.strip().splitlines()[-1])["samples"]
    finally:
        end_children([srv], timeout=20)
    return samples


def report(samples: list[int]) -> str:
    s = sorted(samples)
    return f"p50 {s[len(s) // 2] / 1000:.1f} us  p90 {s[len(s) * 9 // 10] / 1000:.1f} us  ({len(s)} round trips)"


STRACE_LINE = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")


def read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def strace_counts(path: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in Path(path).read_text().splitlines():
        m = STRACE_LINE.match(line)
        if m and m.group(2) != "total":
            counts[m.group(2)] = int(m.group(1))
    return counts


def count_mode(args: argparse.Namespace) -> None:
    if not args.callbacks and not shutil.which("strace"):
        raise SystemExit("--count needs strace (apt-get install strace)")
    runs: list[dict[str, dict[str, int]]] = []
    with tempfile.TemporaryDirectory() as d:
        for k, n in enumerate((args.n, 2 * args.n)):
            out = os.path.join(d, f"strace{k}")
            session(args, n, out, None)
            load = read_json if args.callbacks else strace_counts
            runs.append({role: load(f"{out}.{role}") for role in ("client", "server")})
    what = "loop callbacks scheduled" if args.callbacks else "syscalls, all threads,"
    print(f"{what} per round trip ({args.impl} {args.transport}):")
    print(f"  {'':<40} {'client':>7} {'server':>7}")
    per = {
        role: {k: (runs[1][role].get(k, 0) - runs[0][role].get(k, 0)) / args.n for k in runs[1][role]}
        for role in ("client", "server")
    }
    names = sorted(set(per["client"]) | set(per["server"]), key=lambda k: -per["client"].get(k, 0))
    for name in names:
        c, s = per["client"].get(name, 0.0), per["server"].get(name, 0.0)
        if c >= 0.05 or s >= 0.05:
            print(f"  {name:<40} {c:7.2f} {s:7.2f}")
    print(f"  {'total':<40} {sum(per['client'].values()):7.2f} {sum(per['server'].values()):7.2f}")


def stamps_mode(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as d:
        samples = session(args, args.n, None, d)
        srv = read_json(os.path.join(d, "srv.json"))
        cli = read_json(os.path.join(d, "cli.json"))
    print(report(samples))
    # Merge both processes' stamps on the shared monotonic clock, then walk each round trip
    # from "request" to "resumed", naming each event by process.
    ev = sorted([(t, "cli." + lab) for lab, t in cli] + [(t, "srv." + lab) for lab, t in srv])
    hops: dict[str, list[int]] = {}
    trip: list[tuple[int, str]] = []
    for t, lab in ev:
        if lab == "cli.request":
            trip = [(t, lab)]
        elif trip:
            trip.append((t, lab))
            if lab == "cli.resumed":
                for (t0, a), (t1, b) in itertools.pairwise(trip):
                    hops.setdefault(f"{a} -> {b}", []).append(t1 - t0)
                trip = []
    print("median per hop (us) and how many round trips had it:")
    for name, vals in sorted(hops.items(), key=lambda kv: -len(kv[1])):
        print(f"  {name:<36} {statistics.median(vals) / 1000:8.1f}  x{len(vals)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", choices=["aionet", "pyzmq", "zmqloop"], default="aionet")
    ap.add_argument("--transport", default="zmq+tcp", help="aionet transport scheme (zmq+tcp, tcp)")
    ap.add_argument("-n", type=int, default=3000, help="round trips measured")
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--count", action="store_true", help="syscalls per round trip (strace -f -c)")
    ap.add_argument("--callbacks", action="store_true", help="with --count: loop callbacks instead of syscalls")
    ap.add_argument("--stamps", nargs="?", const="", default=None, help="per-hop medians (aionet, zmq)")
    ap.add_argument("--inflight", type=int, default=0, help="plain mode: this many concurrent callers (req/s)")
    ap.add_argument("--repeat", type=int, default=1, help="sessions (fresh process pairs) for the plain mode")
    ap.add_argument("--role", choices=["server", "client"], help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        child(args)
    elif args.count:
        count_mode(args)
    elif args.stamps is not None:
        stamps_mode(args)
    elif args.inflight:
        os.environ["RTT_INFLIGHT"] = str(args.inflight)
        for _ in range(args.repeat):
            per = session(args, args.n, None, None)[0]
            rate = f"{1e9 / per / 1000:.1f}k req/s with {args.inflight} in flight"
            print(f"{args.impl} {args.transport}: {rate}", flush=True)
    else:
        for _ in range(args.repeat):
            print(f"{args.impl} {args.transport}: {report(session(args, args.n, None, None))}", flush=True)


if __name__ == "__main__":
    main()
