"""The shipped examples run (they are what users copy first)."""

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("extra", [[], ["--simulate"]], ids=["numpy", "simulated-device"])
def test_gpu_pingpong_runs_and_arrays_arrive_equal(extra):
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "examples", "gpu_pingpong.py"),
            "--mib",
            "8",
            "--chunk-mib",
            "1",
            "--rounds",
            "2",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "never retrieved" not in out.stderr, out.stderr[-3000:]
    rounds = [line for line in out.stdout.splitlines() if line.startswith("round ")]
    assert len(rounds) == 2 and all("equal=True" in r for r in rounds), out.stdout[-2000:]
    if extra:
        assert "sent_staged=2," in out.stdout


# --- issue 11: the README's first snippet is quiet, shipped configs work and dial nowhere --------
def _readme_first_python_block() -> str:
    text = Path(ROOT, "README.md").read_text(encoding="utf-8")
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


@pytest.mark.timeout(60)
def test_readme_first_snippet_prints_only_its_own_output(tmp_path):
    """A library must not talk: no log lines on stdout, nothing on stderr at the defaults."""
    script = tmp_path / "snippet.py"
    script.write_text(_readme_first_python_block())
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIONET_")}
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=50, cwd=tmp_path, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "42\n[0 1 2 3 4 5 6 7 8 9]\n"
    assert out.stderr == ""


_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\[?([A-Za-z0-9_.:-]*[A-Za-z0-9_])\]?")


def _hosts_in(path: str) -> list[tuple[str, str]]:
    found = []
    for m in _URL.finditer(Path(path).read_text(encoding="utf-8")):
        host = m.group(1)
        if host.count(":") == 1:  # host:port
            host = host.split(":")[0]
        found.append((m.group(0), host))
    return found


def _shipped_text_files() -> list[str]:
    files = [os.path.join(ROOT, "README.md")]
    for top in ("examples", "docs"):
        for dirpath, _dirs, names in os.walk(os.path.join(ROOT, top)):
            files += [os.path.join(dirpath, n) for n in names if n.endswith((".md", ".py", ".toml", ".txt"))]
    return files


def test_examples_and_docs_name_no_real_looking_ip_address():
    """Following the docs must not make a program dial a host the user did not create: only
    loopback, the wildcard 0.0.0.0 and documentation names (``seed.example``) appear."""
    import ipaddress

    bad = []
    for path in _shipped_text_files():
        for url, host in _hosts_in(path):
            try:
                ip = ipaddress.ip_address(host)
            except ValueError:
                continue
            if not (ip.is_loopback or ip.is_unspecified):
                bad.append(f"{os.path.relpath(path, ROOT)}: {url}")
    assert not bad, "use a name such as seed.example or node-a.example instead:\n" + "\n".join(bad)


def test_example_configs_name_only_hosts_that_resolve_nowhere():
    allowed = ("localhost",)
    bad = []
    for path in glob.glob(os.path.join(ROOT, "examples", "configs", "*.toml")):
        for url, host in _hosts_in(path):
            if url.startswith(("inproc://", "zmq+ipc://")) or host in allowed or host.endswith(".example"):
                continue
            try:
                __import__("ipaddress").ip_address(host)
                continue  # addresses: the test above
            except ValueError:
                bad.append(f"{os.path.basename(path)}: {url}")
    assert not bad, bad


def test_shipped_tls_config_works_after_aionet_keys(tmp_path):
    """examples/configs/tls.toml as shipped: missing keys are named with the command that
    makes them; after `aionet keys keys/` next to it, a node starts from any working directory
    and `aionet status -c` reaches it through TLS with the token."""
    conf = tmp_path / "conf"
    conf.mkdir()
    shutil.copy(os.path.join(ROOT, "examples", "configs", "tls.toml"), conf / "tls.toml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIONET_")}
    env |= {"AIONET_NODE_LISTEN": "tls://127.0.0.1:0"}  # the file's 0.0.0.0:7700, made safe for a test

    def aionet_cmd(*args, **kw):
        return subprocess.run(
            [sys.executable, "-m", "aionet", *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=elsewhere,
            env=env,
            **kw,
        )

    out = aionet_cmd("serve", "-c", str(conf / "tls.toml"))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert str(conf / "keys" / "token") in out.stderr and "aionet keys" in out.stderr
    assert aionet_cmd("keys", str(conf / "keys")).returncode == 0
    node = subprocess.Popen(
        [sys.executable, "-m", "aionet", "serve", "-c", str(conf / "tls.toml")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=elsewhere,
        env=env,
    )
    try:
        line = node.stdout.readline()
        assert line.startswith("ready "), node.stderr.read() if node.poll() is not None else line
        addr = json.loads(line[6:])["addresses"][0]
        st = aionet_cmd("status", "-c", str(conf / "tls.toml"), "--connect", addr, "--json")
        assert st.returncode == 0, st.stderr
        assert set(json.loads(st.stdout)["members"]) == {"a"}
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=30) == 0
    finally:
        if node.poll() is None:
            node.kill()
        node.wait(timeout=10)


@pytest.mark.timeout(120)
def test_tasks_example_runs_without_stray_tracebacks():
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "tasks.py")],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    for stray in ("Traceback", "never retrieved", "Exception in callback"):
        assert stray not in out.stdout + out.stderr, out.stderr[-3000:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("extra", [[], ["--torch"]], ids=["numpy", "torch"])
def test_data_parallel_weights_equal_a_single_process_run(extra):
    if extra:
        pytest.importorskip("torch", reason="torch not installed (CI: pip install torch==2.13.0, CPU wheel)")
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "data_parallel.py"), "--ranks", "4", "--steps", "30", *extra],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "weights equal single-process run: True" in out.stdout, out.stdout
    assert "Traceback" not in out.stderr and "never retrieved" not in out.stderr, out.stderr[-3000:]
