"""Command line: ``aionet serve | demo | info | keys``."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import secrets
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import click

from ._version import __version__
from .errors import AionetError, ConfigError
from .log import configure as configure_logging

#: a repeated SIGINT/SIGTERM sooner than this after the first is the same Ctrl-C delivered twice
REPEAT_SIGNAL_S = 0.2


def _load_config(
    config: str | None, name: str | None, listen: tuple[str, ...], join: tuple[str, ...], advertise: str | None
) -> Any:
    from .config import Config

    cfg = Config.from_file(config) if config else Config.from_dict({})
    if name:
        cfg.node.name = name
    if listen:
        cfg.node.listen = list(listen)
    if join:
        cfg.node.join = list(join)
    if advertise:
        cfg.node.advertise = advertise
    cfg.validate()
    return cfg


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


@click.group()
@click.version_option(__version__, prog_name="aionet")
def main() -> None:
    """aionet: an asyncio message-passing runtime for heterogeneous clusters."""


@main.command()
@click.option("--config", "-c", type=click.Path(dir_okay=False), help="TOML config file.")
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
    """Run a node until SIGINT/SIGTERM, then shut down cleanly (exit code 0); a second signal
    during that shutdown exits at once (code 128 + signal number).

    Prints one line ``ready {json}`` to stdout once listening, for scripts. Logs go to stderr."""
    try:
        cfg = _load_config(config, name, listen, join, advertise)
        level = (log_level or cfg.log.level or "info").lower()
        configure_logging(level, "json" if json_logs else cfg.log.format)
    except (ConfigError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    cfg.log.level = level  # the Node applies it again: --log-level wins over the file
    setups = [_load_app(a) for a in apps]
    from .runner import run
    from .scheduler.allow import app_packages

    # the apps' own packages may run tasks here (scheduler.allow_modules; the stdlib never does)
    cfg.scheduler.allow_modules = [*cfg.scheduler.allow_modules, *app_packages(apps)]

    try:
        run(_serve(cfg, setups))
    except AionetError as exc:
        raise click.ClickException(str(exc)) from None


async def _serve(cfg: Any, setups: list[Any]) -> None:
    from .node import Node

    node = Node(config=cfg)
    for setup in setups:
        res = setup(node)
        if asyncio.iscoroutine(res):
            await res
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    first: list[float] = []  # when the first signal came
    stopped = False

    def on_signal(sig: signal.Signals) -> None:
        if not first:
            first.append(loop.time())
            stop.set()
            return
        # One Ctrl-C can arrive twice within milliseconds (the terminal signals the process
        # group and a wrapper such as `timeout` forwards it too): only a later one counts.
        if stopped or loop.time() - first[0] < REPEAT_SIGNAL_S:
            return
        # a second Ctrl-C / SIGTERM during the shutdown grace: the operator wants out now
        node.log.warning("second signal: exiting now without the shutdown grace", signal=sig.name)
        _exit_now(128 + sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    async with node:
        sys.stdout.write("ready " + json.dumps({"name": node.name, "addresses": node.addresses}) + "\n")
        sys.stdout.flush()
        await stop.wait()
        node.log.info("signal received; shutting down (a second signal exits at once)")
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


def _client_config(config: str | None) -> tuple[Any, list[str]]:
    """Config for a short-lived client (``status``, ``info``) and the config's seeds.

    The client only dials: it listens nowhere, joins nothing and advertises no address, so it
    never becomes a member and the cluster is not told about it; it says goodbye on exit."""
    try:
        cfg = _load_config(config, None, (), (), None)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    seeds = list(cfg.node.join)
    cfg.node.listen, cfg.node.join, cfg.node.advertise = [], [], ""
    cfg.log.level = ""  # a node's [log] level is for the node, not for this command
    configure_logging("warning", cfg.log.format)
    return cfg, seeds


def _targets(url: str | None, seeds: list[str]) -> list[str]:
    if url:
        return [url]
    if not seeds:
        raise click.UsageError("give --connect URL, or a --config whose [node] join names the cluster's seeds")
    return seeds


@contextlib.asynccontextmanager
async def _client(cfg: Any, urls: list[str], role: str, timeout: float) -> AsyncIterator[tuple[Any, str]]:
    """A non-member client node connected to the first of ``urls`` that answers: (node, peer)."""
    from .errors import PeerUnavailable
    from .node import Node

    async with Node(name=f"{role}-{os.getpid()}-{secrets.token_hex(3)}", config=cfg) as node:
        errors = []
        for url in urls:
            try:
                peer = await asyncio.wait_for(node.connect(url), timeout)
            except (TimeoutError, AionetError, OSError) as exc:
                errors.append(f"{url}: {exc or type(exc).__name__}")
                continue
            yield node, peer
            return
        raise PeerUnavailable("; ".join(errors))


@main.command()
@click.option("--connect", "url", help="URL of any node (default: the seeds in --config's [node] join).")
@click.option("--config", "-c", type=click.Path(dir_okay=False), help="TOML config file (token, TLS).")
@click.option("--timeout", default=5.0, show_default=True)
def info(url: str | None, config: str | None, timeout: float) -> None:
    """Print a node's ``aionet.info`` as JSON. Connects as a client: it does not join."""
    from .runner import run

    cfg, seeds = _client_config(config)
    urls = _targets(url, seeds)

    async def go() -> Any:
        async with _client(cfg, urls, "info", timeout) as (node, peer):
            return await node.request(peer, "aionet.info", None, timeout=timeout)

    try:
        out = run(go())
    except (TimeoutError, AionetError, OSError) as exc:
        raise click.ClickException(f"{' '.join(urls)}: {exc or type(exc).__name__}") from None
    click.echo(json.dumps(out, indent=2, default=str))


@main.command()
@click.option("--size-mb", default=64, show_default=True, help="Size of the numpy array shipped between nodes.")
@click.option(
    "--transport", default="tcp", show_default=True, help="tcp, tls, zmq+tcp, zmq+ipc, ucx or rdma (what is installed)."
)
@click.option("--messages", default=50_000, show_default=True, help="One-way small messages to time.")
@click.option("--requests", default=2000, show_default=True, help="Request/reply round trips to time.")
def demo(size_mb: int, transport: str, messages: int, requests: int) -> None:
    """Start three local node processes, exchange messages and a large array, print a summary.

    SIGINT, SIGTERM or SIGHUP stop the node processes before the demo exits; temporary
    files (zmq+ipc sockets, tls keys) are removed."""
    from .demo import DemoError, run_demo

    configure_logging("warning")
    try:
        code = run_demo(size_mb=size_mb, scheme=transport, messages=messages, requests=requests)
    except DemoError as exc:
        raise click.ClickException(str(exc)) from None
    sys.exit(code)


@main.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--host", "hosts", multiple=True, help="Extra DNS name or IP for the node certificate (repeatable).")
@click.option("--days", default=365, show_default=True, help="Certificate validity in days.")
@click.option("--force", is_flag=True, help="Replace key files that already exist in DIRECTORY.")
@click.option(
    "--backend",
    type=click.Choice(["auto", "cryptography", "openssl"]),
    default="auto",
    show_default=True,
    help="How TLS certificates are made.",
)
def keys(directory: str, hosts: tuple[str, ...], days: int, force: bool, backend: str) -> None:
    """Generate key material for a test cluster into DIRECTORY and print the config to use it.

    Writes a random cluster token (mode 0600), a self-signed CA, one node certificate and key
    for TLS (valid as server and client, for localhost, this host and every --host) and a
    CurveZMQ key pair. Every node of the test cluster uses the same files."""
    from .keys import KeygenError, generate

    try:
        ks = generate(directory, hosts=list(hosts), days=days, force=force, backend=backend)
    except KeygenError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"{directory}: {exc.strerror or exc}") from None
    click.echo(f"# wrote to {ks.directory} (TLS via {ks.tls_backend}); keep *.key, token and curve.secret private")
    click.echo("# add to every node's config file:")
    click.echo(ks.config_snippet(), nl=False)


# --- aionet status (issue 5) -------------------------------------------------------------
@main.command()
@click.option("--connect", "url", help="URL of any node of the cluster (default: the seeds in --config).")
@click.option("--config", "-c", type=click.Path(dir_okay=False), help="TOML config file (cluster token, TLS).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one object per refresh with --watch).")
@click.option("--watch", is_flag=True, help="Refresh until Ctrl-C.")
@click.option("--interval", default=1.0, show_default=True, help="Seconds between refreshes with --watch.")
@click.option("--count", default=0, help="With --watch: stop after this many refreshes (0: never).")
@click.option("--timeout", default=5.0, show_default=True, help="Seconds to wait for the node's answer.")
def status(
    url: str | None, config: str | None, as_json: bool, watch: bool, interval: float, count: int, timeout: float
) -> None:
    """Show the cluster's members as one node sees them: state, address, load, devices and
    heartbeat age. Connects as a client (it does not join the cluster). The cluster token
    comes from --config or AIONET_SECURITY_TOKEN(_FILE)."""
    from .runner import run

    cfg, seeds = _client_config(config)
    urls = _targets(url, seeds)

    async def go() -> None:
        from .membership import MEMBERS_SERVICE

        async with _client(cfg, urls, "status", timeout) as (node, peer):
            shown = 0
            while True:
                snap = await node.request(peer, MEMBERS_SERVICE, None, timeout=timeout)
                _show_status(snap, as_json=as_json, watch=watch)
                shown += 1
                if not watch or (count and shown >= count):
                    return
                await asyncio.sleep(interval)

    try:
        run(go())
    except KeyboardInterrupt:
        pass
    except (TimeoutError, AionetError, OSError) as exc:
        raise click.ClickException(f"{' '.join(urls)}: {exc or type(exc).__name__}") from None


def _show_status(snap: dict[str, Any], *, as_json: bool, watch: bool) -> None:
    if as_json:
        click.echo(json.dumps(snap, default=str) if watch else json.dumps(snap, indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # piped: do not wrap rows at 80 columns
    members = snap.get("members", {})
    table = Table(title=f"aionet cluster as seen by {snap.get('node')} ({len(members)} members)")
    for col, just in (
        ("name", "left"),
        ("state", "left"),
        ("address", "left"),
        ("cpu%", "right"),
        ("memory", "right"),
        ("tasks", "right"),
        ("lag ms", "right"),
        ("gpus", "left"),
        ("age", "right"),
    ):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    table.caption = "age: time since this node last heard from the member (directly or by gossip)"
    colors = {"alive": "green", "suspect": "yellow", "dead": "red", "left": "dim"}
    for name in sorted(members):
        m = members[name]
        load = m.get("load") or {}
        if not load.get("reported", True):  # no report from it yet: show "-", not zeros
            load = {}
        gpus = (m.get("devices") or {}).get("gpus") or []
        state = m.get("state", "?")
        table.add_row(
            name + (" *" if m.get("self") else ""),
            f"[{colors.get(state, 'white')}]{state}[/]",
            m.get("address") or "-",
            f"{load['cpu_percent']:.0f}" if load else "-",
            f"{load['memory_used'] / 2**30:.1f}/{load['memory_total'] / 2**30:.1f}G" if load else "-",
            str(load["tasks"]) if load else "-",
            f"{load['loop_lag_ms']:.1f}" if load else "-",
            _gpu_text(gpus),
            "-" if m.get("age") is None else f"{m['age']:.2f} s",
        )
    if watch and console.is_terminal:
        console.clear()
    console.print(table)


def _gpu_text(gpus: list[dict[str, Any]]) -> str:
    if not gpus:
        return "-"
    parts = []
    for g in gpus:
        util = g.get("utilization")
        used, total = g.get("memory_used", 0) / 2**30, g.get("memory_total", 0) / 2**30
        parts.append(f"{g.get('name', '?')} {used:.0f}/{total:.0f} GiB" + (f" {util:.0f}%" if util is not None else ""))
    return "; ".join(parts)


# --- end aionet status ---------------------------------------------------------------------


if __name__ == "__main__":  # pragma: no cover
    main()
