"""Every collective between 4 separate processes, as users launch them (`aionet launch`,
`mpirun`): #wrong must be 0 for every allreduce algorithm, into a new array, a separate
``out=`` and in place, up to 16 MiB (tests/collectives_sweep_app.py). In-process tests missed
an in-place race that only separate processes' timing showed. Also checks that a world filling
this host's cores runs whole ring chunks under both launchers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aionet.launch.local import free_port_block

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "tests" / "collectives_sweep_app.py")
N = 4

pytestmark = pytest.mark.timeout(240)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIONET_", "OMPI_", "PMI_", "SLURM_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def _check(stdout: str) -> None:
    ranks = [json.loads(m) for m in re.findall(r'\{"rank": .*?"bad": \[.*?\]\}', stdout)]
    assert sorted(r["rank"] for r in ranks) == list(range(N)), stdout[-3000:]
    assert [r["bad"] for r in ranks] == [[]] * N
    # 4 ranks on one host: whole chunks where they fill its cores, the default where they do not
    want = 1 if (os.cpu_count() or 1) <= N else 2
    assert {r["pipeline_segments"] for r in ranks} == {want}


def test_every_collective_is_exact_between_processes_under_aionet_launch() -> None:
    cmd = [sys.executable, "-m", "aionet", "launch", "-n", str(N), "--", sys.executable, APP]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=200, env=_env())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    _check(out.stdout)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed (apt: openmpi-bin)")
def test_every_collective_is_exact_between_processes_under_mpirun() -> None:
    env = _env(AIONET_LAUNCH_PORT=str(free_port_block(N)))
    cmd = ["mpirun", "--oversubscribe", "-n", str(N), "-x", "PYTHONPATH", "-x", "AIONET_LAUNCH_PORT"]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    out = subprocess.run([*cmd, sys.executable, APP], capture_output=True, text=True, timeout=200, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    _check(out.stdout)
