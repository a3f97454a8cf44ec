"""``aionet serve``: run one node until a signal, then shut it down cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import signal
import sys
from typing import Any

import click

from ..errors import AionetError, ConfigError, NodeClosed
from .config import load_config

#: a repeated SIGINT/SIGTERM sooner than this after the first is the same Ctrl-C delivered twice
REPEAT_SIGNAL_S = 0.2


def _load_app(spec: str) -> Any:
    """``pkg.mod:setup`` -> the callable, which gets the node before it starts serving.

    The working directory goes first on ``sys.path``, as ``python -m`` does, so a module
    next to where ``aionet serve`` is started imports without installing it."""
    mod_name, _, attr = spec.partition(":")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        missing = getattr(exc, "name", None)
        if missing and (mod_name == missing or mod_name.startswith(missing + ".")):
            raise click.BadParameter(
                f"cannot import {mod_name!r}: no such module in the working directory ({cwd}) or on "
                f"sys.path ({', '.join(p or '.' for p in sys.path)}); start aionet from the directory that "
                f"holds {mod_name.split('.')[0]}, add that directory to PYTHONPATH, or install the package",
                param_hint="--app",
            ) from None
        raise click.BadParameter(f"importing {mod_name!r} failed: {exc}", param_hint="--app") from None
    fn = getattr(mod, attr or "setup", None)
    if not callable(fn):
        raise click.BadParameter(f"{spec!r}: no callable {attr or 'setup'!r}", param_hint="--app")
    return fn


@click.command()
@click.option("--config", "-c", type=click.Path(dir_okay=False), help="TOML or YAML (.yaml, .yml) config file.")
@click.option("--name", help="Node name (unique in the cluster).")
@click.option("--listen", multiple=True, help="URL to listen on, e.g. tcp://0.0.0.0:7700 (repeatable).")
@click.option("--join", multiple=True, help="Seed URL to join (repeatable).")
@click.option("--advertise", help="URL peers should dial, when it differs from --listen.")
@click.option("--app", "apps", multiple=True, help="pkg.mod:setup called with the node before serving.")
@click.option("--log-level", default=None, help="debug, info, warning, error.")
@click.option("--json-logs", is_flag=True, help="Log as JSON lines.")
def serve(
    config: str | None,
    name: str | None,
    listen: tuple[str, ...],
    join: tuple[str, ...],
    advertise: str | None,
    apps: tuple[str, ...],
    log_level: str | None,
    json_logs: bool,
) -> None:
    """Run a node until SIGINT/SIGTERM/SIGUSR1, then drain and shut down cleanly (exit code 0):
    no new tasks are taken, accepted ones finish (up to scheduler.drain_timeout) or are re-run
    elsewhere, then the node leaves. A second signal during that exits at once (128 + signal).
    Under mpirun, srun, torchrun, a StatefulSet or ``aionet launch``, rank, world size, listen
    address and seeds come from the launcher (see ``aionet launch --help``).

    Prints one line ``ready {json}`` to stdout once listening, for scripts. Logs go to stderr."""
    from ..log import configure as configure_logging  # structlog and rich: only when running

    try:
        cfg = load_config(config, name, listen, join, advertise, launched=True)
        level = (log_level or cfg.log.level or "info").lower()
        configure_logging(level, "json" if json_logs else cfg.log.format)
    except (ConfigError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    cfg.log.level = level  # the Node applies it again: --log-level wins over the file
    setups = [_load_app(a) for a in apps]
    from ..runner import run
    from ..scheduler.allow import app_packages

    # the apps' own packages may run tasks here (scheduler.allow_modules; the stdlib never does)
    cfg.scheduler.allow_modules = [*cfg.scheduler.allow_modules, *app_packages(apps)]

    try:
        run(_serve(cfg, setups))
    except AionetError as exc:
        raise click.ClickException(str(exc)) from None


async def _serve(cfg: Any, setups: list[Any]) -> None:
    from ..node import Node

    node = Node(config=cfg)
    for setup in setups:
        res = setup(node)
        if asyncio.iscoroutine(res):
            await res
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    first: list[float] = []  # when the first signal came
    started = stopped = False
    stopping: list[asyncio.Task[None]] = []  # the stop a signal asked for while the node started

    def on_signal(sig: signal.Signals) -> None:
        if not first:
            first.append(loop.time())
            stop.set()
            if not started:  # still starting (seeds may be down for node.join_timeout): end that now
                stopping.append(loop.create_task(node.stop()))
            return
        # One Ctrl-C can arrive twice within milliseconds (the terminal signals the process
        # group and a wrapper such as `timeout` forwards it too): only a later one counts.
        if stopped or loop.time() - first[0] < REPEAT_SIGNAL_S:
            return
        # a second Ctrl-C / SIGTERM during the shutdown grace: the operator wants out now
        node.log.warning("second signal: exiting now without the shutdown grace", signal=sig.name)
        _exit_now(128 + sig)

    # SIGUSR1: a batch system's walltime warning (SLURM: srun --signal=USR1@120), drained like SIGTERM
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        async with node:
            started = True
            ready = {"name": node.name, "addresses": node.addresses}
            if node.world_size:
                ready.update(rank=node.rank, world_size=node.world_size)
            sys.stdout.write("ready " + json.dumps(ready) + "\n")
            sys.stdout.flush()
            await stop.wait()
            node.log.info(
                "signal received; shutting down: draining tasks, then leaving (a second signal exits at once)"
            )
            await node.drain()  # no new tasks; those accepted finish (scheduler.drain_timeout) or go elsewhere
    except NodeClosed:
        if not stopping:
            raise
        node.log.info("signal received while starting; stopped")
    finally:
        for t in stopping:
            await t
    stopped = True


def _exit_now(code: int) -> None:
    """Leave the process at once (buffered output flushed): no grace, no goodbyes."""
    import logging

    for h in logging.getLogger("aionet").handlers:
        with contextlib.suppress(Exception):
            h.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
