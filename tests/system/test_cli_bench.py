"""``aionet bench``: real node processes, nccl-tests columns, #wrong checked, JSON for machines."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from aionet.cli.bench import parse_size, sizes_between


def run(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aionet", "bench", *args], capture_output=True, text=True, timeout=timeout
    )


def test_sizes() -> None:
    assert [parse_size(s) for s in ("8", "64K", "1M", "1MiB", "2G")] == [8, 65536, 1 << 20, 1 << 20, 2 << 30]
    assert sizes_between(8, 1 << 20, 8) == [8, 64, 512, 4096, 32768, 262144]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("op,nodes", [("allreduce", 3), ("allgather", 2), ("reduce_scatter", 2), ("broadcast", 2)])
def test_bench_json_rows_are_correct(op: str, nodes: int) -> None:
    out = run(
        op,
        "--nodes",
        str(nodes),
        "--min",
        "64",
        "--max",
        "256K",
        "--factor",
        "64",
        "--iters",
        "3",
        "--warmup",
        "1",
        "--json",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["size"] for r in rows] == [64, 4096, 262144]
    n = nodes
    bus = {"allreduce": 2 * (n - 1) / n, "allgather": (n - 1) / n, "reduce_scatter": (n - 1) / n}.get(op, 1.0)
    for r in rows:
        variants = ("out", "in") if op == "allreduce" else ("out",)
        for v in variants:
            assert r[v]["wrong"] == 0 and r[v]["time_us"] > 0
            # algbw is size / time; busbw scales it by what each rank's link carries (nccl-tests)
            assert r[v]["algbw"] == pytest.approx(r["size"] / (r[v]["time_us"] * 1e-6) / 1e9, rel=1e-6)
            assert r[v]["busbw"] == pytest.approx(r[v]["algbw"] * bus, rel=1e-9)
        assert r["op"] == op and r["nodes"] == nodes
    assert "never retrieved" not in out.stderr and "Traceback" not in out.stderr


@pytest.mark.timeout(60)
def test_bench_table_and_bad_arguments() -> None:
    out = run("allreduce", "--min", "8", "--max", "64", "--factor", "8", "--iters", "2", "--warmup", "0")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "#wrong" in out.stdout and "busbw" in out.stdout and "allreduce: 2 nodes" in out.stdout
    bad = run("allreduce", "--nodes", "1")
    assert bad.returncode != 0 and "--nodes >= 2" in bad.stderr
    bad = run("allreduce", "--max", "lots")
    assert bad.returncode != 0 and "not a size" in bad.stderr


@pytest.mark.timeout(150)
def test_bench_p2p_json_and_plot(tmp_path) -> None:
    png = tmp_path / "p2p.png"
    out = run("p2p", "--min", "64", "--max", "64K", "--factor", "32", "--iters", "5", "--json", "--plot", str(png),
              timeout=140)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["size"] for r in rows] == [64, 2048, 65536]
    for r in rows:
        assert r["bench"] == "p2p" and 0 < r["rtt_p50_us"] <= r["rtt_p99_us"] and r["msgs_per_s"] > 0
        assert r["gbytes_per_s"] == pytest.approx(r["msgs_per_s"] * r["size"] / 1e9)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(150)
def test_bench_tasks_reports_throughput_latency_and_a_map() -> None:
    out = run("tasks", "--nodes", "2", "--tasks", "300", "--json", timeout=140)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["unit"] for r in rows] == ["tasks/s", "us", "s"] and all(r["value"] > 0 for r in rows)
    assert rows[2]["value"] >= 0.01  # 10 ms tasks cannot all finish faster than one of them


def test_bench_plot_is_refused_for_tasks() -> None:
    out = run("tasks", "--plot", "x.png")
    assert out.returncode != 0 and "--plot" in out.stderr


@pytest.mark.timeout(150)
def test_bench_connect_runs_on_the_members_of_a_running_cluster(spawn) -> None:
    _p0, r0 = spawn("--name", "s0", "--listen", "tcp://127.0.0.1:0")
    for name in ("s1", "s2"):
        spawn("--name", name, "--listen", "tcp://127.0.0.1:0", "--join", r0["addresses"][0])
    out = run("allreduce", "--connect", r0["addresses"][0], "--nodes", "0", "--min", "64", "--max", "64K",
              "--factor", "32", "--iters", "3", "--warmup", "1", "--json", timeout=140)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["size"] for r in rows] == [64, 2048, 65536]
    assert all(r["members"] == ["s0", "s1", "s2"] and r["nodes"] == 3 for r in rows)
    assert all(r[v]["wrong"] == 0 and r[v]["busbw"] > 0 for r in rows for v in ("out", "in"))
    too_many = run("broadcast", "--connect", r0["addresses"][0], "--nodes", "5", timeout=60)
    assert too_many.returncode != 0 and "need 5 alive members" in too_many.stderr


def _cuda() -> bool:
    from aionet.devices import Devices

    return Devices(use_nvml=False).cuda_available()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("op", ["allreduce", "p2p"])
def test_bench_device_gpu_runs_on_cupy_buffers_or_says_why_not(op: str) -> None:
    """With a GPU: CuPy buffers go through the staging path and every element is right; without
    one: the command fails before starting any process and names what is missing."""
    out = run(op, "--device", "gpu", "--min", "4K", "--max", "1M", "--factor", "256", "--iters", "3", "--json",
              timeout=140)  # fmt: skip
    if not _cuda():
        assert out.returncode != 0 and "--device gpu needs CuPy and a CUDA device" in out.stderr
        return
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["size"] for r in rows] == [4096, 1 << 20] and all(r["device"] == "gpu" for r in rows)
    if op == "allreduce":
        assert all(r["out"]["wrong"] == 0 and "in" not in r for r in rows)  # no in-place on device buffers
    else:
        assert all(r["gbytes_per_s"] > 0 for r in rows)
    assert "never retrieved" not in out.stderr and "Traceback" not in out.stderr


def test_bench_device_gpu_is_refused_for_tasks() -> None:
    out = run("tasks", "--device", "gpu")
    assert out.returncode != 0 and "p2p and the collectives" in out.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "args,child",
    [
        (["p2p", "--min", "64", "--max", "1M", "--factor", "16384", "--iters", "20000"], "bench_p2p"),
        (["allreduce", "--nodes", "3", "--min", "64", "--max", "64M", "--factor", "1024", "--iters", "2000"], "bench"),
    ],
    ids=["p2p", "allreduce"],
)
def test_a_bench_process_killed_mid_run_ends_the_run_with_one_clear_line(args: list[str], child: str) -> None:
    """No traceback and no hang: the run stops within seconds and names the process that died."""
    import psutil

    bench = subprocess.Popen(
        [sys.executable, "-m", "aionet", "bench", *args, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert bench.stdout is not None
        first = bench.stdout.readline()  # the first size is done: the run is under way
        assert first.startswith("{"), first + bench.stderr.read()[-3000:] if bench.stderr else ""
        victims = [
            c for c in psutil.Process(bench.pid).children() if any(f"aionet.cli.{child}" == a for a in c.cmdline())
        ]
        assert victims, [c.cmdline() for c in psutil.Process(bench.pid).children()]
        victims[-1].kill()  # the last rank: the ones before it then fail too, and must not be blamed
        _out, err = bench.communicate(timeout=30)
    finally:
        if bench.poll() is None:
            for c in psutil.Process(bench.pid).children(recursive=True):
                c.kill()
            bench.kill()
            bench.wait()
    assert bench.returncode == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert f"(pid {victims[-1].pid}) was killed by SIGKILL mid-run" in err, err[-3000:]
