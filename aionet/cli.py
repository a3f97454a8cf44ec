"""Command line: ``aionet serve | demo | info``."""

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


def _load_config(config: str | None, name: str | None, listen: tuple[str, ...], join: tuple[str, ...],
                 advertise: str | None) -> Any:
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
def serve(config: str | None, name: str | None, listen: tuple[str, ...], join: tuple[str, ...],
          advertise: str | None, apps: tuple[str, ...], log_level: str | None, json_logs: bool) -> None:
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


if __name__ == "__main__":  # pragma: no cover
    main()
