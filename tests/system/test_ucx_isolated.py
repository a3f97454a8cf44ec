"""Run tests/system/test_ucx.py in a fresh process (see the note there on ucxx's per-process context)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("ucxx", reason="ucx: ucxx is not installed (pip install 'aionet[ucx]')")


@pytest.mark.timeout(300)
def test_ucx_specifics_in_a_fresh_process():
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join(here, "test_ucx.py")],
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, "AIONET_UCX_ISOLATED": "1"},
        cwd=os.path.dirname(os.path.dirname(here)),
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in out.stdout
