"""Every collective between 4 separate processes, as users launch them (`aionet launch`,
`mpirun`): #wrong must be 0 for every allreduce algorithm, into a new array, a separate
``out=`` and in place, up to 16 MiB (tests/collectives_sweep_app.py). In-process tests missed
an in-place race that only separate processes' timing showed. Also checks that a world filling
this host's cores runs whole ring chunks, and one outnumbering them no busy polling, under both
launchers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from aionet.launch.local import free_port_block
from tests.launched import ROOT, clean_env, mpirun_cmd

APP = str(ROOT / "tests" / "collectives_sweep_app.py")
N = 4

pytestmark = pytest.mark.timeout(240)


def _check(stdout: str) -> None:
    ranks = [json.loads(m) for m in re.findall(r'\{"rank": .*?"bad": \[.*?\]\}', stdout)]
    assert sorted(r["rank"] for r in ranks) == list(range(N)), stdout[-3000:]
    assert [r["bad"] for r in ranks] == [[]] * N
    # 4 ranks on one host: whole chunks where they fill its cores, the default where they do not;
    # no busy polling where they outnumber the cores
    cores = os.cpu_count() or 1
    assert {r["pipeline_segments"] for r in ranks} == {1 if cores <= N else 2}
    assert {r["busy_poll_us"] for r in ranks} == {0 if cores < N else 200}


def test_every_collective_is_exact_between_processes_under_aionet_launch() -> None:
    cmd = [sys.executable, "-m", "aionet", "launch", "-n", str(N), "--", sys.executable, APP]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=200, env=clean_env())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    _check(out.stdout)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed (apt: openmpi-bin)")
def test_every_collective_is_exact_between_processes_under_mpirun() -> None:
    env = clean_env(AIONET_LAUNCH_PORT=str(free_port_block(N)))
    out = subprocess.run(
        [*mpirun_cmd(N, "AIONET_LAUNCH_PORT"), sys.executable, APP],
        capture_output=True,
        text=True,
        timeout=200,
        env=env,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    _check(out.stdout)
