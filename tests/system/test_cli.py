"""The command line as a user runs it: real processes, real signals."""

import json
import os
import signal
import subprocess
import sys

import pytest


def _aionet(*args, timeout=60, **kw):
    return subprocess.run(
        [sys.executable, "-m", "aionet", *args], capture_output=True, text=True, timeout=timeout, **kw
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_shuts_down_cleanly_on_signal(spawn, sig):
    proc, ready = spawn("--name", "s1", "--listen", "tcp://127.0.0.1:0")
    assert ready["name"] == "s1" and ready["addresses"][0].startswith("tcp://127.0.0.1:")
    os.kill(proc.pid, sig)
    assert proc.wait(timeout=30) == 0


@pytest.mark.timeout(60)
def test_serve_stops_at_once_on_a_signal_while_its_seeds_are_down():
    """A signal while the node still waits for its seeds (up to node.join_timeout) ends that
    wait and exits cleanly, instead of retrying the seeds for the whole join timeout."""
    import time

    from tests.observe_util import free_port

    seed = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "aionet", "serve", "--name", "lone", "--listen", "tcp://127.0.0.1:0"),
            *("--join", seed, "--log-level", "info"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "AIONET_NODE_JOIN_TIMEOUT": "120"},
    )
    try:
        while "listening" not in (line := proc.stderr.readline()):
            assert line, "serve exited before listening"
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stderr.read()[-2000:]
        assert time.monotonic() - t0 < 10
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


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
    for stray in ("Traceback", "never retrieved", "Exception in callback"):  # issue 11: no stray tracebacks
        assert stray not in out.stdout + out.stderr, out.stderr[-3000:]


# --- issue 11: clients that do not join, the demo, --app, a second Ctrl-C -------------------
def test_status_and_info_with_a_config_do_not_join(spawn, tmp_path):
    """`aionet status -c node.toml` / `info -c` connect as clients: the config's seeds are only
    where to connect, and the node's members() never lists them (not even as "left")."""
    _proc, ready = spawn("--name", "s-st", "--listen", "tcp://127.0.0.1:0")
    addr = ready["addresses"][0]
    cfg = tmp_path / "node.toml"
    cfg.write_text(f'[node]\nname = "would-be-member"\njoin = ["{addr}"]\n')
    out = _aionet("status", "-c", str(cfg), "--json")  # no --connect: the config's seeds
    assert out.returncode == 0, out.stderr
    out = _aionet("status", "--connect", addr, "-c", str(cfg), "--json")
    assert out.returncode == 0, out.stderr
    out = _aionet("info", "-c", str(cfg))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["name"] == "s-st"
    out = _aionet("status", "--connect", addr, "--json")
    assert out.returncode == 0, out.stderr
    assert set(json.loads(out.stdout)["members"]) == {"s-st"}


def test_status_without_connect_or_seeds_says_what_to_give():
    out = _aionet("status", "--json")
    assert out.returncode != 0 and "--connect" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("transport", ["inproc", "nosuch", "rdma"])
def test_demo_unavailable_transport_is_one_clear_line(transport, tmp_path):
    if transport == "rdma":
        from aionet.errors import TransportUnavailable
        from aionet.transports.rdma import RDMATransport

        try:
            RDMATransport.check_available()
            pytest.skip("an RDMA device is present here")
        except TransportUnavailable:
            pass
    out = _aionet("demo", "--transport", transport, cwd=tmp_path, timeout=60)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert f"{transport}://" in out.stderr
    assert os.listdir(tmp_path) == []


def _small_demo(*args):
    return ["demo", "--size-mb", "1", "--messages", "500", "--requests", "50", *args]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["zmq+ipc", "tls"])
def test_demo_runs_over_transport_and_leaves_no_files(transport, tmp_path):
    import shutil
    import tempfile

    work = tmp_path / "work"
    work.mkdir()
    # TMPDIR short, in /tmp: an ipc socket path is capped at 107 bytes, and pytest's own temp
    # paths (longer still under xdist) would leave too little room for the demo's socket names
    tmp = tempfile.mkdtemp(prefix="aio-", dir="/tmp")
    try:
        out = _aionet(*_small_demo("--transport", transport), cwd=work, env={**os.environ, "TMPDIR": tmp}, timeout=110)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert "intact=True" in out.stdout and "shut down cleanly: True" in out.stdout
        assert os.listdir(work) == [] and os.listdir(tmp) == []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGKILL])
def test_demo_stopped_by_signal_stops_its_nodes(sig, tmp_path):
    """The demo stops its node processes on SIGTERM/SIGHUP/SIGINT; even when it is killed
    outright, its nodes are told to stop (Linux parent-death signal)."""
    import psutil

    demo = subprocess.Popen(
        [sys.executable, "-m", "aionet", *_small_demo("--messages", "100000000")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    children: list[psutil.Process] = []
    try:
        for line in demo.stdout:
            if "nodes up" in line:
                break
        else:
            pytest.fail(f"demo did not start its nodes: {demo.stderr.read()[-2000:]}")
        children = psutil.Process(demo.pid).children()
        assert len(children) == 3, children
        os.kill(demo.pid, sig)
        assert demo.wait(timeout=60) == (-sig if sig == signal.SIGKILL else 128 + sig)
        _gone, alive = psutil.wait_procs(children, timeout=20)
        assert not alive, f"nodes left running: {alive}"
    finally:
        for c in children:
            if c.is_running() and c.status() != psutil.STATUS_ZOMBIE:
                c.kill()
        if demo.poll() is None:
            demo.kill()
        demo.wait(timeout=10)


_SLOW_APP = """
import asyncio


def setup(node):
    @node.service("nap")
    async def nap(_arg):
        print("napping", flush=True)
        await asyncio.sleep(60)
"""


def _cli_outside_cwd(tmp_path):
    """Run the CLI as the `aionet` console script does: sys.path[0] is the script's directory,
    not the working directory (``python -m aionet`` would add the working directory itself)."""
    launcher = tmp_path / "bin" / "aionet_cli.py"
    launcher.parent.mkdir()
    launcher.write_text("from aionet.cli import main\nmain()\n")
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "slowapp.py").write_text(_SLOW_APP)
    return [sys.executable, str(launcher)], app_dir


def test_app_imports_from_the_working_directory_and_missing_module_names_where_it_looked(tmp_path):
    cli, app_dir = _cli_outside_cwd(tmp_path)
    out = subprocess.run(
        [*cli, "serve", "--app", "nosuchmod:setup"], cwd=app_dir, capture_output=True, text=True, timeout=60
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "nosuchmod" in out.stderr and str(app_dir) in out.stderr and "PYTHONPATH" in out.stderr
    proc = subprocess.Popen(
        [*cli, "serve", "--listen", "tcp://127.0.0.1:0", "--app", "slowapp:setup"],
        cwd=app_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("ready "), proc.stderr.read() if proc.poll() is not None else line
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_second_sigint_skips_the_shutdown_grace(tmp_path):
    """A request is in flight, so the first SIGINT waits up to the 5 s grace for it; a second
    SIGINT exits at once (code 130)."""
    import asyncio
    import time

    import aionet

    cli, app_dir = _cli_outside_cwd(tmp_path)
    proc = subprocess.Popen(
        [
            *cli,
            "serve",
            "--name",
            "slow",
            "--listen",
            "tcp://127.0.0.1:0",
            "--app",
            "slowapp:setup",
            "--log-level",
            "info",
        ],
        cwd=app_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    async def main() -> float:
        loop = asyncio.get_running_loop()
        line = await loop.run_in_executor(None, proc.stdout.readline)
        assert line.startswith("ready "), line
        async with aionet.Node(name="caller", listen="tcp://127.0.0.1:0") as me:
            await me.connect(json.loads(line[6:])["addresses"][0])
            req = asyncio.ensure_future(me.request("slow", "nap", None))
            try:
                assert (await loop.run_in_executor(None, proc.stdout.readline)).strip() == "napping"
                os.kill(proc.pid, signal.SIGINT)
                while "shutting down" not in await loop.run_in_executor(None, proc.stderr.readline):
                    pass
                await asyncio.sleep(0.3)  # later than a duplicate delivery of the same Ctrl-C
                t0 = time.monotonic()
                os.kill(proc.pid, signal.SIGINT)
                code = await loop.run_in_executor(None, proc.wait, 30)
                assert code == 130
                return time.monotonic() - t0
            finally:
                req.cancel()
                await asyncio.gather(req, return_exceptions=True)

    try:
        assert aionet.run(main()) < 2.5  # the grace alone is 5 s
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_serve_json_logs_go_to_stderr():
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aionet",
            "serve",
            "--listen",
            "tcp://127.0.0.1:0",
            "--log-level",
            "info",
            "--json-logs",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().startswith("ready ")
        os.kill(p.pid, signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)
    assert out == ""
    events = [json.loads(line) for line in err.splitlines()]
    assert any(e["event"] == "listening" and e["level"] == "info" and e["logger"] == "aionet.node" for e in events)


SUBCOMMANDS = ("bench", "demo", "info", "keys", "launch", "serve", "status", "trace")

_HEAVY_PROBE = r"""
import json, sys
import aionet.cli
heavy = lambda: sorted(m for m in sys.modules if m in ("aionet.node", "numpy", "zmq")
                       or m.startswith(("aionet.transports", "aionet.membership", "aionet.scheduler")))
loaded = {"import": heavy()}
try:
    aionet.cli.main(["--help"])
except SystemExit:
    pass
loaded["help"] = heavy()
sys.stderr.write(json.dumps(loaded))
"""


def test_importing_the_cli_and_its_help_load_no_node_or_transports():
    """Subcommands load lazily and import the Node only when they run: `aionet --help` stays fast."""
    out = subprocess.run([sys.executable, "-c", _HEAVY_PROBE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stderr) == {"import": [], "help": []}


def test_help_lists_every_subcommand_from_module_and_console_script():
    import re
    from pathlib import Path

    runs = [_aionet("--help")]
    script = Path(sys.executable).with_name("aionet")  # the console script `aionet = "aionet.cli:main"`
    if script.exists():
        runs.append(subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60))
    for out in runs:
        assert out.returncode == 0, out.stderr
        listed = re.findall(r"^  (\w+)\s", out.stdout.split("Commands:")[1], re.M)
        assert listed == list(SUBCOMMANDS), out.stdout
    version = _aionet("--version")
    assert version.returncode == 0 and version.stdout.startswith("aionet, version "), version.stderr


def test_unknown_subcommand_is_a_usage_error():
    out = _aionet("serv")
    assert out.returncode == 2 and "No such command 'serv'" in out.stderr
