"""Command line: ``aionet serve | status | info | keys | demo | bench | launch | trace``.

Subcommands load lazily: this module names each one by import path and imports it only when
click asks for it (to run it, or for its one-line help). The subcommand modules in turn import
the Node, the transports and numpy inside their functions, so ``aionet --help`` and a typo'd
command answer at once.
"""

from __future__ import annotations

import importlib

import click

from .._version import __version__

#: subcommand name -> "module:attribute" of its click command (modules relative to this package)
SUBCOMMANDS: dict[str, str] = {
    "bench": "bench:bench",
    "demo": "demo:demo",
    "info": "status:info",
    "keys": "keys:keys",
    "launch": "launch:launch",
    "serve": "serve:serve",
    "status": "status:status",
    "trace": "trace:trace",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use (click's documented pattern)."""

    def __init__(self, *args: object, lazy_subcommands: dict[str, str] | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy_subcommands = dict(lazy_subcommands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_subcommands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = self.lazy_subcommands.get(cmd_name)
        if spec is None:
            return super().get_command(ctx, cmd_name)
        module, _, attr = spec.partition(":")
        cmd = getattr(importlib.import_module(f".{module}", __name__), attr)
        if not isinstance(cmd, click.Command):  # a wrong table entry is our bug: say where
            raise TypeError(f"aionet.cli.{module}:{attr} is {type(cmd).__name__}, not a click command")
        return cmd


@click.group(cls=LazyGroup, lazy_subcommands=SUBCOMMANDS)
@click.version_option(__version__, prog_name="aionet")
def main() -> None:
    """aionet: an asyncio message-passing runtime for heterogeneous clusters."""


__all__ = ["SUBCOMMANDS", "LazyGroup", "main"]
