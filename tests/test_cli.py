"""The command line as a user runs it: real processes, real signals."""

import json
import os
import signal
import subprocess
import sys

import pytest


def _aionet(*args, timeout=60, **kw):
    return subprocess.run([sys.executable, "-m", "aionet", *args], capture_output=True, text=True,
                          timeout=timeout, **kw)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_shuts_down_cleanly_on_signal(spawn, sig):
    proc, ready = spawn("--name", "s1", "--listen", "tcp://127.0.0.1:0")
    assert ready["name"] == "s1" and ready["addresses"][0].startswith("tcp://127.0.0.1:")
    os.kill(proc.pid, sig)
    assert proc.wait(timeout=30) == 0


def test_info_prints_node_info(spawn):
    proc, ready = spawn("--name", "s2", "--listen", "tcp://127.0.0.1:0")
    out = _aionet("info", "--connect", ready["addresses"][0])
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["name"] == "s2" and info["pid"] == proc.pid


def test_serve_rejects_unknown_config_key(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[node]\nnmae = "x"\n')
    out = _aionet("serve", "--config", str(cfg))
    assert out.returncode != 0
    assert "node.nmae" in out.stderr and "did you mean 'name'" in out.stderr


def test_info_unreachable_is_a_clear_error():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    out = _aionet("info", "--connect", f"tcp://127.0.0.1:{port}", "--timeout", "2")
    assert out.returncode != 0 and "Error" in out.stderr


@pytest.mark.timeout(180)
def test_demo_runs_and_exits_zero():
    out = _aionet("demo", "--size-mb", "8", timeout=170)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "intact=True" in out.stdout and "shut down cleanly: True" in out.stdout
