"""``aionet bench allreduce|broadcast|allgather|reduce_scatter``: nccl-tests' table for aionet.

This process is rank 0; it starts ``--nodes - 1`` local node processes (this same module as
``python -m aionet.cli.bench``) that join it over ``--transport``, forms one group, and for each
size times the collective out of place and in place, checking every element (``#wrong``).
Columns as nccl-tests prints them: size, count, type, redop, then time (us), algbw and busbw
(GB/s) and #wrong for each variant; busbw scales algbw by what each link carries (allreduce
2(n-1)/n, allgather and reduce_scatter (n-1)/n, broadcast 1), so group sizes compare.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from typing import Any

import click

from ..errors import AionetError, PeerUnavailable

OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter", "p2p", "tasks")
LISTEN = {"tcp": "tcp://127.0.0.1:0", "zmq": "zmq+tcp://127.0.0.1:0", "ucx": "ucx://127.0.0.1:0"}


def parse_size(text: str) -> int:
    s = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    try:
        return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a size (e.g. 8, 64K, 1M, 2G)") from None


def sizes_between(lo: int, hi: int, factor: int) -> list[int]:
    out, s = [], max(4, lo)
    while s <= hi:
        out.append(s)
        s *= factor
    return out


async def run_rank(
    rank: int, n: int, op: str, sizes: list[int], iters: int, warmup: int, listen: str, seed: str | None, report: Any,
    device: str = "cpu",
) -> None:  # fmt: skip
    """One rank of the benchmark (rank 0 reports rows through ``report``)."""
    from ..collectives.bench import measure
    from ..node import Node

    node = Node(name=f"bench{rank}", listen=listen, join=[seed] if seed else None)
    await node.start()
    try:
        if rank == 0:
            report({"addr": node.address})
        names = [f"bench{i}" for i in range(n)]
        try:
            await node.wait_members(names, timeout=60)
        except PeerUnavailable as exc:
            raise click.ClickException(f"the bench nodes did not all join: {exc}") from None
        grp = node.group(members=names, name="aionet-bench")
        await measure(grp, op, sizes, iters, warmup, report if rank == 0 else None, device)
    finally:
        await node.stop()


async def run_connected(
    url: str, config: str | None, n: int, op: str, sizes: list[int], iters: int, warmup: int, timeout: float,
    device: str = "cpu",
) -> tuple[list[str], list[dict[str, Any]]]:  # fmt: skip
    """``--connect``: the members of a running cluster run the bench (this client does not join)."""
    import secrets

    from ..collectives.bench import BENCH_SERVICE
    from ..membership import MEMBERS_SERVICE
    from .config import client_config
    from .status import client

    cfg, _seeds = client_config(config)
    async with client(cfg, [url], "bench", timeout) as (node, peer):
        snap = await node.request(peer, MEMBERS_SERVICE, None, timeout=timeout)
        alive = sorted(name for name, m in snap.get("members", {}).items() if m.get("state") == "alive")
        members = alive if n <= 0 else alive[:n]
        if len(members) < max(2, n):
            raise click.ClickException(f"need {max(2, n)} alive members, the cluster has {len(alive)}: {alive}")
        names = {}
        for name in members:
            address = snap["members"][name]["address"]
            names[name] = peer if name == peer else await asyncio.wait_for(node.connect(address), timeout)
        arg = {"op": op, "members": members, "name": f"aionet-bench-{secrets.token_hex(4)}", "sizes": sizes,
               "iters": iters, "warmup": warmup, "device": device}  # fmt: skip
        # a long wait: every size, every iteration; the members' own collectives.timeout still applies
        limit = max(120.0, 5.0 * len(sizes) * (iters + warmup))
        rows = await asyncio.gather(*(node.request(names[m], BENCH_SERVICE, arg, timeout=limit) for m in members))
        return members, rows[0]


def _row_text(r: dict[str, Any]) -> list[str]:
    cells = [str(r["size"]), str(r["count"]), r["type"], r["redop"]]
    for v in ("out", "in"):
        m = r.get(v)
        cells += [f"{m['time_us']:.1f}", f"{m['algbw']:.3f}", f"{m['busbw']:.3f}", str(m["wrong"])] if m else ["-"] * 4
    return cells


@click.command()
@click.argument("op", type=click.Choice(OPS))
@click.option("--nodes", "-n", default=2, show_default=True, help="Node processes (ranks), this one included.")
@click.option("--min", "min_size", default="8", show_default=True, help="Smallest size in bytes (K/M/G suffixes).")
@click.option("--max", "max_size", default="64M", show_default=True, help="Largest size in bytes.")
@click.option("--factor", default=2, show_default=True, help="Multiply the size by this between rows.")
@click.option("--iters", default=20, show_default=True, help="Timed calls per size and variant.")
@click.option("--warmup", default=5, show_default=True, help="Untimed calls first.")
@click.option("--transport", type=click.Choice(sorted(LISTEN)), default="tcp", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per size on stdout instead of the table.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Also draw bandwidth vs size to this PNG.")
@click.option("--tasks", "n_tasks", default=5000, show_default=True, help="tasks: no-op tasks in the throughput run.")
@click.option("--connect", "url", help="Run the collective on the members of this running cluster instead.")
@click.option(
    "--device",
    type=click.Choice(["cpu", "gpu"]),
    default="cpu",
    show_default=True,
    help="Buffers in host memory (numpy) or on the GPU (CuPy, staged through pinned host buffers).",
)
@click.option("--config", "-c", type=click.Path(dir_okay=False), help="With --connect: TOML config (token, TLS).")
def bench(
    op: str,
    nodes: int,
    min_size: str,
    max_size: str,
    factor: int,
    iters: int,
    warmup: int,
    transport: str,
    as_json: bool,
    plot_path: str | None,
    n_tasks: int,
    url: str | None,
    config: str | None,
    device: str,
) -> None:
    """Time a collective over NODES local node processes, nccl-tests style (with #wrong);
    ``p2p``: request/reply latency and one-way bandwidth per size between two node processes;
    ``tasks``: task throughput and latency with NODES - 1 worker processes. ``--connect URL``:
    the collective runs on the first NODES members (by name) of a running cluster (``--nodes
    0``: all alive members), which every ``aionet serve`` node answers; this client does not join."""
    if (nodes < 2 and not (url and nodes == 0)) or factor < 2 or iters < 1 or warmup < 0:
        raise click.BadParameter(
            "need --nodes >= 2 (0 with --connect: all), --factor >= 2, --iters >= 1, --warmup >= 0"
        )
    sizes = sizes_between(parse_size(min_size), parse_size(max_size), factor)
    if not sizes:
        raise click.BadParameter("--min is larger than --max")
    if plot_path and op == "tasks":
        raise click.BadParameter("--plot draws bandwidth against size: p2p and the collectives")
    if device == "gpu":
        if op == "tasks":
            raise click.BadParameter("--device gpu moves GPU buffers: p2p and the collectives")
        if not url:  # with --connect the members need the GPU, not this client
            _require_gpu()
    if op in ("p2p", "tasks"):
        if url:
            raise click.BadParameter("--connect runs the collectives; p2p and tasks start their own processes")
        _bench_p2p_tasks(op, nodes, sizes, iters, transport, as_json, plot_path, n_tasks, device)
        return
    if url:
        from rich.console import Console

        with Console(stderr=True).status(f"{op} on the cluster at {url} ({len(sizes)} sizes)", spinner="dots"):
            try:
                members, rows = asyncio.run(run_connected(url, config, nodes, op, sizes, iters, warmup, 10.0, device))
            except (TimeoutError, OSError, AionetError) as exc:
                raise click.ClickException(f"{url}: {exc or type(exc).__name__}") from None
        nodes, transport = len(members), url.split("://")[0]
        if as_json:
            for row in rows:
                click.echo(json.dumps({"op": op, "nodes": nodes, "members": members, **row}))
            return
        _print_table(op, nodes, transport, iters, rows, plot_path, device)
        return
    rows: list[dict[str, Any]] = []
    from rich.console import Console
    from rich.progress import Progress

    from ..launch.local import shared_cores_env, shared_cores_notice, usable_cores

    console = Console(stderr=True)
    # what `aionet launch` gives ranks that fill or outnumber the cores: this process (rank 0)
    # and the ones it starts read it from the environment; a value already set there wins
    have = usable_cores()
    shared = shared_cores_env(nodes, os.environ, have)
    os.environ.update(shared)
    if shared:
        console.print(shared_cores_notice(nodes, have, shared))
    procs: list[subprocess.Popen[bytes]] = []
    with Progress(console=console, transient=True, disable=as_json) as progress:
        task = progress.add_task(f"{op} over {nodes} nodes", total=len(sizes))

        def report(item: dict[str, Any]) -> None:
            if "addr" in item:
                args = [sys.executable, "-m", "aionet.cli.bench", op, str(nodes), json.dumps(sizes), str(iters)]
                args += [str(warmup), LISTEN[transport], item["addr"], device]
                procs.extend(subprocess.Popen([*args, str(r)], env=os.environ.copy()) for r in range(1, nodes))
                return
            rows.append(item)
            progress.advance(task)
            if as_json:
                click.echo(json.dumps({"op": op, "nodes": nodes, "transport": transport, **item}))

        try:
            asyncio.run(run_rank(0, nodes, op, sizes, iters, warmup, LISTEN[transport], None, report, device))
        except AionetError as exc:
            raise _failed(op, procs, exc) from None
        finally:
            _reap(procs)
    if as_json:
        return
    _print_table(op, nodes, transport, iters, rows, plot_path, device)


def _exit_text(p: subprocess.Popen[bytes]) -> str:
    rc = p.returncode
    if rc is not None and rc < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-rc).name}"
    return f"exited with code {rc}"


def _failed(op: str, procs: list[subprocess.Popen[bytes]], exc: BaseException) -> click.ClickException:
    """One clear line for a run that failed: which child process ended, if one did (the usual
    cause: the others then see their peer declared dead), else the error itself."""
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=0.5 if p.poll() is None else 0)  # a peer that just died may not be reaped yet
    ended = [p for p in procs if p.returncode]
    ended.sort(key=lambda p: (p.returncode or 0) >= 0)  # killed by a signal first: the others followed it
    if ended:
        what = f"a bench process (pid {ended[0].pid}) {_exit_text(ended[0])} mid-run"
        return click.ClickException(f"{op}: {what}; the run stopped: {exc}")
    return click.ClickException(f"{op}: the run failed: {type(exc).__name__}: {exc}")


def _reap(procs: list[subprocess.Popen[bytes]]) -> None:
    """Wait for the bench's child processes (they leave when the run ends); kill a straggler."""
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _require_gpu() -> None:
    """``--device gpu`` on a machine that cannot: say why before any process starts."""
    from ..devices import Devices

    devices = Devices(use_nvml=False)
    if not devices.cuda_available():
        raise click.ClickException(f"--device gpu needs CuPy and a CUDA device: {devices.cuda_reason()}")


def _print_table(
    op: str, nodes: int, transport: str, iters: int, rows: list[dict[str, Any]], plot: str | None, device: str = "cpu"
) -> None:
    """nccl-tests' table (and the busbw plot); exit code 1 if any element was wrong."""
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"aionet {op}: {nodes} nodes over {transport}://, float32 {'CuPy (GPU)' if device == 'gpu' else 'numpy'}"
        f" buffers; time = median of {iters} (us), bw in GB/s",
        caption="columns 5-8 out of place, 9-12 in place (allreduce with out=x; host buffers only)",
    )
    for col in ("size", "count", "type", "redop"):
        table.add_column(col, justify="right")
    for v in ("", " "):  # rich needs distinct headers: the in-place ones carry a trailing space
        for col in ("time", "algbw", "busbw", "#wrong"):
            table.add_column(col + v, justify="right")
    for r in rows:
        table.add_row(*_row_text(r))
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    if plot and rows:
        from .bench_p2p import plot_collective

        plot_collective(rows, plot, f"aionet {op}, {nodes} nodes over {transport}://")
        click.echo(f"plot: {plot}")
    if any(r[v]["wrong"] for r in rows for v in ("out", "in") if r.get(v)):
        raise SystemExit(1)


def _bench_p2p_tasks(
    op: str, nodes: int, sizes: list[int], iters: int, transport: str, as_json: bool, plot_path: str | None,
    n_tasks: int, device: str = "cpu",
) -> None:  # fmt: skip
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from . import bench_p2p

    procs: list[subprocess.Popen[bytes]] = []
    listen = LISTEN[transport]

    def check() -> None:
        for p in procs:
            if p.poll() is not None:
                raise click.ClickException(f"a bench peer process {_exit_text(p)} (see its stderr above)")

    def start_peer(seed: str) -> None:
        args = [sys.executable, "-m", "aionet.cli.bench_p2p", "peer", seed, listen]
        procs.append(subprocess.Popen(args, env=os.environ.copy(), stdout=subprocess.DEVNULL))

    console = Console(stderr=True)
    with Progress(console=console, transient=True, disable=as_json) as progress:
        bar = progress.add_task(f"{op} over {transport}://", total=len(sizes) if op == "p2p" else 3)

        def advance(row: dict[str, Any]) -> None:
            progress.advance(bar)
            if as_json:
                click.echo(json.dumps({"bench": op, "transport": transport, "device": device, **row}))

        try:
            if op == "p2p":
                rows = asyncio.run(
                    bench_p2p.run_p2p(sizes, iters, 32 << 20, listen, start_peer, advance, check, device)
                )
            else:
                rows = asyncio.run(bench_p2p.run_tasks(nodes - 1, n_tasks, listen, start_peer, advance, check))
        except AionetError as exc:
            raise _failed(op, procs, exc) from None
        finally:
            _reap(procs)
    if plot_path and op == "p2p":
        bench_p2p.plot_p2p(rows, plot_path, f"aionet p2p over {transport}:// ({device} buffers)")
        click.echo(f"plot: {plot_path}", err=as_json)
    if as_json:
        return
    out = Console(width=None if sys.stdout.isatty() else 160)
    if op == "tasks":
        table = Table(title=f"aionet tasks: 1 submitter, {nodes - 1} worker processes over {transport}://")
        for col in ("measure", "value", "unit"):
            table.add_column(col, justify="left" if col == "measure" else "right")
        for r in rows:
            table.add_row(r["metric"], f"{r['value']:,.3f}" if r["unit"] == "s" else f"{r['value']:,.1f}", r["unit"])
        out.print(table)
        return
    kind = "CuPy (GPU)" if device == "gpu" else "numpy"
    table = Table(title=f"aionet p2p: 2 node processes over {transport}://, {kind} payloads; round trips: {iters}")
    for col in ("size", "rtt p50 us", "rtt p99 us", "one-way GB/s", "msgs/s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["size"]), f"{r['rtt_p50_us']:.1f}", f"{r['rtt_p99_us']:.1f}", f"{r['gbytes_per_s']:.3f}",
                      f"{r['msgs_per_s']:,.0f}")  # fmt: skip
    out.print(table)


def _worker() -> None:
    op, n, sizes, iters, warmup, listen, seed, device, rank = sys.argv[1:10]
    try:
        asyncio.run(
            run_rank(int(rank), int(n), op, json.loads(sizes), int(iters), int(warmup), listen, seed, print, device)
        )
    except (AionetError, click.ClickException) as exc:  # rank 0 reports the run's end; one line here
        msg = exc.format_message() if isinstance(exc, click.ClickException) else f"{type(exc).__name__}: {exc}"
        print(f"bench rank {rank}: {msg}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    _worker()
