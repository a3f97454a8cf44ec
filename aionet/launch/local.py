"""``aionet launch -n N -- cmd``: N local processes forming one world, like ``torchrun --standalone``.

Each rank gets ``AIONET_NODE_RANK``/``AIONET_NODE_WORLD_SIZE`` and its listen and seed addresses
(on 127.0.0.1), so ``aionet.Node.from_env()`` and ``aionet serve`` inside it need no flags. The
launcher prefixes every output line with the rank, forwards SIGINT/SIGTERM/SIGUSR1 to every
rank, and fails fast: the first rank to exit non-zero makes the launcher stop the others (TERM,
then KILL after ``grace``) and exit with that rank's code. Nothing is restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from ..errors import ConfigError
from .cores import shared_cores_settings

__all__ = [
    "FORWARDED_SIGNALS",
    "LaunchResult",
    "free_port_block",
    "launch",
    "rank_env",
    "shared_cores_env",
    "shared_cores_notice",
    "shared_cores_settings",
    "usable_cores",
]

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
#: transports whose listen URL is host:port, which separate processes can share
_NETWORK_SCHEMES = ("tcp", "tls", "zmq+tcp", "ucx")


@dataclass(frozen=True)
class LaunchResult:
    """How the run ended: ``code`` is the launcher's exit status."""

    code: int
    failed_rank: int | None  # the first rank to fail, if any
    codes: dict[int, int]  # every rank's exit status (negative: killed by that signal)


def free_port_block(n: int, host: str = "127.0.0.1", tries: int = 200) -> int:
    """A base port with ``n`` consecutive ports free on ``host`` right now."""
    for _ in range(tries):
        base = random.randint(20000, 60000 - n)
        socks: list[socket.socket] = []
        try:
            for i in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind((host, base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise OSError(f"no block of {n} free ports found on {host}")


def usable_cores() -> int:
    """The cores this process (and so every rank it starts) may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call on this platform
        return os.cpu_count() or 1


def shared_cores_env(nprocs: int, env: Mapping[str, str], cores: int | None = None) -> dict[str, str]:
    """What :func:`~aionet.launch.cores.shared_cores_settings` adds to ``env`` for ``nprocs`` ranks
    on ``cores`` (default: :func:`usable_cores`): only the settings ``env`` does not set already
    (the user's choice wins)."""
    have = usable_cores() if cores is None else cores
    return {k: v for k, v in shared_cores_settings(nprocs, have).items() if k not in env}


def shared_cores_notice(nprocs: int, cores: int, shared: Mapping[str, str]) -> str:
    """The line a launcher prints when it gives its ranks ``shared`` (:func:`shared_cores_env`)."""
    said = " ".join(f"{k}={v}" for k, v in shared.items())
    them = "it" if len(shared) == 1 else "them"
    return f"{nprocs} ranks on {cores} cores: every rank gets {said} (set {them} to choose)"


def rank_env(base_env: Mapping[str, str], rank: int, world: int, scheme: str, base_port: int) -> dict[str, str]:
    """The environment of one rank: the world's shape and its addresses (pure)."""
    seeds = [f"{scheme}://127.0.0.1:{base_port + r}" for r in range(min(world, 3))]
    env = dict(base_env)
    env.update(
        AIONET_NODE_RANK=str(rank),
        AIONET_NODE_WORLD_SIZE=str(world),
        AIONET_NODE_LISTEN=f"{scheme}://127.0.0.1:{base_port + rank}",
        AIONET_NODE_JOIN=",".join(seeds),
        PYTHONUNBUFFERED="1",
    )
    return env


async def launch(
    cmd: Sequence[str],
    nprocs: int,
    *,
    transport: str = "tcp",
    port: int = 0,
    prefix: bool = True,
    grace: float = 5.0,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
    env: Mapping[str, str] | None = None,
    on_start: Callable[[list[int]], None] | None = None,
    cores: int | None = None,
) -> LaunchResult:
    """Run ``cmd`` as ranks 0..nprocs-1 and supervise them until all exit or one fails.

    ``cores``: the host's usable cores (default: this process's affinity), which decide
    :func:`~aionet.launch.cores.shared_cores_settings`."""
    if nprocs < 1:
        raise ConfigError("aionet launch: -n must be at least 1")
    if transport not in _NETWORK_SCHEMES:
        raise ConfigError(f"aionet launch: --transport must be one of {', '.join(_NETWORK_SCHEMES)}, not {transport!r}")
    if not cmd:
        raise ConfigError("aionet launch: no command given; usage: aionet launch -n 4 -- python app.py")
    out = out or sys.stdout
    err = err or sys.stderr
    base_env: Mapping[str, str] = os.environ if env is None else env
    have = usable_cores() if cores is None else cores
    if shared := shared_cores_env(nprocs, base_env, have):
        err.write(f"aionet launch: {shared_cores_notice(nprocs, have, shared)}\n")
        base_env = {**base_env, **shared}
    base = port or free_port_block(nprocs)
    procs: list[asyncio.subprocess.Process] = []
    for r in range(nprocs):
        procs.append(
            await asyncio.create_subprocess_exec(
                *cmd,
                env=rank_env(base_env, r, nprocs, transport, base),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # a terminal's Ctrl-C reaches them once: forwarded by us
            )
        )
    if on_start is not None:
        on_start([p.pid for p in procs])
    return await _supervise(procs, prefix, grace, out, err)


async def _supervise(
    procs: list[asyncio.subprocess.Process], prefix: bool, grace: float, out: IO[str], err: IO[str]
) -> LaunchResult:
    loop = asyncio.get_running_loop()
    width = len(str(len(procs) - 1))
    stopping = asyncio.Event()
    signals_seen: list[int] = []

    def send(sig: int) -> None:
        for p in procs:
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(sig)

    def on_signal(sig: signal.Signals) -> None:
        signals_seen.append(sig)
        send(signal.SIGKILL if len(signals_seen) > 1 and sig != signal.SIGUSR1 else sig)

    for sig in FORWARDED_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)

    async def pump(stream: asyncio.StreamReader | None, sink: IO[str], rank: int) -> None:
        if stream is None:
            return
        tag = f"[rank {rank:>{width}}] " if prefix else ""
        while line := await stream.readline():
            sink.write(tag + line.decode(errors="replace"))
            sink.flush()

    async def wait(rank: int, p: asyncio.subprocess.Process) -> tuple[int, int]:
        assert p.stdout is not None and p.stderr is not None
        await asyncio.gather(pump(p.stdout, out, rank), pump(p.stderr, err, rank))
        return rank, await p.wait()

    failed: int | None = None
    codes: dict[int, int] = {}
    pending = {asyncio.ensure_future(wait(r, p)) for r, p in enumerate(procs)}
    killer: asyncio.TimerHandle | None = None
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                rank, code = fut.result()
                codes[rank] = code
                if code != 0 and failed is None and not signals_seen:
                    failed = rank
                    err.write(f"aionet launch: rank {rank} exited with {_describe(code)}; stopping the other ranks\n")
                    err.flush()
                    stopping.set()
                    send(signal.SIGTERM)
                    killer = loop.call_later(grace, send, signal.SIGKILL)
    finally:
        if killer is not None:
            killer.cancel()
        for sig in FORWARDED_SIGNALS:
            loop.remove_signal_handler(sig)
        for fut in pending:
            fut.cancel()
        send(signal.SIGKILL)  # only when interrupted: every rank has exited otherwise
    if failed is not None:
        code = _exit_code(codes[failed])
    elif any(codes.values()):
        code = _exit_code(next(c for c in codes.values() if c))
    else:
        code = 0
    return LaunchResult(code=code, failed_rank=failed, codes=dict(sorted(codes.items())))


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code


def _describe(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
        return f"signal {-code}"
    return f"exit code {code}"
