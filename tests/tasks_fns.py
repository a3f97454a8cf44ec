"""Importable task functions for the scheduler tests (run by in-process and subprocess nodes).

The sleeps below are the tasks' work (a thread blocked, a slow node, a long checkpointed job),
the scenario the scheduler is tested under; no test synchronises on them: tests wait on task
results, events and states."""

from __future__ import annotations

import asyncio
import os
import time
from os.path import join as path_join  # noqa: F401  # imported, not defined here: never a task
from typing import Any

import numpy as np

import aionet


def noop() -> None:
    return None


def add(a: Any, b: Any) -> Any:
    return a + b


def inc(x: int) -> int:
    return x + 1


def total(xs: list[Any]) -> Any:
    return sum(xs)


def pair(d: dict[str, Any]) -> list[Any]:
    return [d["a"], d["b"]]


async def async_add(a: Any, b: Any) -> Any:
    await asyncio.sleep(0)
    return a + b


def boom(msg: str) -> None:
    raise ValueError(msg)


def where() -> str:
    """The executing node's name."""
    return aionet.task_context().node_name


def whoami(i: int) -> list[Any]:
    """(i, node, pid): which node ran item i."""
    return [i, aionet.task_context().node_name, os.getpid()]


def sleep_ms(i: int, ms: float = 10.0) -> list[Any]:
    """Block a thread for ``ms`` (a CPU-ish task), report (i, node)."""
    time.sleep(ms / 1000.0)
    return [i, aionet.task_context().node_name]


async def async_sleep(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return aionet.task_context().node_name


async def work(i: int, base: float, slow: dict[str, float]) -> str:
    """Simulated heterogeneous hardware: takes ``base * slow.get(node, 1)`` seconds."""
    node = aionet.task_context().node_name
    await asyncio.sleep(base * slow.get(node, 1.0))
    return node


def big(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.float64)


def arr_sum(a: np.ndarray) -> float:
    return float(a.sum())


def pid() -> int:
    return os.getpid()


async def steps(n: int, delay: float, fail_at_attempt_1: int | None = None) -> dict[str, Any]:
    """Counts to ``n``, checkpointing after each step; resumes from the checkpoint when re-run."""
    ctx = aionet.task_context()
    state = ctx.restore() or {"i": 0, "resumed_from": None}
    if state["i"]:
        state["resumed_from"] = state["i"]
    while state["i"] < n:
        await asyncio.sleep(delay)
        state["i"] += 1
        ctx.checkpoint(dict(state))
    return {**state, "attempt": ctx.attempt, "node": ctx.node_name}


def sync_steps(n: int, delay: float) -> dict[str, Any]:
    ctx = aionet.task_context()
    state = ctx.restore() or {"i": 0, "resumed_from": None}
    if state["i"]:
        state["resumed_from"] = state["i"]
    while state["i"] < n:
        time.sleep(delay)
        state["i"] += 1
        ctx.checkpoint(dict(state))
    return {**state, "node": ctx.node_name}


async def hold(seconds: float, tag: str) -> str:
    """A long async task (preemption victim)."""
    ctx = aionet.task_context()
    started = ctx.restore() or 0
    ctx.checkpoint(started + 1)
    await asyncio.sleep(seconds)
    return f"{tag}:{started + 1}"


def in_process() -> int:
    return os.getpid()


def with_options(x: Any, timeout: float = 1.0, priority: int = 0) -> list[Any]:
    """Takes keywords named like submit's task options (timeout, priority)."""
    return [x, timeout, priority]


VALUE = 42  # not callable


def context_info() -> dict[str, Any]:
    """What a task learns of its place: node, rank, devices (and CUDA_VISIBLE_DEVICES)."""
    ctx = aionet.task_context()
    return {
        "has_node": ctx.node is not None and getattr(ctx.node, "name", None) == ctx.node_name,
        "node_name": ctx.node_name,
        "rank": ctx.rank,
        "devices": list(ctx.devices),
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pid": os.getpid(),
    }


async def request_from_task(peer: str, text: str) -> Any:
    """A task talking to another node through its own: ctx.node is the Node."""
    return await aionet.task_context().node.request(peer, "upper", text)


@aionet.task(retries=3, retry_on=(ConnectionError,))
def flaky(fail_attempts: int) -> int:
    """Raises ConnectionResetError (a ConnectionError) on its first ``fail_attempts`` attempts."""
    attempt = aionet.task_context().attempt
    if attempt <= fail_attempts:
        raise ConnectionResetError(f"attempt {attempt} failed")
    return attempt


@aionet.task(resources={"gpu": 1})
def gpu_hold(seconds: float) -> list[int]:
    time.sleep(seconds)
    return list(aionet.task_context().devices)


def stamp(seconds: float) -> list[float]:
    """[start, end] wall times of this task."""
    t0 = time.time()
    time.sleep(seconds)
    return [t0, time.time()]


async def cached_where(ref: Any) -> list[Any]:
    """[node name, value] of a cache_ref argument, read where the task runs."""
    node = aionet.task_context().node
    return [node.name, await node.cache.get(ref.key)]
