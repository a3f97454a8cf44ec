"""What tests that start launched worlds share (tests/system/test_launch.py,
test_collectives_processes.py): an environment free of the caller's launcher and aionet
variables, and the ``mpirun`` command line for a world on this host."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without AIONET_* and launcher variables, with the repository
    on PYTHONPATH, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIONET_", "OMPI_", "PMI_", "SLURM_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def mpirun_cmd(n: int, *exported: str) -> list[str]:
    """``mpirun`` for ``n`` ranks on this host, passing PYTHONPATH and ``exported`` variables on."""
    cmd = ["mpirun", "--oversubscribe", "-n", str(n), "-x", "PYTHONPATH"]
    for var in exported:
        cmd += ["-x", var]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    return cmd
