#!/usr/bin/env python
"""What metrics and an open dashboard cost, in instructions (valgrind callgrind): a measure the
shared machine's load does not move, for a bar (2 %) far below its wall-clock noise.

    python benchmarks/observe_instructions.py --tasks 1000 --messages 10000 --repeat 4 \
        --updates 5 --task-rate 7000 --msg-rate 130000 [--json PATH]      # ~7-16 min

One process under callgrind holds two nodes over tcp:// (a client that submits no-op tasks,
sync ``tasks:noop`` on the worker's threads and async ``tasks:anoop`` on its loop, and sends
64 B messages, and a worker that runs and drains them) plus a dashboard page (a plain
HTTP client in a child process, which callgrind does not trace) reading the worker's live
stream. Within that one run, metrics go off and on ``--repeat`` times each (order off-on,
on-off, ...); "on" = both nodes serve ``[http]`` (registry, hook instrument, summary service)
and the page is connected.

Only the measured loops are counted: each runs inside ``functools.reduce(...)`` and callgrind
runs with ``--collect-atstart=no --toggle-collect=functools_reduce --dump-after=functools_reduce``,
so each loop gets a dump of its own (start-up, imports, switching modes and warm-ups are not
counted). Callgrind counts per thread, and only the event-loop thread enters the toggle: the
task threads' instructions (running the no-op, identical in both modes; metrics add no task
hook) are excluded, which makes the per-task denominator smaller and every share larger
(conservative).

Under callgrind a run lasts ~50x longer, so periodic timers would fire ~50x more often per
operation, by a different amount each run (this made the previous form of this benchmark vary
4 % between runs of the same mode). So every periodic timer is stretched to an hour, in both
modes alike: heartbeats, load samples, the scheduler's steal/load tick, the dashboard's own
refresh timer (config), the peer-table prune, cache sweep and tcp buffer trim (module
constants) and the membership lag watch (its 50 ms tick has no setting: parked); and the
owner's dispatch window is held at its cap (``queue_time``, as a no-op's 20 us puts it natively),
since under callgrind it would follow the stretched task durations. Timers that belong to the
data path (the link's 5 ms delayed ack, the owner's dispatch retry) stay: a loop run while the
machine is very busy can still come out a few % dearer (one in 18 did, by 5.5 %), which is why
there are several loops per mode and the change comes with a confidence interval.

The dashboard's and Prometheus' periodic work is counted apart, in the same run: dashboard
updates (``Observer.update()``, the refresher's own code: gather every member's summary, encode,
publish, the page's write) and scrapes (``/metrics`` exposition), each per call. Their share at
the real cadence is (instructions per update / refresh interval) over the instructions per
second of work at the measured wall-clock rate (``--task-rate``, ``--msg-rate``, e.g. from
benchmarks/observe_overhead.py on the same machine): overhead = loop change + that share.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
BENCH = Path(__file__).resolve().parent
HOUR = 3600.0
SCRAPE_INTERVAL = 15.0  # Prometheus' default scrape interval, s
TASK_BATCH = 500  # tasks in flight (and, in "busy" loops, tasks per dashboard update)
MSG_CHUNK = 2000  # in "busy" loops: messages per dashboard update
ASYNC_NOOP = "tasks:anoop"  # runs on the worker's loop: no thread hand-off, whose batching follows timing


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _stretch_timers() -> None:
    """The periodic work that has no config key, stretched to an hour (both modes alike)."""
    import aionet.cache.service as cache_service
    import aionet.core.peers as peers
    import aionet.transports.tcp_connection as tcp_connection
    from aionet.membership.service import Membership

    peers.PRUNE_EVERY = HOUR
    cache_service._SWEEP_INTERVAL = HOUR
    tcp_connection.TRIM_AFTER = HOUR

    async def parked(self: Any) -> None:  # the lag watch ticks every 50 ms whatever the config
        await asyncio.get_running_loop().create_future()

    Membership._watch_loop = parked  # type: ignore[method-assign]


class Session:
    """The measured process: two nodes, a page reader, phases each inside functools.reduce."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tasks: int, messages: int) -> None:
        self.loop, self.n_tasks, self.n_messages = loop, tasks, messages
        self.ports = (_free_port(), _free_port())
        self.labels: list[str] = []  # one per functools.reduce call = one callgrind dump, in order
        self.received = 0
        self.arrived = asyncio.Event()

    def cfg(self, extra: dict[str, Any]) -> Any:
        from aionet.config import Config

        stretched = {
            "heartbeat": {"interval": HOUR, "load_interval": HOUR, "liveness_responder": False},
            "http": {"interval": HOUR},
            "log": {"level": "warning"},
        }
        # queue_time: the owner keeps (queue_time / task duration) tasks per slot on a worker, up
        # to max_queued_per_slot. Natively a no-op's 20 us puts that at the cap; under callgrind
        # the measured durations are ~50x longer and move with the machine's load, which would
        # change the dispatch batches (and the count) from loop to loop: an hour keeps the cap.
        sched = {"steal_interval": HOUR, "queue_time": HOUR, **extra}
        return Config.from_dict({**stretched, "scheduler": sched})

    async def start(self) -> None:
        import aionet

        self.worker = aionet.Node(name="w0", listen=f"tcp://{HOST}:0", config=self.cfg({"allow_modules": ["tasks"]}))
        await self.worker.start()
        self.client = aionet.Node(
            name="client", listen=f"tcp://{HOST}:0", join=[self.worker.address], config=self.cfg({"run_local": False})
        )
        await self.client.start()
        while "w0" not in self.client.scheduler.owner.views:
            await asyncio.sleep(0.02)
        self.drain = asyncio.get_running_loop().create_task(self._drain())
        env = {**os.environ, "PYTHONPATH": str(BENCH)}
        url = f"http://{HOST}:{self.ports[1]}"
        self.reader = subprocess.Popen(
            [sys.executable, str(BENCH / "_observe_app.py"), "read", url], env=env, stdout=subprocess.DEVNULL
        )

    async def _drain(self) -> None:
        while True:
            self.received += len(await self.worker.recv_batch("sink"))
            self.arrived.set()

    async def stop(self) -> None:
        self.reader.kill()
        self.reader.wait()
        self.drain.cancel()
        await self.set_mode(False)
        await self.client.stop()
        await self.worker.stop()

    async def set_mode(self, on: bool) -> None:
        from aionet.observe import attach

        for node, port in ((self.client, self.ports[0]), (self.worker, self.ports[1])):
            if on and node.observer is None:
                node.config.http.port = port
                node.observer = await attach(node)
            elif not on and node.observer is not None:
                await node.observer.close()
                node.observer = None
        if on:  # the page reconnects (it retries each second) and gets its first update
            obs = self.worker.observer
            while not obs._subscribers or obs.updates < 1:
                await asyncio.sleep(0.05)

    async def tasks(self, n: int, dash: bool = False, fn: str = "tasks:noop") -> None:
        """``n`` no-op tasks; ``dash``: a dashboard update starts with each batch and runs while
        the batch is in flight (the update's cost on a busy node: TASK_BATCH tasks per update)."""
        c = self.client
        updates = []
        for start in range(0, n, TASK_BATCH):  # batches: a bounded number in flight
            refs = [c.submit(fn) for _ in range(min(TASK_BATCH, n - start))]
            if dash:
                updates.append(asyncio.ensure_future(self.worker.observer.update()))
            await c.gather(refs)
        await asyncio.gather(*updates)

    async def messages(self, n: int, dash: bool = False) -> None:
        """``n`` 64 B messages; ``dash``: a dashboard update starts every MSG_CHUNK messages."""
        target = self.received + n
        payload = b"x" * 64
        updates = []
        for i in range(n):
            if dash and i % MSG_CHUNK == 0:
                updates.append(asyncio.ensure_future(self.worker.observer.update()))
            await self.client.send("w0", "sink", payload)
        while self.received < target:
            self.arrived.clear()
            await self.arrived.wait()
        await asyncio.gather(*updates)

    async def updates(self, n: int) -> None:
        obs = self.worker.observer
        for _ in range(n):
            await obs.update()
            while any(q.qsize() for q in obs._subscribers):  # the page's stream wrote it
                await asyncio.sleep(0)

    async def scrapes(self, n: int) -> None:
        m = self.worker.observer.metrics
        for _ in range(n):
            m.exposition()
        await asyncio.sleep(0)

    def measure(self, label: str, coro: Any) -> None:
        """Run ``coro`` inside functools.reduce: callgrind counts it, and dumps at its end."""
        self.labels.append(label)
        functools.reduce(lambda acc, _: self.loop.run_until_complete(coro), [0], None)

    def warm(self, coro: Any) -> None:
        self.loop.run_until_complete(coro)


def session(tasks: int, messages: int, repeat: int, updates: int, out: str) -> None:
    import gc

    from aionet.runner import loop_factory

    _stretch_timers()
    loop = loop_factory()()
    s = Session(loop, tasks, messages)
    s.warm(s.start())
    try:
        for r in range(repeat):
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                s.warm(s.set_mode(mode == "on"))
                s.warm(s.tasks(tasks // 5))
                s.warm(s.messages(messages // 5))
                gc.collect()
                s.measure(f"tasks {mode}", s.tasks(tasks))
                gc.collect()
                s.measure(f"messages {mode}", s.messages(messages))
                s.warm(s.tasks(tasks // 5, fn=ASYNC_NOOP))
                gc.collect()
                s.measure(f"atasks {mode}", s.tasks(tasks, fn=ASYNC_NOOP))
                if mode == "on":  # the same with dashboard updates running among the work
                    gc.collect()
                    s.measure("atasks busy", s.tasks(tasks, dash=True, fn=ASYNC_NOOP))
                    gc.collect()
                    s.measure("tasks busy", s.tasks(tasks, dash=True))
                    gc.collect()
                    s.measure("messages busy", s.messages(messages, dash=True))
        s.warm(s.set_mode(True))
        s.warm(s.updates(3))
        for _ in range(repeat):
            gc.collect()
            s.measure("update on", s.updates(updates))
            gc.collect()
            s.measure("scrape on", s.scrapes(updates))
    finally:
        s.warm(s.stop())
        loop.close()
    Path(out).write_text(json.dumps(s.labels))


def run_callgrind(args: argparse.Namespace) -> list[tuple[str, int]]:
    """(label, instructions) of every measured loop, in the order they ran."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), str(BENCH.parent)]), "PYTHONHASHSEED": "0"}
    with tempfile.TemporaryDirectory(prefix="observe-cg-") as tmp:
        labels = Path(tmp) / "labels.json"
        cmd = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.%p", "--collect-atstart=no",
            "--toggle-collect=functools_reduce", "--dump-after=functools_reduce",
            sys.executable, __file__, "--_session", str(labels),
            "--tasks", str(args.tasks), "--messages", str(args.messages), "--repeat", str(args.repeat),
            "--updates", str(args.updates),
        ]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=7200)
        if out.returncode != 0 or not labels.exists():
            raise SystemExit(f"callgrind run failed ({out.returncode})\n{out.stderr[-3000:]}")
        names = json.loads(labels.read_text())
        dumps = sorted(Path(tmp).glob("cg.*.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))
        counts = []
        for p in dumps:
            m = re.search(r"^totals:\s*(\d+)", p.read_text(errors="replace"), re.M)
            counts.append(int(m.group(1)) if m else 0)
    if len(counts) != len(names):
        raise SystemExit(f"{len(counts)} callgrind dumps for {len(names)} measured loops: something else called reduce")
    return list(zip(names, counts, strict=True))


# two-sided 95 % quantiles of Student's t, by degrees of freedom
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}


def change_ci_pct(on: list[float], off: list[float]) -> tuple[float, float]:
    """95 % confidence interval of the mean change on/off - 1, in % (Welch's t, the loops of
    each mode as the samples; the same-mode spread is the noise it accounts for)."""
    m_on, m_off = statistics.fmean(on), statistics.fmean(off)
    v_on, v_off = statistics.variance(on) / len(on), statistics.variance(off) / len(off)
    se = math.sqrt(v_on + v_off)
    df = (v_on + v_off) ** 2 / ((v_on**2 / (len(on) - 1)) + (v_off**2 / (len(off) - 1))) if se > 0 else 10
    half = _T95[min(max(int(df), 1), 10)] * se
    return 100.0 * ((m_on - half) / m_off - 1.0), 100.0 * ((m_on + half) / m_off - 1.0)


def spread_pct(xs: list[float]) -> float:
    """(max - min) / mean: how far apart repeats of the same mode are."""
    return 100.0 * (max(xs) - min(xs)) / statistics.fmean(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--messages", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=4, help="measured loops per mode (alternating)")
    ap.add_argument("--updates", type=int, default=5, help="dashboard updates (and scrapes) per measured loop")
    ap.add_argument(
        "--task-rate", type=float, default=7000, help="no-op tasks/s of work (observe_overhead.py; lower: larger share)"
    )
    ap.add_argument(
        "--msg-rate", type=float, default=130000, help="64 B msg/s of work (observe_overhead.py; lower: larger share)"
    )
    ap.add_argument("--interval", type=float, default=1.0, help="the dashboard's refresh interval, s")
    ap.add_argument("--json")
    ap.add_argument("--_session", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._session:
        session(args.tasks, args.messages, args.repeat, args.updates, args._session)
        return
    t0 = time.time()
    load0 = os.getloadavg()[0]
    got = run_callgrind(args)
    per: dict[str, list[float]] = {}
    ops = {"tasks": args.tasks, "atasks": args.tasks, "messages": args.messages, "update": args.updates,
           "scrape": args.updates}  # fmt: skip
    n_updates = {"tasks": -(-args.tasks // TASK_BATCH), "atasks": -(-args.tasks // TASK_BATCH),
                 "messages": -(-args.messages // MSG_CHUNK)}  # fmt: skip
    for label, n in got:
        per.setdefault(label, []).append(n / ops[label.split()[0]])
    res: dict[str, Any] = {"per_op": per, "load": [load0, os.getloadavg()[0]]}
    upd, scrape = statistics.fmean(per["update on"]), statistics.fmean(per["scrape on"])
    print(f"callgrind, {args.repeat} alternating loops per mode in one run "
          f"({time.time() - t0:.0f} s, load average {load0:.1f} -> {os.getloadavg()[0]:.1f}):")  # fmt: skip
    print(f"  dashboard update: {upd:,.0f} instructions (loops {', '.join(f'{x:,.0f}' for x in per['update on'])}, "
          f"spread {spread_pct(per['update on']):.2f} %)")  # fmt: skip
    print(f"  /metrics scrape:  {scrape:,.0f} instructions (spread {spread_pct(per['scrape on']):.2f} %)")
    for kind, rate in (("tasks", args.task_rate), ("atasks", args.task_rate), ("messages", args.msg_rate)):
        off, on = per[f"{kind} off"], per[f"{kind} on"]
        m_off, m_on = statistics.fmean(off), statistics.fmean(on)
        loop_pct = 100.0 * (m_on / m_off - 1.0)
        busy = statistics.fmean(per[f"{kind} busy"])  # "on" plus n_updates[kind] updates per loop
        upd_busy = (busy - m_on) * ops[kind] / n_updates[kind]
        work_per_s = rate * m_off  # instructions per second of work at the given rate
        dash_pct = 100.0 * (max(upd, upd_busy) / args.interval) / work_per_s  # the dearer of idle and busy
        scrape_pct = 100.0 * (scrape / SCRAPE_INTERVAL) / work_per_s
        total = loop_pct + dash_pct + scrape_pct
        lo, hi = change_ci_pct(on, off)
        res[kind] = {
            "update_busy": upd_busy,
            "loop_change_ci95_pct": [lo, hi],
            "off": off, "on": on, "spread_off_pct": spread_pct(off), "spread_on_pct": spread_pct(on),
            "loop_change_pct": loop_pct, "dashboard_pct": dash_pct, "scrape_pct": scrape_pct,
            "total_pct": total, "rate": rate,
        }  # fmt: skip
        print(f"  {kind}: one dashboard update among the work: {upd_busy:,.0f} instructions "
              f"({n_updates[kind]} per loop; idle: {upd:,.0f})")  # fmt: skip
        print(f"  {kind}: off {', '.join(f'{x:,.0f}' for x in off)} per op (spread {spread_pct(off):.2f} %); "
              f"on {', '.join(f'{x:,.0f}' for x in on)} (spread {spread_pct(on):.2f} %)")  # fmt: skip
        print(f"  {kind}: loop {loop_pct:+.2f} % [95 % CI {lo:+.2f}, {hi:+.2f}], "
              f"dashboard at {args.interval:g} s refresh {dash_pct:+.2f} %, "
              f"scrape every {SCRAPE_INTERVAL:g} s {scrape_pct:+.3f} % (at {rate:,.0f}/s of work): "
              f"total {total:+.2f} % (upper bound {hi + dash_pct + scrape_pct:+.2f} %; bar: <= 2 %)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
