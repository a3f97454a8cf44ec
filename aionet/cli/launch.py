"""``aionet launch -n 4 -- python app.py``: a local world of N ranks (see aionet.launch.local)."""

from __future__ import annotations

import sys

import click

from ..errors import ConfigError


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-n", "--nprocs", type=int, required=True, help="Number of ranks (processes) to start.")
@click.option("--transport", default="tcp", show_default=True, help="tcp, tls, zmq+tcp or ucx.")
@click.option("--port", type=int, default=0, help="Base port: rank k listens on port + k (default: a free block).")
@click.option("--no-prefix", is_flag=True, help="Do not prefix output lines with the rank.")
@click.option("--grace", type=float, default=5.0, show_default=True, help="s the other ranks get after a failure.")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED, required=True)
def launch(nprocs: int, transport: str, port: int, no_prefix: bool, grace: float, cmd: tuple[str, ...]) -> None:
    """Run CMD as ranks 0..N-1 on this host, forming one aionet world.

    Inside each rank, ``aionet.Node.from_env()`` (or ``aionet serve``) knows its rank, the world
    size and the seeds; ``node.group()`` is the world in rank order. Output is prefixed by rank;
    SIGINT/SIGTERM/SIGUSR1 are forwarded. If a rank fails, the others are stopped (not
    restarted) and the launcher exits with the failed rank's code."""
    import asyncio

    from ..launch.local import launch as run_launch

    try:
        result = asyncio.run(
            run_launch(list(cmd), nprocs, transport=transport, port=port, prefix=not no_prefix, grace=grace)
        )
    except (ConfigError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    sys.exit(result.code)
