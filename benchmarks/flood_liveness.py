"""Flood one node with 64 B messages from several senders and count false death verdicts.

Issue 13's bar: a 60 s flood of 64 B messages from 3 senders into one node declares nobody
dead. Heartbeats share connections with the data, so before the liveness responder a backlog
delayed them past the detector's window. Every node here is its own process (``aionet``
Nodes over tcp://127.0.0.1); each counts the membership events it saw. No process dies, so
every ``dead`` event is a false verdict.

    python benchmarks/flood_liveness.py                 # 3 senders, 60 s
    python benchmarks/flood_liveness.py --senders 3 --seconds 20 --strict
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAYLOAD = b"x" * 64


async def _node(name: str, join: str | None):
    from aionet import Node

    node = Node(name=name, listen="tcp://127.0.0.1:0", join=[join] if join else None)
    await node.start()
    kinds: Counter[str] = Counter()
    node.on_member_change(lambda ev: kinds.update([ev.kind]))
    return node, kinds


async def receiver(seconds: float) -> dict:
    node, kinds = await _node("recv", None)
    print("READY " + json.dumps({"address": node.address}), flush=True)
    got = 0
    deadline = time.monotonic() + seconds + 10
    try:
        while time.monotonic() < deadline:
            try:
                got += len(await asyncio.wait_for(node.recv_batch("flood"), 1.0))
            except TimeoutError:
                if got:
                    break
    finally:
        stalls = node.membership.stats().max_phi
        await node.stop()
    return {"role": "recv", "received": got, "events": dict(kinds), "max_phi": round(stalls, 1)}


async def sender(name: str, join: str, seconds: float) -> dict:
    node, kinds = await _node(name, join)
    await node.membership.wait_for("recv", "alive", timeout=30)
    print("READY " + json.dumps({"address": node.address}), flush=True)
    sent = failed = 0
    t0 = time.monotonic()
    end = t0 + seconds
    while time.monotonic() < end:
        for _ in range(256):
            try:
                await node.send("recv", "flood", PAYLOAD)
                sent += 1
            except Exception:
                failed += 1
    took = time.monotonic() - t0
    await asyncio.sleep(2.0)  # late verdicts, if any, still count
    max_phi = node.membership.stats().max_phi
    await node.stop()
    return {
        "role": name,
        "sent": sent,
        "failed": failed,
        "rate": sent / took,
        "events": dict(kinds),
        "max_phi": max_phi,
    }


def child(args: argparse.Namespace) -> None:
    import uvloop

    if args.role == "recv":
        out = uvloop.run(receiver(args.seconds))
    else:
        out = uvloop.run(sender(args.role, args.join, args.seconds))
    print("RESULT " + json.dumps(out), flush=True)


def _start(role: str, seconds: float, join: str | None = None) -> tuple[subprocess.Popen, dict]:
    cmd = [sys.executable, __file__, "--role", role, "--seconds", str(seconds)]
    if join:
        cmd += ["--join", join]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    line = p.stdout.readline()
    if not line.startswith("READY "):
        p.kill()
        raise SystemExit(f"{role} did not start: {line!r} {p.stderr.read()[-2000:]}")
    return p, json.loads(line[6:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--senders", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--strict", action="store_true", help="exit 1 on any death verdict")
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--join", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        child(args)
        return 0
    procs = []
    try:
        recv, info = _start("recv", args.seconds)
        procs.append(recv)
        for i in range(args.senders):
            procs.append(_start(f"s{i}", args.seconds, info["address"])[0])
        print(f"flooding for {args.seconds:g} s from {args.senders} senders (64 B messages) ...", flush=True)
        results = []
        for p in procs:
            out, err = p.communicate(timeout=args.seconds + 120)
            line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                print(f"child failed:\n{err[-2000:]}")
                return 1
            results.append(json.loads(line[7:]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    deaths = 0
    print(f"{'node':6} {'sent':>10} {'received':>10} {'msgs/s':>10} {'max phi':>8}  member events seen")
    for r in results:
        ev = r["events"]
        deaths += ev.get("dead", 0)
        rate = f"{r['rate']:,.0f}" if "rate" in r else "-"
        print(
            f"{r['role']:6} {r.get('sent', '-'):>10} {r.get('received', '-'):>10} {rate:>10} "
            f"{r['max_phi']:>8.1f}  {json.dumps(ev, sort_keys=True)}"
        )
    total = sum(r.get("sent", 0) for r in results)
    print(f"total sent {total:,} ({total / args.seconds:,.0f} msgs/s); false death verdicts: {deaths}")
    return 1 if (args.strict and deaths) else 0


if __name__ == "__main__":
    raise SystemExit(main())
