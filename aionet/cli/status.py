"""``aionet status`` and ``aionet info``: ask a running cluster, as a client that does not join."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
from collections.abc import AsyncIterator
from typing import Any

import click

from ..errors import AionetError, PeerUnavailable
from .config import client_config


def targets(url: str | None, seeds: list[str]) -> list[str]:
    """Where to connect: ``--connect`` if given, else the config's seeds (a usage error if none)."""
    if url:
        return [url]
    if not seeds:
        raise click.UsageError("give --connect URL, or a --config whose [node] join names the cluster's seeds")
    return seeds


def failure(urls: list[str], exc: BaseException) -> str:
    """``exc`` as one line naming where it happened, the address once: a dial's error often names
    its URL already, and each layer adding it again made ``url: url: url: reason``."""
    text = str(exc) or type(exc).__name__
    named = [u for u in urls if u in text]
    return text if named else f"{' '.join(urls)}: {text}"


@contextlib.asynccontextmanager
async def client(cfg: Any, urls: list[str], role: str, timeout: float) -> AsyncIterator[tuple[Any, str]]:
    """A non-member client node connected to the first of ``urls`` that answers: (node, peer)."""
    from ..node import Node

    async with Node(name=f"{role}-{os.getpid()}-{secrets.token_hex(3)}", config=cfg) as node:
        errors = []
        for url in urls:
            try:
                peer = await asyncio.wait_for(node.connect(url), timeout)
            except (TimeoutError, AionetError, OSError) as exc:
                errors.append(failure([url], exc))
                continue
            yield node, peer
            return
        raise PeerUnavailable("; ".join(errors))


@click.command()
@click.option("--connect", "url", help="URL of any node (default: the seeds in --config's [node] join).")
@click.option("--config", "-c", type=click.Path(dir_okay=False), help="TOML or YAML config file (token, TLS).")
@click.option("--timeout", default=5.0, show_default=True)
def info(url: str | None, config: str | None, timeout: float) -> None:
    """Print a node's ``aionet.info`` as JSON. Connects as a client: it does not join."""
    from ..runner import run

    cfg, seeds = client_config(config)
    urls = targets(url, seeds)

    async def go() -> Any:
        async with client(cfg, urls, "info", timeout) as (node, peer):
            return await node.request(peer, "aionet.info", None, timeout=timeout)

    try:
        out = run(go())
    except (TimeoutError, AionetError, OSError) as exc:
        raise click.ClickException(failure(urls, exc)) from None
    click.echo(json.dumps(out, indent=2, default=str))


@click.command()
@click.option("--connect", "url", help="URL of any node of the cluster (default: the seeds in --config).")
@click.option("--config", "-c", type=click.Path(dir_okay=False), help="TOML or YAML config file (token, TLS).")
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
    from ..runner import run

    cfg, seeds = client_config(config)
    urls = targets(url, seeds)

    async def go() -> None:
        from ..membership import MEMBERS_SERVICE

        async with client(cfg, urls, "status", timeout) as (node, peer):
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
        raise click.ClickException(failure(urls, exc)) from None


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
