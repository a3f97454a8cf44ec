#!/usr/bin/env python
"""Peak memory of a big transfer: one 1 GiB numpy array from one node process to another.

Two aionet node processes on 127.0.0.1 (started by this script). The client allocates a
1 GiB array of incompressible bytes, both sides record their resident set size (RSS) as a
baseline, then ``await cli.send("srv", "big", arr)``; the server ``await srv.recv("big")``,
checks the size and a CRC32 of every byte, and both report their peak RSS increase over the
baseline. Bar: neither side's peak rises by more than 1.2 GiB (the receiver necessarily holds
the 1 GiB it received; the sender already held its array before the baseline, so a copy-free
sender shows ~0).

Peak RSS is measured two ways and the larger is reported: the kernel's high-water mark
(VmHWM, reset via /proc/self/clear_refs right after the baseline) and a thread sampling RSS
every 2 ms.

    python benchmarks/rss.py                          # tcp://, 1 GiB, bar 1.2 GiB
    python benchmarks/rss.py --transport tcp,zmq+tcp --size-mib 256
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
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C

SCRIPT = Path(__file__).resolve()
HOST = "127.0.0.1"


def listen_url(scheme: str, role: str) -> str:
    if scheme == "inproc":
        return f"inproc://rss-{role}-{os.getpid()}"
    if scheme.endswith("+ipc"):
        return f"{scheme}:///tmp/aionet-rss-{os.getpid()}-{role}"
    return f"{scheme}://{HOST}:0"


def make_array(nbytes: int) -> Any:
    """Incompressible bytes without a second full-size temporary: a 64 MiB random block tiled."""
    import numpy as np

    block = np.random.default_rng(7).integers(0, 256, size=min(nbytes, 64 * C.MiB), dtype=np.uint8)
    arr = np.empty(nbytes, dtype=np.uint8)
    for off in range(0, nbytes, block.size):
        n = min(block.size, nbytes - off)
        arr[off : off + n] = block[:n]
    return arr


def _unavailable() -> str | None:
    try:
        import aionet

        aionet.Node  # noqa: B018
    except Exception as exc:
        return f"aionet.Node not available: {type(exc).__name__}: {exc}"
    return None


# --------------------------------------------------------------------------- children


async def server_main(scheme: str, size: int) -> None:
    import aionet

    loop = asyncio.get_running_loop()
    state: dict[str, Any] = {}
    got: asyncio.Future[Any] = loop.create_future()

    async with aionet.Node(name="srv", listen=listen_url(scheme, "srv")) as srv:

        @srv.service("bench.arm")
        async def arm(_: Any) -> dict[str, Any]:
            gc.collect()
            state["tracker"] = C.PeakTracker().start()
            return {"base_rss": state["tracker"].base}

        @srv.service("bench.result")
        async def result(req: dict[str, Any]) -> dict[str, Any]:
            arr = await asyncio.wait_for(asyncio.shield(got), 600)
            t_recv = state["t_recv"]
            ok_size = int(arr.nbytes) == size
            crc = zlib.crc32(memoryview(arr).cast("B")) if ok_size else None
            stats = state["tracker"].stop()
            stats.update(
                received_bytes=int(arr.nbytes),
                dtype=str(arr.dtype),
                crc_ok=crc == req["crc"],
                t_recv=t_recv,
            )
            return stats

        async def consume() -> None:
            arr = await srv.recv("big")
            state["t_recv"] = time.time()
            got.set_result(arr)

        task = loop.create_task(consume())
        C.emit("READY", {"url": srv.address})
        try:
            await asyncio.Event().wait()
        finally:
            task.cancel()


async def client_main(scheme: str, url: str, size: int) -> dict[str, Any]:
    import aionet

    async with aionet.Node(name="cli", listen=listen_url(scheme, "cli"), join=[url]) as cli:
        deadline = time.monotonic() + 30
        while True:
            try:
                await cli.request("srv", "aionet.echo", b"hi", timeout=2)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        arr = make_array(size)
        crc = zlib.crc32(memoryview(arr).cast("B"))
        gc.collect()
        srv_base = await cli.request("srv", "bench.arm", None, timeout=30)
        tracker = C.PeakTracker().start()
        t0 = time.perf_counter()
        t0_wall = time.time()
        await cli.send("srv", "big", arr)
        t_sent = time.perf_counter()
        srv_stats = await cli.request("srv", "bench.result", {"crc": crc}, timeout=600)
        t1 = time.perf_counter()
        cli_stats = tracker.stop()
        srv_stats["srv_base_reported"] = srv_base
        seconds = srv_stats["t_recv"] - t0_wall  # wall clocks of two processes on one host
        return {
            "size": size,
            "client": cli_stats,
            "server": srv_stats,
            "send_returned_s": t_sent - t0,
            "transfer_s": seconds,
            "until_result_s": t1 - t0,
            "gbps": size / max(seconds, 1e-9) / 1e9,
        }


# --------------------------------------------------------------------------- parent


def run_one(scheme: str, size: int, timeout: float, verbose: bool) -> dict[str, Any]:
    children: list[C.Child] = []
    try:
        ppid = str(os.getpid())
        common = ["--_scheme", scheme, "--_size", str(size), "--_ppid", ppid]
        server = C.Child(
            C.python_argv(SCRIPT, "--_role", "server", *common), label=f"rss-{scheme.replace('+', '-')}-srv"
        )
        children.append(server)
        info = server.expect("READY", timeout=90)
        if "unavailable" in info:
            return {"unavailable": info["unavailable"]}
        client = C.Child(
            C.python_argv(SCRIPT, "--_role", "client", "--_url", info["url"], *common),
            label=f"rss-{scheme.replace('+', '-')}-cli",
        )
        children.append(client)
        return client.expect("RESULT", timeout=timeout)
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transport", default="tcp", help="comma list of aionet transports (default: tcp)")
    ap.add_argument("--size-mib", type=int, default=1024, help="array size in MiB (default 1024 = 1 GiB)")
    ap.add_argument("--limit-gib", type=float, default=1.2, help="bar: max peak RSS increase per side")
    ap.add_argument("--timeout", type=float, default=300, help="seconds allowed per transport")
    ap.add_argument("--json", default=str(C.RESULTS_DIR / "rss.json"), help="where to write the JSON results")
    ap.add_argument("--plain", action="store_true", help="plain-text table instead of rich")
    ap.add_argument("-v", "--verbose", action="store_true", help="show child logs")
    ap.add_argument("--_role", help=argparse.SUPPRESS)
    ap.add_argument("--_scheme", help=argparse.SUPPRESS)
    ap.add_argument("--_size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_url", help=argparse.SUPPRESS)
    ap.add_argument("--_ppid", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._role:
        signal.signal(signal.SIGINT, lambda *_: os._exit(130))
        if args._ppid:
            C.parent_watchdog(args._ppid)
        C.hard_deadline(3600)
        why = _unavailable()
        if why:
            C.emit("READY" if args._role == "server" else "RESULT", {"unavailable": why})
            return 0
        if args._role == "server":
            C.run_async(server_main(args._scheme, args._size))
        else:
            C.emit("RESULT", C.run_async(client_main(args._scheme, args._url, args._size)))
        return 0

    C.install_cleanup()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    size = args.size_mib * C.MiB
    limit = int(args.limit_gib * C.GiB)
    schemes = [s.strip() for s in args.transport.split(",") if s.strip()]
    results: dict[str, Any] = {}
    rows: list[list[str]] = []
    verdicts: list[bool] = []
    notes = [f"array {C.fmt_bytes(size)}; bar: peak RSS increase <= {C.fmt_bytes(limit)} on each side"]
    try:
        for scheme in schemes:
            print(f"rss: sending {C.fmt_bytes(size)} over {scheme}:// ...", flush=True)
            res = run_one(scheme, size, args.timeout, args.verbose)
            results[scheme] = res
            if "unavailable" in res or "error" in res:
                why = res.get("unavailable") or res.get("error")
                rows.append([scheme, "-", "-", "-", "-", f"n/a ({why})"])
                continue
            for side in ("client", "server"):
                st = res[side]
                ok = st["peak_increase"] <= limit
                if side == "server":
                    ok = ok and st.get("received_bytes") == size and bool(st.get("crc_ok"))
                verdicts.append(ok)
                res[side]["pass"] = ok
                rows.append(
                    [
                        scheme,
                        "sender" if side == "client" else "receiver",
                        C.fmt_bytes(st["base_rss"]),
                        C.fmt_bytes(st["peak_rss"]),
                        C.fmt_bytes(st["peak_increase"]),
                        "PASS" if ok else "FAIL",
                    ]
                )
            notes.append(
                f"{scheme}: transfer {res['transfer_s']:.2f}s ({res['gbps']:.2f} GB/s), "
                f"send() returned after {res['send_returned_s']:.2f}s, "
                f"receiver crc {'ok' if res['server'].get('crc_ok') else 'MISMATCH'}"
            )
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
    finally:
        C._cleanup_children()

    C.print_table(
        "aionet peak RSS during a one-way transfer",
        ["transport", "side", "baseline RSS", "peak RSS", "peak increase", "verdict"],
        rows,
        footer="\n".join(notes),
        plain=args.plain,
    )
    passed = bool(verdicts) and all(verdicts)
    print("PASS" if passed else "FAIL")
    out = {
        "benchmark": "rss",
        "environment": C.environment(),
        "config": {"size": size, "limit": limit, "transports": schemes},
        "results": results,
        "pass": passed,
    }
    print(f"wrote {C.write_json(args.json, out)}")
    print(json.dumps({"pass": passed, "size": size, "limit": limit}))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
