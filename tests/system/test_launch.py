"""Launched worlds as users start them: `aionet launch`, mpirun, torchrun and SLURM/torchrun-style
environments set by the test. Each must give 4 nodes forming one cluster with ranks 0-3 whose
default group is the world in rank order (tests/launch_app.py checks it with an allreduce)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from aionet.launch.local import free_port_block
from tests.launched import ROOT, clean_env, mpirun_cmd

APP = str(ROOT / "tests" / "launch_app.py")
N = 4


_env = clean_env


def _check_world(stdout: str) -> None:
    # ranks share one stdout under mpirun/torchrun: lines may interleave, so find each JSON object
    lines = [json.loads(m) for m in re.findall(r'\{"name": .*?"pid": \d+\}', stdout)]
    assert sorted(r["rank"] for r in lines) == list(range(N)), stdout
    names = [f"rank-{r}" for r in range(N)]
    for r in lines:
        assert r["world"] == N and r["group"] == names and r["group_rank"] == r["rank"]
        assert r["total"] == sum(range(1, N + 1)) and r["alive"] == names


def test_aionet_launch_forms_one_world_with_rank_prefixed_output() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "aionet", "launch", "-n", str(N), "--", sys.executable, APP],
        capture_output=True, text=True, timeout=90, env=_env(),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    _check_world(out.stdout)
    assert all(line.startswith("[rank ") for line in out.stdout.splitlines() if line)


def test_aionet_launch_fails_fast_with_the_failed_ranks_code_and_stops_the_rest() -> None:
    # rank 2 fails at once; the others would wait forever: the launcher must stop them
    code = "import os, sys, time\nif os.environ['AIONET_NODE_RANK'] == '2': sys.exit(3)\ntime.sleep(600)"
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "aionet", "launch", "-n", str(N), "--grace", "2", "--", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, env=_env(),
    )  # fmt: skip
    assert out.returncode == 3, out.stderr
    assert "rank 2 exited with exit code 3" in out.stderr
    assert time.monotonic() - t0 < 20


def test_aionet_launch_forwards_sigterm_and_exits_with_the_ranks_codes() -> None:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('got TERM', flush=True), sys.exit(0)))\n"
        "print('up', flush=True)\n"
        "time.sleep(600)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "aionet", "launch", "-n", "2", "--", sys.executable, "-c", code],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        ups = [proc.stdout.readline() for _ in range(2)]
        assert all("up" in line for line in ups), ups
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert rest.count("got TERM") == 2


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed (apt: openmpi-bin)")
def test_mpirun_open_mpi_forms_one_world() -> None:
    base = free_port_block(N)
    env = _env(AIONET_LAUNCH_PORT=str(base))
    cmd = mpirun_cmd(N, "AIONET_LAUNCH_PORT")
    out = subprocess.run([*cmd, sys.executable, APP], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    _check_world(out.stdout)


def _run_ranks(envs: list[dict[str, str]]) -> str:
    procs = [
        subprocess.Popen([sys.executable, APP], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
        for e in envs
    ]
    outs = []
    try:
        for p in procs:
            o, err = p.communicate(timeout=90)
            assert p.returncode == 0, err[-3000:]
            outs.append(o)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return "".join(outs)


def test_srun_style_environment_forms_one_world() -> None:
    base = free_port_block(N)
    envs = [
        _env(
            SLURM_PROCID=str(r),
            SLURM_NTASKS=str(N),
            SLURM_STEP_ID="0",
            SLURM_LOCALID=str(r),
            SLURM_NODEID="0",
            SLURM_STEP_NODELIST="localhost",
            SLURM_STEP_TASKS_PER_NODE=str(N),
            AIONET_LAUNCH_PORT=str(base),
        )
        for r in range(N)
    ]
    _check_world(_run_ranks(envs))


def test_torchrun_style_environment_forms_one_world() -> None:
    master = free_port_block(N + 1)
    envs = [
        _env(
            RANK=str(r),
            WORLD_SIZE=str(N),
            LOCAL_RANK=str(r),
            LOCAL_WORLD_SIZE=str(N),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(master),
        )
        for r in range(N)
    ]
    _check_world(_run_ranks(envs))


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not installed (pip install torch==2.13.0)")
def test_real_torchrun_standalone_forms_one_world() -> None:
    out = subprocess.run(
        ["torchrun", "--standalone", f"--nproc-per-node={N}", APP],
        capture_output=True, text=True, timeout=150, env=_env(),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    _check_world(out.stdout)


def test_aionet_serve_under_aionet_launch_knows_its_rank_and_leaves_on_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "aionet", "launch", "-n", "2", "--", sys.executable, "-m", "aionet", "serve",
         "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        ready = [json.loads(proc.stdout.readline().split("ready ", 1)[1]) for _ in range(2)]
        assert sorted((r["rank"], r["world_size"], r["name"]) for r in ready) == [(0, 2, "rank-0"), (1, 2, "rank-1")]
        proc.send_signal(signal.SIGTERM)  # forwarded: both drain and leave
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
