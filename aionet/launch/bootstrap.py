"""Build a node's config from its launcher's environment: the I/O around :func:`~.env.detect`.

Precedence, lowest first: what the launcher implies, the config file, ``AIONET_*`` variables,
arguments. A launcher's values only fill settings the user left at their defaults and did not
name in an ``AIONET_*`` variable (so ``AIONET_COLLECTIVES_PIPELINE_SEGMENTS=2`` keeps the
default even where the launched world would get whole ring chunks).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from pathlib import Path

from ..config import Config
from ..errors import ConfigError
from .env import LaunchInfo, detect

__all__ = ["K8S_NAMESPACE_FILE", "config_from_env", "detect_launch"]

K8S_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def detect_launch(cfg: Config, env: Mapping[str, str] | None = None, cores: int | None = None) -> LaunchInfo | None:
    """The launched world this process belongs to, per ``cfg.launch``; None when started by hand.
    ``cores``: the host's core count (default: ``os.cpu_count()``)."""
    if not cfg.launch.detect:
        return None
    env = os.environ if env is None else env
    options = dataclasses.asdict(cfg.launch)
    namespace = None
    if "KUBERNETES_SERVICE_HOST" in env and Path(K8S_NAMESPACE_FILE).is_file():
        namespace = Path(K8S_NAMESPACE_FILE).read_text()
    hostname = socket.gethostname()
    if cores is None:
        # the host's count, not this process's affinity: mpirun binds each rank to its own
        # cores, and every rank on the host must reach the same settings
        cores = os.cpu_count() or 0
    try:
        return detect(env, hostname, options=options, namespace_file=namespace, cores=cores)
    except ConfigError:
        seed = _mpi_seed_host(env)  # MPI across hosts: ask MPI itself where rank 0 runs
        if seed is None:
            raise
        return detect(env, hostname, options={**options, "seed_host": seed}, namespace_file=namespace, cores=cores)


def _mpi_seed_host(env: Mapping[str, str]) -> str | None:
    """Rank 0's host name, broadcast over MPI (only when mpi4py is installed and MPI launched us)."""
    if not any(k.startswith(("OMPI_COMM_WORLD_", "PMI_")) for k in env):
        return None
    try:
        from mpi4py import MPI  # optional: only for MPI worlds spanning several hosts
    except ImportError:
        return None
    host: str = MPI.COMM_WORLD.bcast(socket.gethostname() if MPI.COMM_WORLD.Get_rank() == 0 else None, root=0)
    return host


def config_from_env(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    cores: int | None = None,
) -> tuple[Config, LaunchInfo | None]:
    """The config file (or defaults) plus AIONET_* overrides, then the launcher's implied settings
    for whatever is still at its default."""
    env = os.environ if env is None else env
    cfg = Config.from_file(path, env=env) if path is not None else Config.from_dict({}, env=env)
    info = detect_launch(cfg, env, cores)
    if info is None:
        return cfg, None
    defaults = Config()
    for sname, values in info.config().items():
        section, default = getattr(cfg, sname), getattr(defaults, sname)
        for key, value in values.items():
            if getattr(section, key) == getattr(default, key) and f"AIONET_{sname}_{key}".upper() not in env:
                setattr(section, key, value)
    cfg.validate()
    return cfg, info
