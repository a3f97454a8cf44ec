"""``aionet trace``: record what every member does for a while, as a Perfetto-ready trace."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import click

from ..errors import AionetError
from .config import client_config
from .status import client, failure, targets


@click.command()
@click.option("--connect", "url", help="URL of any node of the cluster (default: the seeds in --config).")
@click.option("--config", "-c", type=click.Path(dir_okay=False), help="TOML or YAML config file (cluster token, TLS).")
@click.option("--seconds", default=10.0, show_default=True, help="How long to record.")
@click.option("--out", "out_path", default="trace.json", show_default=True, type=click.Path(dir_okay=False))
@click.option("--max-events", default=200_000, show_default=True, help="Ring buffer per node while recording.")
@click.option("--read", "read_path", type=click.Path(exists=True, dir_okay=False), help="Only summarize this trace.")
@click.option("--timeout", default=5.0, show_default=True, help="Seconds to wait for each node's answer.")
def trace(
    url: str | None, config: str | None, seconds: float, out_path: str, max_events: int, read_path: str | None,
    timeout: float,
) -> None:  # fmt: skip
    """Record requests, tasks (waiting and running, per node), device transfers, collectives and
    member events on every alive member for SECONDS, write Chrome trace-event JSON (open it at
    ui.perfetto.dev or chrome://tracing) and print the time per node and the communication
    share. Connects as a client (it does not join). ``--read FILE`` only prints the summary."""
    from ..observe.trace import chrome_trace, validate

    if read_path:
        data = json.loads(Path(read_path).read_text())
        problems = validate(data)
        if problems:
            raise click.ClickException(f"{read_path}: not a trace Perfetto can open: {problems[0]}")
        _print_profile(data)
        return
    from ..runner import run

    cfg, seeds = client_config(config)
    urls = targets(url, seeds)
    try:
        parts, missed = run(_record(cfg, urls, seconds, max_events, timeout))
    except (TimeoutError, AionetError, OSError) as exc:
        raise click.ClickException(failure(urls, exc)) from None
    data = chrome_trace(parts)
    Path(out_path).write_text(json.dumps(data))
    n = sum(len(p["events"]) for p in parts)
    dropped = sum(int(p.get("dropped", 0)) for p in parts)
    click.echo(f"wrote {out_path}: {n} events from {len(parts)} nodes" + (f" ({dropped} dropped)" if dropped else ""))
    for name, why in missed.items():
        click.echo(f"  {name}: not traced ({why})", err=True)
    _print_profile(data)


async def _record(
    cfg: Any, urls: list[str], seconds: float, max_events: int, timeout: float
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    from rich.progress import Progress

    from ..membership import MEMBERS_SERVICE
    from ..observe.trace import TRACE_SERVICE

    async with client(cfg, urls, "trace", timeout) as (node, peer):
        snap = await node.request(peer, MEMBERS_SERVICE, None, timeout=timeout)
        members = {n: m for n, m in snap.get("members", {}).items() if m.get("state") == "alive"}
        names: dict[str, str] = {peer: peer}
        missed: dict[str, str] = {}
        for name, m in members.items():
            if name in names:
                continue
            try:
                names[name] = await asyncio.wait_for(node.connect(m["address"]), timeout)
            except (TimeoutError, AionetError, OSError, KeyError) as exc:
                missed[name] = f"cannot connect: {exc or type(exc).__name__}"

        async def ask(name: str, arg: dict[str, Any]) -> Any:
            return await node.request(names[name], TRACE_SERVICE, arg, timeout=timeout)

        started = await asyncio.gather(*(ask(n, {"op": "start", "max_events": max_events}) for n in names),
                                       return_exceptions=True)  # fmt: skip
        since = {}
        for name, res in zip(list(names), started, strict=True):
            if isinstance(res, BaseException):
                missed[name] = f"{type(res).__name__}: {res}"
                del names[name]
            else:
                since[name] = float(res["now_us"])
        with Progress(transient=True) as progress:
            bar = progress.add_task(f"tracing {len(names)} nodes", total=seconds)
            loop = asyncio.get_running_loop()
            end = loop.time() + seconds
            while (left := end - loop.time()) > 0:
                await asyncio.sleep(min(0.1, left))
                progress.update(bar, completed=seconds - max(0.0, end - loop.time()))
        got = await asyncio.gather(*(ask(n, {"op": "collect", "since": since[n], "stop": True}) for n in names),
                                   return_exceptions=True)  # fmt: skip
        parts = []
        for name, res in zip(list(names), got, strict=True):
            if isinstance(res, BaseException):
                missed[name] = f"{type(res).__name__}: {res}"
            else:
                parts.append(res)
        return parts, missed


def _print_profile(data: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from ..observe.trace import device_profile, profile

    prof = profile(data)
    table = Table(title="time per node (seconds; communication share = requests made + transfers + collectives "
                  "over that + task compute)")  # fmt: skip
    for col in ("node", "tasks running", "tasks waiting", "requests made", "requests handled", "transfers",
                "collectives", "communication share"):  # fmt: skip
        table.add_column(col, justify="left" if col == "node" else "right")
    keys = ("task_running_s", "task_waiting_s", "requests_made_s", "requests_handled_s", "transfers_s", "collectives_s")
    for name in sorted(prof):
        r = prof[name]
        table.add_row(name, *(f"{r[k]:.3f}" for k in keys), f"{r['communication_share']:.0%}")
    console = Console()
    console.print(table)
    devices = device_profile(data)
    if devices:
        dt = Table(title="task time per node and device (seconds; a task on two GPUs counts on both)")
        for col in ("node", "device", "tasks", "running"):
            dt.add_column(col, justify="left" if col in ("node", "device") else "right")
        for name in sorted(devices):
            for dev in sorted(devices[name], key=_device_order):
                d = devices[name][dev]
                dt.add_row(name, dev, str(int(d["tasks"])), f"{d['running_s']:.3f}")
        console.print(dt)


def _device_order(dev: str) -> tuple[int, int]:
    """cpu first, then GPUs by index (gpu 10 after gpu 9)."""
    return (0, 0) if dev == "cpu" else (1, int(dev.split()[-1]) if dev.split()[-1].isdigit() else 0)
