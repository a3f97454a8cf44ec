"""The shipped examples run (they are what users copy first)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("extra", [[], ["--simulate"]], ids=["numpy", "simulated-device"])
def test_gpu_pingpong_runs_and_arrays_arrive_equal(extra):
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "gpu_pingpong.py"), "--mib", "8", "--chunk-mib", "1",
         "--rounds", "2", *extra],
        capture_output=True, text=True, timeout=100, cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rounds = [line for line in out.stdout.splitlines() if line.startswith("round ")]
    assert len(rounds) == 2 and all("equal=True" in r for r in rounds), out.stdout[-2000:]
    if extra:
        assert "'sent_staged': 2" in out.stdout
