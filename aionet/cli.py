"""Command line: ``aionet serve | demo | info | keys``."""

from __future__ import annotations

import asyncio
import importlib
import json
import signal
import sys
from typing import Any

import click

from . import __version__
from .errors import AionetError, ConfigError
from .log import configure as configure_logging


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
    """``pkg.mod:setup`` -> the callable, which gets the node before it starts serving."""
    mod_name, _, attr = spec.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {mod_name!r}: {exc}", param_hint="--app") from exc
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
    """Run a node until SIGINT/SIGTERM, then shut down cleanly (exit code 0).

    Prints one line ``ready {json}`` to stdout once listening, for scripts."""
    try:
        cfg = _load_config(config, name, listen, join, advertise)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    configure_logging(log_level or cfg.log.level, "json" if json_logs else cfg.log.format)
    setups = [_load_app(a) for a in apps]
    from .runner import run

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
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with node:
        sys.stdout.write("ready " + json.dumps({"name": node.name, "addresses": node.addresses}) + "\n")
        sys.stdout.flush()
        await stop.wait()
        node.log.info("signal received; shutting down")


@main.command()
@click.option("--connect", "url", required=True, help="URL of any node.")
@click.option("--config", "-c", type=click.Path(dir_okay=False), help="TOML config file (token, limits).")
@click.option("--timeout", default=5.0, show_default=True)
def info(url: str, config: str | None, timeout: float) -> None:
    """Print a node's ``aionet.info`` as JSON."""
    from .runner import run

    cfg = _load_config(config, None, ("tcp://127.0.0.1:0",), (), None)
    configure_logging("warning", cfg.log.format)

    async def go() -> Any:
        from .node import Node

        async with Node(name=f"cli-{__import__('os').getpid()}", config=cfg) as node:
            peer = await node.connect(url)
            return await node.request(peer, "aionet.info", None, timeout=timeout)

    try:
        out = run(go())
    except (TimeoutError, AionetError, OSError) as exc:
        raise click.ClickException(f"{url}: {exc}") from None
    click.echo(json.dumps(out, indent=2, default=str))


@main.command()
@click.option("--size-mb", default=64, show_default=True, help="Size of the numpy array shipped between nodes.")
@click.option("--transport", default="tcp", show_default=True, help="tcp, zmq+tcp, ...")
def demo(size_mb: int, transport: str) -> None:
    """Start three local node processes, exchange messages and a large array, print a summary."""
    from .demo import run_demo

    configure_logging("warning")
    code = run_demo(size_mb=size_mb, scheme=transport)
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
@click.option("--connect", "url", required=True, help="URL of any node of the cluster.")
@click.option("--config", "-c", type=click.Path(dir_okay=False), help="TOML config file (cluster token, TLS).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one object per refresh with --watch).")
@click.option("--watch", is_flag=True, help="Refresh until Ctrl-C.")
@click.option("--interval", default=1.0, show_default=True, help="Seconds between refreshes with --watch.")
@click.option("--count", default=0, help="With --watch: stop after this many refreshes (0: never).")
@click.option("--timeout", default=5.0, show_default=True, help="Seconds to wait for the node's answer.")
def status(
    url: str, config: str | None, as_json: bool, watch: bool, interval: float, count: int, timeout: float
) -> None:
    """Show the cluster's members as one node sees them: state, address, load, devices and
    heartbeat age. The cluster token comes from --config or AIONET_SECURITY_TOKEN(_FILE)."""
    from .runner import run

    try:
        cfg = _load_config(config, None, ("tcp://127.0.0.1:0",), (), None)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    configure_logging("warning", cfg.log.format)

    async def go() -> None:
        from .membership import MEMBERS_SERVICE
        from .node import Node

        async with Node(name=f"status-{__import__('os').getpid()}", config=cfg) as node:
            peer = await node.connect(url)
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
        raise click.ClickException(f"{url}: {exc or type(exc).__name__}") from None


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
