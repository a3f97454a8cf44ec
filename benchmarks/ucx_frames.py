#!/usr/bin/env python
"""Large frames through bare ucxx, without aionet: where does UCX itself stop coping?

    python benchmarks/ucx_frames.py [--sizes 16MiB,64MiB,256MiB] [--count 5] [--device gpu|cpu]
                                    [--modes multi,tag] [--timeout 60]

Each (mode, size) runs in two fresh processes on 127.0.0.1: a listener that receives
``--count`` messages and checks their length and first and last bytes, and a client that
sends them back to back. ``multi`` is ucxx's ``send_multi``/``recv_multi`` (what the ucx://
transport uses: the receiver learns sizes from a header and allocates); ``tag`` is one
``send``/``recv`` per message into a buffer the receiver sized ahead. ``--device gpu`` sends
CuPy buffers (UCX's CUDA transports), ``cpu`` numpy ones. One line per case: ok with GB/s, or
how it failed (exit code, signal, UCX's last error lines). Written to tell a ucxx fault from an
aionet one when ``aionet bench p2p --transport ucx --device gpu`` failed at 256 MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time

from aionet.config import parse_size


def _xp(device: str):
    if device == "gpu":
        import cupy

        return cupy
    import numpy

    return numpy


def _fill(xp, n: int):
    buf = xp.empty(n, dtype=xp.uint8)
    buf[:] = 7
    buf[0], buf[-1] = 1, 2
    return buf


def _check(buf, n: int) -> str | None:
    got = int(buf.nbytes)
    if got != n:
        return f"length {got} != {n}"
    first, last = int(buf.reshape(-1).view("uint8")[0]), int(buf.reshape(-1).view("uint8")[-1])
    if (first, last) != (1, 2):
        return f"content wrong: first {first} last {last}"
    return None


async def _serve(mode: str, n: int, count: int, device: str) -> None:
    import ucxx

    ucxx.init(progress_mode="thread", enable_python_future=True)  # binds to the running loop
    xp = _xp(device)
    done = asyncio.get_running_loop().create_future()

    async def handle(ep) -> None:
        try:
            for _ in range(count):
                if mode == "multi":
                    bufs = await ep.recv_multi()
                    buf = bufs[1]
                    if device == "cpu" or not hasattr(buf, "__cuda_array_interface__"):
                        import numpy

                        buf = numpy.frombuffer(memoryview(buf), dtype="uint8") if device == "cpu" else xp.asarray(buf)
                    else:
                        buf = xp.asarray(buf).view(xp.uint8)
                else:
                    buf = xp.empty(n, dtype=xp.uint8)
                    await ep.recv(buf)
                err = _check(buf, n)
                if err:
                    raise RuntimeError(err)
            await ep.send(_xp("cpu").ones(1, dtype="uint8"))
            done.set_result(None)
        except BaseException as exc:
            if not done.done():
                done.set_exception(exc)

    lst = ucxx.create_listener(handle, port=0)
    print(f"PORT {lst.port}", flush=True)
    await done
    await asyncio.sleep(0.2)


async def _client(mode: str, n: int, count: int, device: str, port: int) -> None:
    import numpy
    import ucxx

    ucxx.init(progress_mode="thread", enable_python_future=True)
    xp = _xp(device)
    buf = _fill(xp, n)
    ep = await ucxx.create_endpoint("127.0.0.1", port)
    t0 = time.perf_counter()
    for _ in range(count):
        if mode == "multi":
            await ep.send_multi([b"\x01", buf])
        else:
            await ep.send(buf)
    ack = numpy.empty(1, dtype="uint8")
    await ep.recv(ack)
    dt = time.perf_counter() - t0
    print(f"RATE {n * count / dt / 1e9:.2f}", flush=True)


def _child(argv: list[str]) -> None:
    role, mode, n, count, device = argv[0], argv[1], int(argv[2]), int(argv[3]), argv[4]
    if role == "serve":
        asyncio.run(_serve(mode, n, count, device))
    else:
        asyncio.run(_client(mode, n, count, device, int(argv[5])))
    sys.stdout.flush()
    os._exit(0)  # ucxx's teardown at interpreter exit can hang; the result is already out


def _tail(text: str, k: int = 4) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " | ".join(ln.strip()[:160] for ln in lines[-k:])


def _case(mode: str, n: int, count: int, device: str, timeout: float) -> str:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("UCX_LOG_LEVEL", "warn")
    env.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    base = [sys.executable, __file__, "--child"]
    srv = subprocess.Popen(
        [*base, "serve", mode, str(n), str(count), device],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    cli = None
    try:
        line = ""
        for _ in range(50):  # ucxx or UCX may print before the port
            line = srv.stdout.readline() if srv.stdout else ""
            if not line or line.startswith("PORT "):
                break
        if not line.startswith("PORT "):
            srv.kill()
            out, err = srv.communicate(timeout=10)
            return f"listener failed: rc {srv.returncode}: {_tail(line + out + err)}"
        port = line.split()[1]
        cli = subprocess.Popen(
            [*base, "client", mode, str(n), str(count), device, port],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        try:
            cout, cerr = cli.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            cli.kill()
            cout, cerr = cli.communicate()
            srv.kill()
            _sout, serr = srv.communicate()
            return f"HUNG after {timeout:.0f} s: client {_tail(cerr, 2)}; listener {_tail(serr, 3)}"
        try:
            _sout, serr = srv.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            srv.kill()
            _sout, serr = srv.communicate()
        rate = [ln for ln in cout.splitlines() if ln.startswith("RATE ")]
        if cli.returncode == 0 and srv.returncode == 0 and rate:
            return f"ok {rate[0].split()[1]} GB/s"
        sig = lambda rc: f"signal {signal.Signals(-rc).name}" if rc and rc < 0 else f"rc {rc}"  # noqa: E731
        return f"FAILED: client {sig(cli.returncode)} {_tail(cerr, 3)}; listener {sig(srv.returncode)} {_tail(serr, 4)}"
    finally:
        for p in (cli, srv):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="16MiB,64MiB,256MiB")
    ap.add_argument("--count", type=int, default=5)
    ap.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--modes", default="multi,tag")
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()
    for size in args.sizes.split(","):
        n = parse_size(size)
        for mode in args.modes.split(","):
            t0 = time.monotonic()
            res = _case(mode, n, args.count, args.device, args.timeout)
            took = time.monotonic() - t0
            print(f"{args.device} {mode:5s} {size:>5s} x{args.count}: {res} ({took:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
