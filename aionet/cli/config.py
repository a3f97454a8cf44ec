"""How the CLI builds a Config: the file named by ``--config`` (or the defaults), then the
command line's overrides; and the listen-nowhere variant that ``status`` and ``info`` dial with."""

from __future__ import annotations

import click

from ..config import Config
from ..errors import ConfigError


def load_config(
    config: str | None,
    name: str | None,
    listen: tuple[str, ...],
    join: tuple[str, ...],
    advertise: str | None,
    *,
    launched: bool = False,
) -> Config:
    """The config file (or the defaults, with ``AIONET_*`` overrides), then the command line's
    ``--name/--listen/--join/--advertise``, which win; validated, so errors name the key.
    ``launched``: fill what is left at its default from the launcher's environment (mpirun,
    srun, torchrun, a StatefulSet, ``aionet launch``; see aionet.launch)."""
    if launched:
        from ..launch.bootstrap import config_from_env

        cfg = config_from_env(config)[0]
    else:
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


def client_config(config: str | None) -> tuple[Config, list[str]]:
    """Config for a short-lived client (``status``, ``info``) and the config's seeds.

    The client only dials: it listens nowhere, joins nothing and advertises no address, so it
    never becomes a member and the cluster is not told about it; it says goodbye on exit."""
    from ..log import configure as configure_logging  # structlog and rich: only when running

    try:
        cfg = load_config(config, None, (), (), None)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    seeds = list(cfg.node.join)
    cfg.node.listen, cfg.node.join, cfg.node.advertise = [], [], ""
    cfg.log.level = ""  # a node's [log] level is for the node, not for this command
    configure_logging("warning", cfg.log.format)
    return cfg, seeds
