"""The suite's loop-error guard (tests/conftest.py) fails a test during which asyncio reported
an error nobody handled: a never-retrieved task failure, a failing callback. Proven on a tiny
test file run by a separate pytest process that loads the same conftest."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

PROBE = textwrap.dedent(
    """
    import asyncio

    import pytest


    async def _boom() -> None:
        raise RuntimeError("stray-boom")


    async def test_unretrieved_task_fails():
        t = asyncio.get_running_loop().create_task(_boom())
        await asyncio.sleep(0.01)
        del t


    def test_failing_callback_fails():
        async def main() -> None:
            asyncio.get_running_loop().call_soon(lambda: 1 / 0)
            await asyncio.sleep(0.01)

        asyncio.run(main())


    async def test_retrieved_failure_passes():
        t = asyncio.get_running_loop().create_task(_boom())
        with pytest.raises(RuntimeError):
            await t


    @pytest.mark.allow_loop_errors
    async def test_opted_out_passes():
        t = asyncio.get_running_loop().create_task(_boom())
        await asyncio.sleep(0.01)
        del t
    """
)


@pytest.mark.timeout(120)
def test_guard_fails_tests_that_leave_loop_errors(tmp_path):
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (tmp_path / "test_probe.py").write_text(PROBE)
    repo = os.path.dirname(os.path.dirname(HERE))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "asyncio_mode=auto",
            "--rootdir",
            str(tmp_path),
            "-rA",
            str(tmp_path / "test_probe.py"),
        ],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
        cwd=tmp_path,
    )
    text = out.stdout + out.stderr
    assert "ERROR test_probe.py::test_unretrieved_task_fails" in text, text[-4000:]
    assert "Task exception was never retrieved" in text and "stray-boom" in text, text[-4000:]
    assert "ERROR test_probe.py::test_failing_callback_fails" in text, text[-4000:]
    assert "ZeroDivisionError" in text, text[-4000:]
    assert "PASSED test_probe.py::test_retrieved_failure_passes" in text, text[-4000:]
    assert "PASSED test_probe.py::test_opted_out_passes" in text, text[-4000:]
    assert "4 passed, 2 errors" in text, text[-4000:]
