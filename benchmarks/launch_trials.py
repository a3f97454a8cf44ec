"""How reliably a launched world forms: N trials per launcher, each 4 ranks that must join one
cluster with ranks 0..3, agree on the world group and allreduce over it (tests/launch_app.py).

    python3 benchmarks/launch_trials.py --trials 20 [--ranks 4] [--json out.json]

Launchers: `aionet launch`, `mpirun` (Open MPI, when installed), real `torchrun --standalone`
(when torch is installed), and srun-style / torchrun-style environments set by this script.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from aionet.launch.local import free_port_block

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "tests" / "launch_app.py")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIONET_", "OMPI_", "PMI_", "SLURM_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def _ok(stdout: str, n: int) -> bool:
    found = [json.loads(m) for m in re.findall(r'\{"name": .*?"pid": \d+\}', stdout)]
    names = [f"rank-{r}" for r in range(n)]
    return sorted(r["rank"] for r in found) == list(range(n)) and all(
        r["group"] == names and r["alive"] == names and r["total"] == n * (n + 1) // 2 for r in found
    )


def _ranks(envs: list[dict[str, str]]) -> str:
    procs = [subprocess.Popen([sys.executable, APP], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=e,
                              text=True) for e in envs]  # fmt: skip
    out = ""
    for p in procs:
        try:
            out += p.communicate(timeout=120)[0]
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
    return out


def trial(kind: str, n: int, failures: list[str]) -> bool:
    """One trial; a failed one's output is appended to ``failures``."""
    ok, out = _trial(kind, n)
    if not ok:
        failures.append(f"--- {kind}\n{out[-4000:]}")
    return ok


def _trial(kind: str, n: int) -> tuple[bool, str]:
    if kind == "aionet launch":
        cmd = [sys.executable, "-m", "aionet", "launch", "-n", str(n), "--", sys.executable, APP]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_env())
        return r.returncode == 0 and _ok(r.stdout, n), r.stdout + r.stderr
    if kind == "mpirun":
        base = free_port_block(n)
        cmd = ["mpirun", "--oversubscribe", "-n", str(n), "-x", "PYTHONPATH", "-x", "AIONET_LAUNCH_PORT"]
        if os.geteuid() == 0:
            cmd.insert(1, "--allow-run-as-root")
        r = subprocess.run([*cmd, sys.executable, APP], capture_output=True, text=True, timeout=120,
                           env=_env(AIONET_LAUNCH_PORT=str(base)))  # fmt: skip
        return r.returncode == 0 and _ok(r.stdout, n), r.stdout + r.stderr
    if kind == "torchrun":
        cmd = ["torchrun", "--standalone", f"--nproc-per-node={n}", APP]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=_env())
        return r.returncode == 0 and _ok(r.stdout, n), r.stdout + r.stderr
    if kind == "srun-style env":
        base = free_port_block(n)
        out = _ranks([_env(SLURM_PROCID=str(r), SLURM_NTASKS=str(n), SLURM_STEP_ID="0", SLURM_LOCALID=str(r),
                                SLURM_NODEID="0", SLURM_STEP_NODELIST="localhost", AIONET_LAUNCH_PORT=str(base))
                           for r in range(n)])  # fmt: skip
        return _ok(out, n), out
    if kind == "torchrun-style env":
        master = free_port_block(n + 1)
        out = _ranks([_env(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master)) for r in range(n)])  # fmt: skip
        return _ok(out, n), out
    raise ValueError(kind)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    kinds = ["aionet launch", "srun-style env", "torchrun-style env"]
    if shutil.which("mpirun"):
        kinds.insert(1, "mpirun")
    if shutil.which("torchrun"):
        kinds.append("torchrun")
    results: dict[str, dict[str, float]] = {}
    failures: list[str] = []
    with Progress() as progress:
        bar = progress.add_task("trials", total=len(kinds) * args.trials)
        for kind in kinds:
            ok, times = 0, []
            for _ in range(args.trials):
                t0 = time.monotonic()
                ok += trial(kind, args.ranks, failures)
                times.append(time.monotonic() - t0)
                progress.advance(bar)
            results[kind] = {"ok": ok, "trials": args.trials, "median_s": statistics.median(times),
                             "max_s": max(times)}  # fmt: skip
    table = Table(title=f"{args.ranks} ranks form one world (ranks 0..{args.ranks - 1}, group + allreduce)")
    for col in ("launcher", "ok / trials", "median s", "max s"):
        table.add_column(col)
    for kind, r in results.items():
        table.add_row(kind, f"{r['ok']} / {r['trials']}", f"{r['median_s']:.2f}", f"{r['max_s']:.2f}")
    Console().print(table)
    for f in failures:
        print(f, file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
