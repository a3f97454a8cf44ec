"""Shared helpers for the benchmark scripts: timing, stats, child processes, tables, JSON.

Nothing here is imported by aionet itself; the scripts in this directory are run directly
(``python benchmarks/p2p.py``), so this module is imported as a sibling (``import _common``).

Child-process protocol: a child prints ``READY <json>`` on stdout once it is listening (the
JSON carries the address it really bound, port 0 resolved) and ``RESULT <json>`` when it has
measured something. Everything else a child writes goes to a log file whose tail is shown when
the child fails. The parent only ever kills the PIDs it started (see :class:`Child`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import datetime as _dt
import json
import math
import os
import platform
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

now = time.perf_counter
now_ns = time.perf_counter_ns


# --------------------------------------------------------------------------- event loop


def run_async(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` on uvloop when it is installed (the deployment default), else asyncio."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(coro)
    return uvloop.run(coro)


def loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:  # pragma: no cover
        return "asyncio"
    return "uvloop"


# --------------------------------------------------------------------------- stats


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100) of an already sorted sequence."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * (q / 100.0)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return float(sorted_values[lo] * (1.0 - frac) + sorted_values[hi] * frac)


def median(values: Iterable[float]) -> float:
    vals = sorted(v for v in values if v is not None and not math.isnan(v))
    return percentile(vals, 50.0) if vals else math.nan


def summarize(values: Iterable[float | None]) -> dict[str, Any]:
    """Median and min-max spread of the repeats of one measurement (Nones/NaNs dropped)."""
    vals = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return {"n": 0, "values": [], "median": None, "min": None, "max": None}
    return {
        "n": len(vals),
        "values": vals,
        "median": median(vals),
        "min": min(vals),
        "max": max(vals),
    }


def latency_stats_us(samples_ns: Sequence[int]) -> dict[str, float]:
    """p50/p90/p99/p99.9/mean/min/max in microseconds of per-operation nanosecond samples."""
    s = sorted(samples_ns)
    return {
        "count": len(s),
        "p50": percentile(s, 50) / 1e3,
        "p90": percentile(s, 90) / 1e3,
        "p99": percentile(s, 99) / 1e3,
        "p999": percentile(s, 99.9) / 1e3,
        "mean": (sum(s) / len(s)) / 1e3 if s else math.nan,
        "min": s[0] / 1e3 if s else math.nan,
        "max": s[-1] / 1e3 if s else math.nan,
    }


def fmt_num(value: float | None, digits: int = 3) -> str:
    """Compact human formatting: 3 significant digits, k/M suffixes for big numbers."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    v = float(value)
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.{max(digits - 1, 0)}f}M" if a < 1e7 else f"{v / 1e6:.1f}M"
    if a >= 1e4:
        return f"{v / 1e3:.0f}k"
    if a >= 1e3:
        return f"{v / 1e3:.1f}k"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def fmt_summary(summary: dict[str, Any] | None) -> str:
    """``median (min-max)`` for a :func:`summarize` result; just the value for one repeat."""
    if not summary or summary.get("median") is None:
        return "-"
    med = fmt_num(summary["median"])
    if summary["n"] <= 1:
        return med
    return f"{med} ({fmt_num(summary['min'])}-{fmt_num(summary['max'])})"


# --------------------------------------------------------------------------- memory


def rss_bytes() -> int:
    """Current resident set size of this process."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # pragma: no cover - non-Linux
        import psutil

        return psutil.Process().memory_info().rss


def reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark (Linux >= 4.0: write 5 to clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int | None:
    """The kernel's RSS high-water mark (VmHWM) of this process, or None if unavailable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover
        pass
    return None


class RSSSampler:
    """Samples this process's RSS in a background thread and keeps the maximum.

    Complements :func:`peak_rss_bytes` (exact, but not resettable on old kernels)."""

    def __init__(self, interval: float = 0.002):
        self.interval = interval
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            r = rss_bytes()
            if r > self.peak:
                self.peak = r
            self.samples += 1
            self._stop.wait(self.interval)

    def start(self) -> RSSSampler:
        self.peak = rss_bytes()
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=5)
        self.peak = max(self.peak, rss_bytes())
        return self.peak


class PeakTracker:
    """Peak RSS increase of this process over a window, two ways, reporting the larger:

    the kernel high-water mark (VmHWM, exact, after resetting it with clear_refs) and a
    sampling thread (works everywhere, may miss a spike shorter than its interval)."""

    def __init__(self, interval: float = 0.002):
        self.interval = interval
        self.base = 0
        self.hwm_exact = False
        self._sampler: RSSSampler | None = None

    def start(self) -> PeakTracker:
        self.base = rss_bytes()
        reset = reset_peak_rss()
        hwm0 = peak_rss_bytes()
        # VmHWM is usable if it was reset now, or if the process never exceeded today's RSS
        self.hwm_exact = hwm0 is not None and (reset or hwm0 <= self.base)
        self._sampler = RSSSampler(self.interval).start()
        return self

    def stop(self) -> dict[str, Any]:
        assert self._sampler is not None
        sampled = self._sampler.stop()
        hwm = peak_rss_bytes() if self.hwm_exact else None
        peak = max(sampled, hwm or 0)
        return {
            "base_rss": self.base,
            "peak_rss": peak,
            "peak_increase": peak - self.base,
            "peak_sampled": sampled,
            "peak_vmhwm": hwm,
            "samples": self._sampler.samples,
            "end_rss": rss_bytes(),
        }


# --------------------------------------------------------------------------- child processes

_CHILDREN: set[Child] = set()
_CLEANUP_INSTALLED = False


def _cleanup_children() -> None:
    for child in list(_CHILDREN):
        child.kill()


def install_cleanup() -> None:
    """Kill the children we started on normal exit, SIGTERM and Ctrl-C (only their PIDs)."""
    global _CLEANUP_INSTALLED
    if _CLEANUP_INSTALLED:
        return
    _CLEANUP_INSTALLED = True
    atexit.register(_cleanup_children)

    def _on_term(signum: int, _frame: Any) -> None:
        _cleanup_children()
        raise SystemExit(128 + signum)

    with contextlib.suppress(ValueError):  # not the main thread
        signal.signal(signal.SIGTERM, _on_term)


_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Unavailable|Interrupt|Exit|Timeout)\b.*")


class ChildError(RuntimeError):
    pass


class Child:
    """A benchmark child process speaking the READY/RESULT stdout protocol."""

    def __init__(self, argv: list[str], *, label: str, env: dict[str, str] | None = None):
        self.label = label
        self.argv = argv
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives as long as the child
            prefix=f"aionet-bench-{label}-", suffix=".log", delete=False
        )
        full_env = dict(os.environ)
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        if env:
            full_env.update(env)
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            env=full_env,
            cwd=str(REPO_DIR),
            text=True,
            bufsize=1,
        )
        self.pid = self.proc.pid
        _CHILDREN.add(self)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read_stdout, name=f"stdout-{label}", daemon=True)
        self._reader.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                self._lines.put(line.rstrip("\n"))
        except (OSError, ValueError):
            pass
        finally:
            self._lines.put(None)

    def log_tail(self, n: int = 15) -> str:
        try:
            self._log.flush()
            text = Path(self._log.name).read_text(errors="replace")
        except OSError:
            return ""
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return "\n".join(lines[-n:])

    def last_error_line(self) -> str:
        """The most telling line of the log: the last exception line, else the last line."""
        lines = [ln.strip() for ln in self.log_tail(80).splitlines() if not ln.startswith("[stdout]")]
        for s in reversed(lines):
            if _EXC_LINE.match(s):
                return s[:300]
        return lines[-1][:300] if lines else ""

    def expect(self, prefix: str, timeout: float) -> dict[str, Any]:
        """Wait for a ``PREFIX <json>`` line; raise ChildError on timeout or exit."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChildError(f"{self.label}: no {prefix} line within {timeout:.0f}s")
            try:
                line = self._lines.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(timeout=5)
                why = self.last_error_line() or f"exit code {self.proc.returncode}"
                raise ChildError(f"{self.label} exited before {prefix}: {why}")
            if line.startswith(prefix + " "):
                return json.loads(line[len(prefix) + 1 :])
            if line.strip():
                # unexpected stdout chatter: keep it visible in the log for debugging
                with contextlib.suppress(OSError):
                    self._log.write(f"[stdout] {line}\n".encode())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, grace: float = 2.0) -> None:
        """Terminate this child (by its own PID only), escalating to SIGKILL."""
        try:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        finally:
            _CHILDREN.discard(self)
            with contextlib.suppress(OSError):
                self._log.close()

    def remove_log(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self._log.name)

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def end_children(procs: Iterable[subprocess.Popen[Any]], timeout: float = 30.0) -> None:
    """End children that leave when their stdin closes: close every one's stdin, wait, and
    kill (by its own PID) one that is still there after ``timeout`` seconds."""
    procs = list(procs)
    for p in procs:
        if p.stdin is not None:
            with contextlib.suppress(OSError):
                p.stdin.close()
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def python_argv(script: Path | str, *args: str) -> list[str]:
    return [sys.executable, str(script), *args]


def emit(prefix: str, payload: dict[str, Any]) -> None:
    """Child side: print one protocol line and flush it."""
    sys.stdout.write(f"{prefix} {json.dumps(payload, default=_json_default)}\n")
    sys.stdout.flush()


def log(msg: str) -> None:
    """Child side: diagnostics to stderr (ends up in the child's log file)."""
    sys.stderr.write(f"[{os.getpid()}] {msg}\n")
    sys.stderr.flush()


def parent_watchdog(parent_pid: int, interval: float = 1.0) -> None:
    """Child side: exit if the parent disappears (so an orphan never keeps spinning)."""

    def _watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent_pid:
                os._exit(3)

    threading.Thread(target=_watch, name="parent-watchdog", daemon=True).start()


def hard_deadline(seconds: float) -> None:
    """Child side: a last-resort timer that ends the process if it overruns its budget."""

    def _fire() -> None:
        log(f"hard deadline of {seconds:.0f}s reached; exiting")
        os._exit(4)

    t = threading.Timer(seconds, _fire)
    t.daemon = True
    t.start()


# --------------------------------------------------------------------------- environment


def _pkg_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


def environment() -> dict[str, Any]:
    """Who/where/what ran: enough to know whether two JSON files are comparable."""
    git = None
    with contextlib.suppress(Exception):
        git = subprocess.run(
            ["git", "-C", str(REPO_DIR), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    load = None
    with contextlib.suppress(OSError):
        load = list(os.getloadavg())
    cpu_model = None
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {
        "time": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model,
        "loadavg": load,
        "git": git,
        "loop": loop_name(),
        "versions": {p: _pkg_version(p) for p in ("aionet", "uvloop", "pyzmq", "numpy", "msgpack", "distributed")},
    }


# --------------------------------------------------------------------------- output


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    return str(obj)


def write_json(path: Path | str, data: dict[str, Any]) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_json_default) + "\n")
    tmp.replace(p)
    return p


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    footer: str | None = None,
    plain: bool = False,
) -> None:
    """A table with rich when available (and not ``plain``), else aligned plain text."""
    if not plain:
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            plain = True
    if not plain:
        table = Table(title=title, title_justify="left", caption=footer, caption_justify="left")
        for i, col in enumerate(columns):
            table.add_column(col, justify="left" if i == 0 else "right", overflow="fold")
        for row in rows:
            table.add_row(*row)
        Console(width=max(150, _term_width())).print(table)
        return
    widths = [max(len(str(c)), *(len(str(r[i])) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
    print(title)
    sep = "  "
    print(
        sep.join(
            str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(columns, widths, strict=True))
        )
    )
    print(sep.join("-" * w for w in widths))
    for r in rows:
        print(
            sep.join(
                str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    if footer:
        print(footer)
    print()


def _term_width() -> int:
    try:
        return os.get_terminal_size().columns
    except OSError:
        return 120


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def with_timeout(seconds: float, fn: Callable[[], Any]) -> Any:
    """Run a blocking callable in a daemon thread and give up after ``seconds``."""
    box: dict[str, Any] = {}

    def _run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=_run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise TimeoutError(f"gave up after {seconds:.0f}s")
    if "error" in box:
        raise box["error"]
    return box.get("value")
