#!/usr/bin/env python
"""Memory bound under back-pressure: a sender facing a peer that reads nothing.

Claim checked: "With a peer that reads nothing, the sender's RSS stays under
max_inflight_bytes + 64 MiB while it tries to send 4 GiB."

Two node processes on 127.0.0.1, started by this script. The receiver is stuck in one of two
ways (``--mode``, default both, each with a fresh pair of processes):

* ``nodrain`` -- the receiver runs normally but never reads the ``sink`` mailbox; once the
  mailbox holds ``--mailbox-size`` messages its connection stops being read;
* ``sigstop`` -- the receiver process is frozen with SIGSTOP (kernel buffers fill, nothing
  is acknowledged), then SIGCONT'ed and killed at the end. The sender's failure detector is
  slowed down (``heartbeat.interval`` 60 s) so that the frozen peer stays "alive" and only
  back-pressure holds the sender;
* ``sigstop-detect`` -- the same with the default failure detector: the frozen peer is
  declared dead within about a second and ``send`` raises PeerUnavailable (the expected
  outcome, reported with the time it took);
* ``partition`` -- the sender reaches the receiver through a proxy which then closes the
  connection and turns into a black hole: new connections open but no byte passes (and the
  sender advertises a closed port, so the receiver cannot dial back around the partition).
  The sender keeps redialing (``link.give_up_after`` is
  longer than the run) and buffers unacknowledged messages for replay until
  ``max_inflight_bytes`` is reached. This is the case where the link's window, not the
  transport, is what holds memory (slow failure detector, as in ``sigstop``).

The sender tries to send ``--total-gib`` (4) GiB as fresh numpy arrays of ``--chunk-kib``
KiB (a new allocation per message, as a producer would make) for at most ``--duration``
seconds, then gives up. Each mode runs with 1 MiB arrays (the claim as stated: a message this
big makes ``send`` wait for its acknowledgement, so at most one is in flight) and with
256 KiB arrays (which fill the whole ``max_inflight_bytes`` window first, the harder case).
The sender's peak RSS increase over the baseline taken just before the first send (kernel
high-water mark and a 2 ms sampler, the larger) must stay below
``link.max_inflight_bytes`` (``--max-inflight-mib``, default the config default) + 64 MiB.
The table also shows how much was sent and how long the last ``send`` had been blocked when
the sender gave up: back-pressure means blocking, not dropping.

    python benchmarks/backpressure_rss.py                        # all modes x (1 MiB, 256 KiB), 15 s each
    python benchmarks/backpressure_rss.py --mode sigstop --max-inflight-mib 32 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C

SCRIPT = Path(__file__).resolve()
SLACK = 64 * C.MiB
MODES = ("nodrain", "sigstop", "sigstop-detect", "partition")


# --------------------------------------------------------------------------- children


def _config(**sections: Any) -> Any:
    from aionet.config import Config

    return Config.from_dict({"log": {"level": "warning"}, **sections}, env={})


async def receiver_main(mailbox_size: int, proxied: bool) -> None:
    import aionet
    from aionet.testing import FaultProxy

    cfg = _config(link={"mailbox_size": mailbox_size})
    async with aionet.Node(name="rcv", listen="tcp://127.0.0.1:0", config=cfg) as node:
        url = node.address
        proxy = None
        if proxied:  # peers reach us only through a proxy that SIGUSR2 turns into a partition
            proxy = FaultProxy.to(url)
            await proxy.start()
            node.config.node.advertise = url = proxy.address

            def partition() -> None:  # a black hole: connections open but no byte ever passes
                proxy.stall()
                proxy.cut()

            asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, partition)
        C.emit("READY", {"url": url, "pid": os.getpid()})
        try:
            await asyncio.Event().wait()  # never reads "sink"
        finally:
            if proxy is not None:
                await proxy.stop()


async def sender_main(
    url: str,
    total: int,
    chunk: int,
    duration: float,
    max_inflight: int | None,
    slow_detector: bool,
    unreachable: bool,
) -> dict[str, Any]:
    import numpy as np

    import aionet

    link = {"max_inflight_bytes": max_inflight} if max_inflight else {}
    heartbeat = {"interval": 60.0, "probe_timeout": 600.0, "suspect_timeout": 600.0} if slow_detector else {}
    node_section = {}
    if unreachable:  # advertise a closed port: the receiver cannot dial back around the partition
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            node_section["advertise"] = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    cfg = _config(link=link, heartbeat=heartbeat, node=node_section)
    go = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, go.set)
    async with aionet.Node(name="snd", listen="tcp://127.0.0.1:0", join=[url], config=cfg) as node:
        await node.request("rcv", "aionet.echo", b"hi", timeout=10)
        C.emit("READY", {"pid": os.getpid()})
        await asyncio.wait_for(go.wait(), 60)  # the parent froze (or not) the receiver
        sent = 0
        messages = 0
        last_done = time.monotonic()
        error: str | None = None
        error_type: str | None = None

        async def flood() -> None:
            nonlocal sent, messages, last_done
            i = 0
            while sent < total:
                arr = np.empty(chunk, dtype=np.uint8)  # fresh memory per message
                arr.fill(i & 255)
                await node.send("rcv", "sink", arr)
                sent += chunk
                messages += 1
                i += 1
                last_done = time.monotonic()

        gc.collect()
        tracker = C.PeakTracker().start()
        t0 = time.monotonic()
        task = asyncio.ensure_future(flood())
        try:
            await asyncio.wait_for(asyncio.shield(task), duration)
        except TimeoutError:
            pass
        except aionet.AionetError as exc:
            error = f"{type(exc).__name__}: {exc}"
            error_type = type(exc).__name__
        finally:
            task.cancel()
        gave_up = time.monotonic()
        mem = tracker.stop()
        info = node.info()["peers"].get("rcv", {})
        return {
            **mem,
            "sent_bytes": sent,
            "messages": messages,
            "seconds": gave_up - t0,
            "blocked_for_s": gave_up - last_done,
            "finished": sent >= total,
            "error": error,
            "error_type": error_type,
            "max_inflight_bytes": node.config.link.max_inflight_bytes,
            "link": info.get("link"),
            "connections": info.get("connections"),
        }


# --------------------------------------------------------------------------- parent


def run_mode(mode: str, chunk_kib: int, args: argparse.Namespace) -> dict[str, Any]:
    ppid = str(os.getpid())
    children: list[C.Child] = []
    stopped_pid: int | None = None
    try:
        rargv = ["--_role", "receiver", "--_ppid", ppid, "--mailbox-size", str(args.mailbox_size)]
        if mode == "partition":
            rargv.append("--_proxy")
        rcv = C.Child(C.python_argv(SCRIPT, *rargv), label=f"bp-{mode}-rcv")
        children.append(rcv)
        info = rcv.expect("READY", timeout=60)
        argv = [
            "--_role", "sender", "--_ppid", ppid, "--_url", info["url"],
            "--total-gib", str(args.total_gib), "--chunk-kib", str(chunk_kib),
            "--duration", str(args.duration),
        ]  # fmt: skip
        if mode in ("sigstop", "partition") or (args.slow_detector and mode != "sigstop-detect"):
            argv.append("--_slow-detector")
        if mode == "partition":
            argv.append("--_unreachable")
        if args.max_inflight_mib:
            argv += ["--max-inflight-mib", str(args.max_inflight_mib)]
        snd = C.Child(C.python_argv(SCRIPT, *argv), label=f"bp-{mode}-snd")
        children.append(snd)
        ready = snd.expect("READY", timeout=60)
        if mode.startswith("sigstop"):
            os.kill(rcv.pid, signal.SIGSTOP)
            stopped_pid = rcv.pid
        elif mode == "partition":
            os.kill(rcv.pid, signal.SIGUSR2)
            time.sleep(0.2)  # let the cut reach the sender first
        os.kill(ready["pid"], signal.SIGUSR1)
        return snd.expect("RESULT", timeout=args.duration + 120)
    except C.ChildError as exc:
        return {"error": str(exc), "failed": True}
    finally:
        if stopped_pid is not None:
            try:
                os.kill(stopped_pid, signal.SIGCONT)
            except OSError:
                pass
        for ch in children:
            if args.verbose:
                tail = ch.log_tail(10)
                if tail:
                    print(f"--- log tail of {ch.label} (pid {ch.pid}) ---\n{tail}", file=sys.stderr)
            ch.kill()
            if not args.verbose:
                ch.remove_log()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    ap.add_argument("--total-gib", type=float, default=4.0, help="what the sender tries to send (GiB)")
    ap.add_argument("--chunk-kib", default="1024,256", help="comma list of array sizes in KiB (each runs every mode)")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds the sender keeps trying, per run")
    ap.add_argument("--max-inflight-mib", type=int, default=0, help="link.max_inflight_bytes (0: config default)")
    ap.add_argument("--mailbox-size", type=int, default=16, help="receiver's link.mailbox_size (messages)")
    ap.add_argument(
        "--slow-detector", action="store_true", help="slow failure detector in every mode (not just sigstop/partition)"
    )
    ap.add_argument("--json", default=str(C.RESULTS_DIR / "backpressure_rss.json"), help="JSON output path")
    ap.add_argument("--plain", action="store_true", help="plain-text table instead of rich")
    ap.add_argument("-v", "--verbose", action="store_true", help="show child logs")
    ap.add_argument("--_role", help=argparse.SUPPRESS)
    ap.add_argument("--_url", help=argparse.SUPPRESS)
    ap.add_argument("--_ppid", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_slow-detector", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--_proxy", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--_unreachable", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    total = int(args.total_gib * C.GiB)
    chunks = [int(c) for c in str(args.chunk_kib).split(",") if c.strip()]
    if args._role:
        chunk = chunks[0] * C.KiB
        signal.signal(signal.SIGINT, lambda *_: os._exit(130))
        if args._ppid:
            C.parent_watchdog(args._ppid)
        C.hard_deadline(args.duration + 600)
        if args._role == "receiver":
            C.run_async(receiver_main(args.mailbox_size, args._proxy))
        else:
            inflight = args.max_inflight_mib * C.MiB or None
            res = sender_main(args._url, total, chunk, args.duration, inflight, args._slow_detector, args._unreachable)
            C.emit("RESULT", C.run_async(res))
        return 0

    C.install_cleanup()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown mode(s): {', '.join(bad)}")
    results: dict[str, Any] = {}
    rows: list[list[str]] = []
    verdicts: list[bool] = []
    runs = [(mode, kib) for kib in chunks for mode in modes]
    try:
        for mode, kib in runs:
            label = f"{mode}/{kib}KiB"
            print(f"backpressure_rss: {label}: trying to send {C.fmt_bytes(total)} ...", flush=True)
            res = run_mode(mode, kib, args)
            results[label] = res
            if res.get("failed"):
                verdicts.append(False)
                rows.append([mode, C.fmt_bytes(kib * C.KiB), "-", "-", "-", "-", "-", "-", f"FAIL ({res['error']})"])
                continue
            bound = res["max_inflight_bytes"] + SLACK
            # Blocking is the expected outcome; with the detector on, so is PeerUnavailable.
            expected_error = "PeerUnavailable" if mode == "sigstop-detect" else None
            ok = res["peak_increase"] < bound and not res["finished"] and res["error_type"] == expected_error
            outcome = f"peer declared dead after {res['seconds']:.1f} s" if res["error_type"] else "sender blocked"
            res["outcome"] = outcome
            res["bound"] = bound
            res["pass"] = ok
            verdicts.append(ok)
            rows.append(
                [
                    mode,
                    C.fmt_bytes(kib * C.KiB),
                    C.fmt_bytes(res["sent_bytes"]),
                    C.fmt_bytes(res["max_inflight_bytes"]),
                    C.fmt_bytes(res["peak_increase"]),
                    C.fmt_bytes(bound),
                    f"{res['blocked_for_s']:.1f} s" if not res["error_type"] else "-",
                    outcome,
                    "PASS" if ok else "FAIL" + (f" ({res['error']})" if res["error"] else ""),
                ]
            )
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
    finally:
        C._cleanup_children()

    C.print_table(
        "sender memory while the receiver reads nothing",
        [
            "receiver",
            "array",
            "sent",
            "max_inflight",
            "sender peak RSS increase",
            "bound",
            "last send blocked",
            "outcome",
            "verdict",
        ],
        rows,
        footer=(
            f"tries {C.fmt_bytes(total)} in fresh arrays for {args.duration:.0f} s per run; "
            f"bound = max_inflight_bytes + {C.fmt_bytes(SLACK)}; receiver mailbox {args.mailbox_size} messages"
        ),
        plain=args.plain,
    )
    passed = bool(verdicts) and len(verdicts) == len(runs) and all(verdicts)
    print("PASS" if passed else "FAIL")
    out = {
        "benchmark": "backpressure_rss",
        "environment": C.environment(),
        "config": {
            "total": total,
            "chunks": [k * C.KiB for k in chunks],
            "duration": args.duration,
            "mailbox_size": args.mailbox_size,
            "modes": modes,
        },
        "results": results,
        "pass": passed,
    }
    print(f"wrote {C.write_json(args.json, out)}")
    summary = {m: {k: r.get(k) for k in ("sent_bytes", "peak_increase", "bound", "pass")} for m, r in results.items()}
    print(json.dumps({"pass": passed, "results": summary}))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
