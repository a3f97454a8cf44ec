"""Failure detection: how fast a dead or hung node is seen dead by everyone, whether busy nodes
are ever falsely declared dead, and what heartbeats cost per node as the cluster grows.

Sections (all at default heartbeat settings unless --interval is given):

* ``kill``    SIGKILL one of N node processes; latency until *every* other node has reported it
              dead (``--trials`` trials, the victim restarted with the same name in between:
              that also measures rejoin as a new incarnation).
* ``stop``    SIGSTOP one node; latency until every other node reports it dead; then SIGCONT and
              the time until every other node reports it alive again.
* ``soak``    N nodes exchange 1 MiB messages continuously (each to its ring successor) while two
              busy-loop processes saturate the CPUs, for ``--soak-seconds``; counts dead and
              suspect reports (every one of them is false: nothing died).
* ``traffic`` membership bytes/s sent per node for 3, 10 and 30 in-process nodes (inproc://).

Node processes run this same file with ``--child``; they print ``READY`` and one ``EVENT`` line
per membership change, timestamped with CLOCK_MONOTONIC (shared by all processes of the host),
so latencies are measured from the parent's kill() to the observers' own detection time.
The parent only ever signals the PIDs it started.

    python benchmarks/failure_detection.py                    # everything (~4 minutes)
    python benchmarks/failure_detection.py --only kill,stop --trials 5
    python benchmarks/failure_detection.py --only traffic --sizes 3,10,30,60
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common

MiB = 1 << 20


# ============================================================================ child process
def child_main(args: argparse.Namespace) -> None:
    import aionet
    from aionet.config import Config
    from aionet.log import configure

    configure(args.log_level, stream=sys.stderr)  # stdout carries the READY/EVENT/RESULT protocol

    cfg = Config.from_dict({"heartbeat": {"interval": args.interval}} if args.interval else {})
    _common.parent_watchdog(os.getppid())

    def emit(kind: str, payload: dict[str, Any]) -> None:
        sys.stdout.write(f"{kind} {json.dumps(payload)}\n")
        sys.stdout.flush()

    async def run() -> None:
        node = aionet.Node(name=args.name, listen="tcp://127.0.0.1:0", join=args.join or None, config=cfg)
        node.on_member_change(
            lambda ev: emit(
                "EVENT",
                {
                    "t": time.monotonic(),
                    "name": ev.name,
                    "kind": ev.kind,
                    "state": ev.state,
                    "inc": ev.incarnation,
                    "reason": ev.reason,
                },
            )
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        sent = received = 0
        async with node:
            emit(
                "READY",
                {
                    "name": node.name,
                    "address": node.address,
                    "pid": os.getpid(),
                    "members": {k: v["state"] for k, v in node.members().items()},
                },
            )
            tasks = []
            if args.traffic:
                import numpy as np

                payload = np.random.default_rng(os.getpid()).integers(0, 255, MiB, dtype=np.uint8)

                async def produce() -> None:
                    nonlocal sent
                    while True:
                        live = sorted(n for n, m in node.members().items() if m["state"] == "alive")
                        if len(live) < 2:
                            await asyncio.sleep(0.1)
                            continue
                        target = live[(live.index(node.name) + 1) % len(live)]
                        try:
                            await node.send(target, "soak", payload)
                            sent += 1
                        except aionet.AionetError:
                            await asyncio.sleep(0.1)

                async def consume() -> None:
                    nonlocal received
                    while True:
                        received += len(await node.recv_batch("soak"))

                tasks = [asyncio.ensure_future(produce()), asyncio.ensure_future(consume())]
            await stop.wait()
            for t in tasks:
                t.cancel()
            emit("RESULT", {"sent_mib": sent, "received_mib": received, "stats": node.membership.stats().as_dict()})

    from aionet.runner import run as run_loop

    run_loop(run())


# ============================================================================ parent side
class NodeProc:
    """One child node process; a thread collects its EVENT lines."""

    def __init__(self, bench: Bench, name: str, join: str | None, traffic: bool = False):
        self.bench = bench
        self.name = name
        argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--name", name]
        if join:
            argv += ["--join", join]
        if traffic:
            argv.append("--traffic")
        if bench.args.interval:
            argv += ["--interval", str(bench.args.interval)]
        argv += ["--log-level", bench.args.log_level]
        logdir = Path(bench.args.logs) if bench.args.logs else None
        if logdir is not None:
            logdir.mkdir(parents=True, exist_ok=True)
        target = logdir / f"{name}-{len(bench.procs)}.log" if logdir is not None else os.devnull
        self.log = open(target, "w")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=self.log,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            # import aionet from this checkout, whatever the installed copy points at
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": _pythonpath()},
        )
        bench.procs.append(self)
        self.ready: dict[str, Any] | None = None
        self.result: dict[str, Any] | None = None
        self._ready = threading.Event()
        self._done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, _, rest = line.strip().partition(" ")
            if kind == "READY":
                self.ready = json.loads(rest)
                self._ready.set()
            elif kind == "EVENT":
                self.bench.on_event(self.name, json.loads(rest))
            elif kind == "RESULT":
                self.result = json.loads(rest)
        self._done.set()
        self._ready.set()

    def wait_ready(self, timeout: float = 60.0) -> dict[str, Any]:
        if not self._ready.wait(timeout) or self.ready is None:
            raise RuntimeError(f"node {self.name} did not start (exit code {self.proc.poll()})")
        return self.ready

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def finish(self, timeout: float = 15.0) -> dict[str, Any] | None:
        """SIGTERM, collect the RESULT line, make sure the process is gone."""
        with contextlib.suppress(ProcessLookupError):
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
        self._done.wait(timeout)
        self.kill()
        return self.result

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        with contextlib.suppress(OSError):
            self.log.close()


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.procs: list[NodeProc] = []
        self.burners: list[subprocess.Popen[bytes]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.view: dict[str, dict[str, str]] = {}  # observer -> member -> state
        self.cond = threading.Condition()
        atexit.register(self.cleanup)

    def on_event(self, observer: str, ev: dict[str, Any]) -> None:
        with self.cond:
            self.events.append((observer, ev))
            self.view.setdefault(observer, {})[ev["name"]] = ev["state"]
            self.cond.notify_all()

    def wait(self, pred: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.2))
        return True

    def cleanup(self) -> None:
        for p in self.procs:
            p.kill()
        for b in self.burners:
            if b.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(b.pid, signal.SIGKILL)
                b.wait(timeout=10)

    # ------------------------------------------------------------------ cluster helpers
    def start_cluster(self, n: int, traffic: bool = False) -> dict[str, NodeProc]:
        nodes: dict[str, NodeProc] = {}
        first = NodeProc(self, "n1", None, traffic)
        seed = first.wait_ready()["address"]
        nodes["n1"] = first
        for i in range(2, n + 1):
            nodes[f"n{i}"] = NodeProc(self, f"n{i}", seed, traffic)
        for p in nodes.values():
            p.wait_ready()
        if not self.wait(lambda: self.converged(nodes), 60):
            raise RuntimeError(f"cluster did not converge: {self.view}")
        return nodes

    def converged(self, nodes: dict[str, NodeProc]) -> bool:
        for obs in nodes:
            v = self.view.get(obs, {})
            if any(v.get(m) != "alive" for m in nodes if m != obs):
                return False
        return True

    def seen_by_all(
        self, observers: list[str], name: str, since: float, kinds: set[str], state: str
    ) -> dict[str, float]:
        """observer -> first time (monotonic) it reported ``name`` with a kind in ``kinds`` in
        ``state`` after ``since``; only observers that did."""
        out: dict[str, float] = {}
        for obs, ev in self.events:
            if (
                obs in observers
                and obs not in out
                and ev["name"] == name
                and ev["t"] >= since
                and ev["kind"] in kinds
                and ev["state"] == state
            ):
                out[obs] = ev["t"]
        return out

    def reset_events(self) -> None:
        with self.cond:
            self.events.clear()

    # ------------------------------------------------------------------ sections
    def failure_trials(self, sig: int) -> dict[str, Any]:
        label = "SIGKILL" if sig == signal.SIGKILL else "SIGSTOP"
        nodes = self.start_cluster(self.args.nodes)
        seed = nodes["n1"].ready["address"]  # type: ignore[index]
        trials = []
        names = [n for n in nodes if n != "n1"]  # the seed stays up so victims can rejoin through it
        try:
            for i in range(self.args.trials):
                victim = names[i % len(names)]
                observers = [n for n in nodes if n != victim]
                if not self.wait(lambda: self.converged(nodes), 30):
                    trials.append({"victim": victim, "error": "cluster not converged before the trial"})
                    continue
                time.sleep(0.5 + 0.2 * (i % 3))  # land the failure at different heartbeat phases
                self.reset_events()
                t0 = time.monotonic()
                nodes[victim].signal(sig)

                def all_dead(obs: list[str] = observers, v: str = victim, t: float = t0) -> bool:
                    return len(self.seen_by_all(obs, v, t, {"dead"}, "dead")) == len(obs)

                ok = self.wait(all_dead, self.args.trial_timeout)
                seen = self.seen_by_all(observers, victim, t0, {"dead"}, "dead")
                trial: dict[str, Any] = {
                    "victim": victim,
                    "detected_by_all_s": (max(seen.values()) - t0) if ok else None,
                    "first_detection_s": (min(seen.values()) - t0) if seen else None,
                    "per_observer_s": {k: v - t0 for k, v in seen.items()},
                    "suspect_first_s": min(
                        (
                            e["t"] - t0
                            for o, e in self.events
                            if e["name"] == victim and e["kind"] == "suspect" and e["t"] >= t0
                        ),
                        default=None,
                    ),
                }
                if not ok:
                    trial["error"] = f"not seen dead by all within {self.args.trial_timeout} s"
                # bring it back
                t1 = time.monotonic()
                if sig == signal.SIGKILL:
                    nodes[victim].kill()
                    nodes[victim] = NodeProc(self, victim, seed)
                    nodes[victim].wait_ready()
                else:
                    nodes[victim].signal(signal.SIGCONT)

                def all_back(obs: list[str] = observers, v: str = victim, t: float = t1) -> bool:
                    return len(self.seen_by_all(obs, v, t, {"alive", "joined", "restarted"}, "alive")) == len(obs)

                back = self.wait(all_back, 30)
                seen_back = self.seen_by_all(observers, victim, t1, {"alive", "joined", "restarted"}, "alive")
                trial["rejoined_all_s"] = (max(seen_back.values()) - t1) if back else None
                trials.append(trial)
                _common.log(
                    f"{label} trial {i + 1}: dead seen by all in "
                    f"{_fmt(trial['detected_by_all_s'])}, back alive in {_fmt(trial['rejoined_all_s'])}"
                )
        finally:
            for p in nodes.values():
                p.finish()
        good = [t["detected_by_all_s"] for t in trials if t.get("detected_by_all_s") is not None]
        back = [t["rejoined_all_s"] for t in trials if t.get("rejoined_all_s") is not None]
        return {
            "signal": label,
            "nodes": self.args.nodes,
            "trials": trials,
            "median_s": statistics.median(good) if good else None,
            "min_s": min(good) if good else None,
            "max_s": max(good) if good else None,
            "failed_trials": len(trials) - len(good),
            "rejoin_median_s": statistics.median(back) if back else None,
            "rejoin_failed": len(trials) - len(back),
        }

    def soak(self) -> dict[str, Any]:
        import psutil

        nodes = self.start_cluster(self.args.nodes, traffic=True)
        ncpu = os.cpu_count() or 2
        for _ in range(ncpu):
            self.burners.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        self.reset_events()
        t0 = time.monotonic()
        psutil.cpu_percent(interval=None)
        cpu = []
        while time.monotonic() - t0 < self.args.soak_seconds:
            cpu.append(psutil.cpu_percent(interval=1.0))
        for b in self.burners:
            os.kill(b.pid, signal.SIGKILL)
            b.wait(timeout=10)
        self.burners.clear()
        results = {n: p.finish() for n, p in nodes.items()}
        with self.cond:
            events = [(o, e) for o, e in self.events if e["t"] >= t0]
        dead = [(o, e) for o, e in events if e["kind"] == "dead"]
        suspect = [(o, e) for o, e in events if e["kind"] == "suspect"]
        moved = sum((r or {}).get("received_mib", 0) for r in results.values())
        return {
            "nodes": self.args.nodes,
            "seconds": self.args.soak_seconds,
            "cpu_burners": ncpu,
            "machine_cpu_percent_median": statistics.median(cpu) if cpu else None,
            "false_deaths": len(dead),
            "suspect_reports": len(suspect),
            "dead_events": [{"observer": o, **e} for o, e in dead],
            "suspect_events": [{"observer": o, **e} for o, e in suspect][:50],
            "mib_delivered": moved,
            "mib_per_s": moved / self.args.soak_seconds,
            "max_phi": max(((r or {}).get("stats", {}).get("max_phi", 0.0) for r in results.values()), default=0.0),
            "max_loop_stall_s": max(
                ((r or {}).get("stats", {}).get("stalled_s", 0.0) for r in results.values()), default=0.0
            ),
        }

    def traffic(self) -> list[dict[str, Any]]:
        return _common.run_async(_traffic(self.args))


async def _traffic(args: argparse.Namespace) -> list[dict[str, Any]]:
    from aionet import Node
    from aionet.config import Config

    out = []
    for n in args.sizes:
        cfg = {"heartbeat": {"interval": args.interval}} if args.interval else {}
        nodes = [Node(name=f"m{0:03d}", listen="inproc://", config=Config.from_dict(cfg, env={}))]
        await nodes[0].start()
        for i in range(1, n):
            node = Node(
                name=f"m{i:03d}", listen="inproc://", join=[nodes[0].address], config=Config.from_dict(cfg, env={})
            )
            await node.start()
            nodes.append(node)
        try:
            deadline = time.monotonic() + 60
            while not all(
                len(x.members()) == n and all(m["state"] == "alive" for m in x.members().values()) for x in nodes
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{n} in-process nodes did not converge")
                await asyncio.sleep(0.05)
            await asyncio.sleep(args.warmup)
            for x in nodes:
                x.membership.count_bytes = True
            b0 = [(x.membership.stats().sent_bytes, x.membership.stats().sent_msgs) for x in nodes]
            t0 = time.monotonic()
            await asyncio.sleep(args.traffic_seconds)
            dt = time.monotonic() - t0
            bps = [(x.membership.stats().sent_bytes - b[0]) / dt for x, b in zip(nodes, b0, strict=True)]
            mps = [(x.membership.stats().sent_msgs - b[1]) / dt for x, b in zip(nodes, b0, strict=True)]
            interval = nodes[0].config.heartbeat.interval
            per_msg = sum(bps) / max(sum(mps), 1e-9)
            out.append(
                {
                    "nodes": n,
                    "bytes_per_s_per_node_mean": statistics.mean(bps),
                    "bytes_per_s_per_node_max": max(bps),
                    "msgs_per_s_per_node_mean": statistics.mean(mps),
                    "bytes_per_msg": per_msg,
                    "all_to_all_bytes_per_s_per_node": 2 * (n - 1) / interval * per_msg,
                    "dead_or_suspect": sum(1 for x in nodes for m in x.members().values() if m["state"] != "alive"),
                }
            )
            _common.log(f"traffic with {n} nodes: {statistics.mean(bps):.0f} B/s per node")
        finally:
            for x in reversed(nodes):
                await x.stop()
    return out


def _pythonpath() -> str:
    rest = os.environ.get("PYTHONPATH")
    return str(_common.REPO_DIR) + (os.pathsep + rest if rest else "")


def _fmt(v: float | None) -> str:
    return "timeout" if v is None else f"{v * 1000:.0f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--name", help=argparse.SUPPRESS)
    ap.add_argument("--join", action="append", help=argparse.SUPPRESS)
    ap.add_argument("--traffic", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--only", default="kill,stop,soak,traffic", help="sections to run (comma-separated)")
    ap.add_argument("--nodes", type=int, default=5, help="node processes for kill/stop/soak")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--trial-timeout", type=float, default=15.0)
    ap.add_argument("--soak-seconds", type=float, default=60.0)
    ap.add_argument("--sizes", default="3,10,30", help="cluster sizes for the traffic section")
    ap.add_argument("--traffic-seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--interval", type=float, default=0.0, help="heartbeat.interval (default: the config default)")
    ap.add_argument("--log-level", default="warning", help="node processes' log level (with --logs)")
    ap.add_argument("--logs", default="", help="directory for the node processes' logs (default: discarded)")
    ap.add_argument("--json", default=str(_common.RESULTS_DIR / "failure_detection.json"))
    args = ap.parse_args()
    if args.child:
        child_main(args)
        return
    from aionet.log import configure

    configure("warning", stream=sys.stderr)  # in-process nodes of the traffic section
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    only = set(args.only.split(","))
    bench = Bench(args)
    signal.signal(signal.SIGTERM, lambda *_: (bench.cleanup(), sys.exit(143)))
    from aionet.config import HeartbeatSection

    defaults = HeartbeatSection()
    report: dict[str, Any] = {
        "environment": _common.environment(),
        "config": {k: v for k, v in vars(args).items() if k not in ("child", "name", "join", "traffic", "logs")},
        "heartbeat": {**defaults.__dict__, **({"interval": args.interval} if args.interval else {})},
    }
    try:
        if "kill" in only:
            report["kill"] = bench.failure_trials(signal.SIGKILL)
        if "stop" in only:
            report["stop"] = bench.failure_trials(signal.SIGSTOP)
        if "soak" in only:
            report["soak"] = bench.soak()
        if "traffic" in only:
            report["traffic"] = bench.traffic()
    except KeyboardInterrupt:
        _common.log("interrupted: printing what was measured")
    finally:
        bench.cleanup()
    _print(report)
    path = _common.write_json(args.json, report)
    print(f"wrote {path}")


def _print(r: dict[str, Any]) -> None:
    rows = []
    for key, bar in (("kill", 0.5), ("stop", 1.5)):
        if key in r:
            s = r[key]
            ok = s["median_s"] is not None and s["median_s"] <= bar and not s["failed_trials"]
            rows.append(
                [
                    f"{s['signal']} one of {s['nodes']} nodes: seen dead by all",
                    _fmt(s["median_s"]),
                    f"{_fmt(s['min_s'])} - {_fmt(s['max_s'])}",
                    f"{len(s['trials']) - s['failed_trials']}/{len(s['trials'])}",
                    f"<= {bar * 1000:.0f} ms: {'PASS' if ok else 'FAIL'}",
                ]
            )
            rows.append(
                [
                    "  then back alive at all others" + (" (restarted process)" if key == "kill" else " (SIGCONT)"),
                    _fmt(s["rejoin_median_s"]),
                    "",
                    f"{len(s['trials']) - s['rejoin_failed']}/{len(s['trials'])}",
                    "rejoins: " + ("PASS" if not s["rejoin_failed"] else "FAIL"),
                ]
            )
    if "soak" in r:
        s = r["soak"]
        rows.append(
            [
                f"soak {s['seconds']:.0f} s, {s['nodes']} nodes, 1 MiB msgs, {s['cpu_burners']} CPU burners",
                f"{s['false_deaths']} false deaths",
                f"{s['suspect_reports']} suspect reports",
                f"CPU {s['machine_cpu_percent_median']:.0f}%, {s['mib_per_s']:.0f} MiB/s",
                f"0 false deaths: {'PASS' if s['false_deaths'] == 0 else 'FAIL'}",
            ]
        )
    if rows:
        _common.print_table(
            "failure detection (medians over trials; latency from kill() to the last observer's report)",
            ["measurement", "median", "range", "ok trials", "bar"],
            rows,
        )
    if "traffic" in r:
        trows = [
            [
                str(t["nodes"]),
                f"{t['bytes_per_s_per_node_mean']:.0f}",
                f"{t['bytes_per_s_per_node_max']:.0f}",
                f"{t['msgs_per_s_per_node_mean']:.1f}",
                f"{t['bytes_per_msg']:.0f}",
                f"{t['all_to_all_bytes_per_s_per_node']:.0f}",
            ]
            for t in r["traffic"]
        ]
        _common.print_table(
            f"membership traffic sent per node (heartbeat.interval = {r['heartbeat']['interval']} s)",
            ["nodes", "B/s mean", "B/s max", "msgs/s", "B/msg", "all-to-all would be B/s"],
            trows,
            footer="bytes = serialized envelopes (frame bytes; transport length prefixes not counted)",
        )


if __name__ == "__main__":
    main()
