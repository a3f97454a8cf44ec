"""Tasks between in-process nodes over tcp://127.0.0.1: the public API end to end."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import pickle
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

import aionet
from aionet import Node, TaskError
from aionet.config import Config
from aionet.errors import ConfigError
from aionet.scheduler import TaskCancelled, TaskFailed, TaskLost, TaskTimeout, Unschedulable
from aionet.scheduler import owner as owner_mod
from aionet.scheduler.wire import CHANNEL, M_SUBMIT
from tests import tasks_fns
from tests.conftest import wait_for

F = "tests.tasks_fns:"


def cfg(**sched: Any) -> Config:
    sched.setdefault("resources", {"cpu": 2, "gpu": 0})
    sched.setdefault("allow_modules", ["tests.tasks_fns"])  # a node runs no task module it does not allow
    return Config.from_dict({"scheduler": sched})


@contextlib.asynccontextmanager
async def cluster(*configs: Config) -> AsyncIterator[list[Node]]:
    """Nodes n0, n1, ...: n0 is the seed (and usually the submitting owner)."""
    nodes: list[Node] = []
    try:
        for i, c in enumerate(configs):
            join = [nodes[0].address] if nodes else None
            n = Node(name=f"n{i}", listen="tcp://127.0.0.1:0", join=join, config=c)
            await n.start()
            nodes.append(n)
        names = {n.name for n, c in zip(nodes, configs, strict=True) if c.scheduler.run_local}
        for n in nodes:
            await wait_for(lambda n=n: names <= set(n.scheduler.owner.views), timeout=10)
        yield nodes
    finally:
        for n in reversed(nodes):
            await n.stop(grace=0.5)


async def test_submit_await_and_placement_across_nodes():
    async with cluster(cfg(run_local=False), cfg(), cfg()) as (a, _b, _c):
        assert await a.submit(F + "add", 1, 2) == 3
        assert await a.submit(tasks_fns.add, "x", "y") == "xy"  # a module-level callable is named by path
        assert await a.submit(F + "async_add", 2, b=5) == 7  # extra keyword arguments go to the function
        refs = [a.submit(F + "whoami", i) for i in range(40)]
        out = await a.gather(refs)
        assert [o[0] for o in out] == list(range(40))
        assert {o[1] for o in out} == {"n1", "n2"}  # n0 submits only; both workers ran tasks
        assert all(r.done() and r.node in ("n1", "n2") for r in refs)
        assert await a.map(F + "add", [1, 2, 3], [10, 20, 30]) == [11, 22, 33]


async def test_single_node_runs_locally_and_context():
    async with cluster(cfg()) as (a,):
        assert await a.submit(F + "where") == "n0"
        assert await a.submit(F + "pid") == os.getpid()
        with pytest.raises(TaskError, match="outside a task"):
            aionet.task_context()


async def test_dependencies_nested_and_chain():
    async with cluster(cfg(run_local=False), cfg(), cfg()) as (a, _b, _c):
        x = a.submit(F + "inc", 1)
        y = a.submit(F + "inc", x)
        s = a.submit(F + "total", [x, y, 100])  # refs nested in a list
        d = a.submit(F + "pair", {"a": x, "b": (y, s)})  # and in a dict holding a tuple
        assert await d == [2, (3, 105)]
        chain = a.submit(F + "inc", 0)
        for _ in range(199):
            chain = a.submit(F + "inc", chain)
        assert await chain == 200


async def test_large_result_stays_where_it_ran_and_dependents_fetch_it_there():
    async with cluster(cfg(run_local=False), cfg(), cfg()) as (a, b, c):
        n = 200_000  # 1.6 MB: above inline_max_bytes
        big = a.submit(F + "big", n, affinity="n1")
        s = a.submit(F + "arr_sum", big, affinity="n2")
        assert await s == float(np.arange(n).sum())
        rec = big._rec
        assert rec.holder == "n1" and not rec.has_value  # n0 never had the data
        assert b.scheduler.worker.stats().results_held == 1
        got = await big  # the owner fetches it only when asked
        assert isinstance(got, np.ndarray) and got.shape == (n,) and got[-1] == n - 1
        # dropping the last reference frees the result on the node that held it
        del big, got, rec, s
        gc.collect()
        await wait_for(lambda: not b.scheduler.worker.store, timeout=5)
        assert not c.scheduler.worker.store


async def test_locality_policy_runs_dependents_where_data_is():
    async with cluster(cfg(run_local=False, policy="locality"), cfg(), cfg()) as (a, _b, _c):
        bigs = [a.submit(F + "big", 100_000, affinity=n) for n in ("n1", "n2")]
        await wait_for(lambda: all(r.done() for r in bigs))
        refs = [a.submit(F + "arr_sum", r) for r in bigs * 3]
        await a.gather(refs)
        assert [r.node for r in refs] == ["n1", "n2"] * 3


async def test_errors_are_clear():
    async with cluster(cfg(run_local=False), cfg(allow_modules=["tests"])) as (a, _b):
        with pytest.raises(TaskFailed) as ei:
            await a.submit(F + "boom", "bad input")
        e = ei.value
        assert e.remote_type == "ValueError" and e.remote_message == "bad input" and e.node == "n1"
        assert "raise ValueError(msg)" in e.remote_traceback
        with pytest.raises(TaskError, match="cannot import task function 'tests.tasks_fns:nope'.*on node 'n1'|n1"):
            await a.submit(F + "nope")
        with pytest.raises(TaskError, match="cannot import task function 'tests.no_such_mod:f'"):
            await a.submit("tests.no_such_mod:f")
        with pytest.raises(TaskError, match="not callable"):
            await a.submit(F + "VALUE")
        with pytest.raises(TaskError, match="pkg.module:function"):
            a.submit("just_a_name")
        with pytest.raises(TaskError, match="import path"):
            a.submit(lambda: 1)
        with pytest.raises(ValueError, match="executor"):
            a.submit(F + "noop", executor="gpu")
        with pytest.raises(ConfigError, match="unknown scheduling policy"):
            a.submit(F + "noop", policy="random")
        # dependents of a failed task fail too, naming the dependency
        bad = a.submit(F + "boom", "x")
        dep = a.submit(F + "inc", bad)
        with pytest.raises(TaskError, match="dependency"):
            await dep
        outs = await a.gather([a.submit(F + "inc", 1), bad], return_exceptions=True)
        assert outs[0] == 2 and isinstance(outs[1], TaskFailed)


async def test_unsatisfiable_fails_fast_and_gpu_goes_to_gpu_node():
    async with cluster(cfg(run_local=False), cfg(), cfg(resources={"cpu": 2, "gpu": 1})) as (a, _b, _c):
        t = time.monotonic()
        with pytest.raises(Unschedulable, match="gpu=2"):
            await a.submit(F + "where", resources={"gpu": 2})
        with pytest.raises(Unschedulable, match="memory"):
            await a.submit(F + "where", resources={"memory": "100TiB"})
        assert time.monotonic() - t < 1.0
        wheres = await a.gather([a.submit(F + "where", resources={"gpu": 1}) for _ in range(6)])
        assert set(wheres) == {"n2"}
        wheres = await a.gather([a.submit(F + "where", resources={"cpu": 1, "ssd": 0}) for _ in range(20)])
        assert set(wheres) == {"n1", "n2"}


async def test_custom_resources_and_affinity():
    async with cluster(cfg(run_local=False), cfg(resources={"cpu": 2, "gpu": 0, "licence": 1}), cfg()) as (a, _b, _c):
        assert set(await a.gather([a.submit(F + "where", resources={"licence": 1}) for _ in range(4)])) == {"n1"}
        assert set(await a.gather([a.submit(F + "where", affinity="n2") for _ in range(4)])) == {"n2"}
        with pytest.raises(Unschedulable, match="pinned"):
            await a.submit(F + "where", affinity="n9")


async def test_cancel_queued_running_and_dependents():
    async with cluster(cfg(run_local=False), cfg(resources={"cpu": 1, "gpu": 0})) as (a, b):
        running = a.submit(F + "async_sleep", 30)
        queued = a.submit(F + "async_sleep", 30)
        dependent = a.submit(F + "inc", queued)
        await wait_for(lambda: b.scheduler.worker.n_running == 1 and len(b.scheduler.worker.queue) == 1)
        assert queued.cancel() and running.cancel()
        assert not running.cancel()
        for r in (running, queued, dependent):
            with pytest.raises(TaskCancelled):
                await r
        await wait_for(lambda: b.scheduler.worker.n_running == 0 and not b.scheduler.worker.jobs)
        assert await a.submit(F + "inc", 1) == 2  # the slot is free again


async def test_timeouts():
    async with cluster(cfg(run_local=False), cfg()) as (a, _b):
        with pytest.raises(TaskTimeout) as ei:
            await a.submit(F + "async_sleep", 30, timeout=0.1)
        assert isinstance(ei.value, asyncio.TimeoutError)
        with pytest.raises(TaskTimeout):
            await a.submit(F + "sleep_ms", 0, 500, timeout=0.05)
        assert await a.submit(F + "sleep_ms", 1, 1, timeout=5) == [1, "n1"]


async def test_priorities_order_the_queue():
    async with cluster(cfg(run_local=False), cfg(resources={"cpu": 1, "gpu": 0})) as (a, b):
        blocker = a.submit(F + "async_sleep", 0.2)
        await wait_for(lambda: b.scheduler.worker.n_running == 1)
        low = [a.submit(F + "sleep_ms", i, 1, priority=0) for i in range(5)]
        high = [a.submit(F + "sleep_ms", 100 + i, 1, priority=5) for i in range(3)]
        # some lows are queued on n1, the rest wait at the owner; highs overtake both
        done_order: list[int] = []
        for r in [*low, *high]:
            r._rec.fut.add_done_callback(lambda _f, r=r: done_order.append(r._rec.value[0]))
        await a.gather([blocker, *low, *high])
        assert done_order[:3] == [100, 101, 102] and done_order[3:] == [0, 1, 2, 3, 4]


async def test_preemption_requeues_with_checkpoint():
    async with cluster(cfg(run_local=False), cfg(resources={"cpu": 1, "gpu": 0})) as (a, b):
        low = a.submit(F + "hold", 0.6, "low", preemptible=True, priority=0)
        await wait_for(lambda: b.scheduler.worker.n_running == 1)
        high = a.submit(F + "hold", 0.05, "high", priority=10)
        t_high = None
        res_high = await high
        t_high = time.monotonic()
        res_low = await low
        assert res_high == "high:1"
        assert res_low == "low:2"  # re-run from its checkpoint (started once before)
        assert time.monotonic() >= t_high
        assert b.scheduler.worker.stats().preempted == 1
        # not preemptible: the high-priority task waits instead
        keep = a.submit(F + "hold", 0.3, "keep", priority=0)
        await wait_for(lambda: b.scheduler.worker.n_running == 1)
        assert await a.submit(F + "hold", 0.01, "h2", priority=10) == "h2:1"
        assert await keep == "keep:1"
        assert b.scheduler.worker.stats().preempted == 1


async def test_idle_node_steals_queued_tasks():
    # a huge queue_time makes n0 put every task on n1 at once; n2 joins later and steals
    a = Node(name="n0", listen="tcp://127.0.0.1:0", config=cfg(run_local=False, queue_time=1000.0))
    await a.start()
    b = Node(name="n1", listen="tcp://127.0.0.1:0", join=[a.address], config=cfg(resources={"cpu": 1, "gpu": 0}))
    await b.start()
    c = None
    try:
        await wait_for(lambda: "n1" in a.scheduler.owner.views)
        refs = [a.submit(F + "sleep_ms", i, 20) for i in range(60)]
        await wait_for(lambda: len(b.scheduler.worker.queue) > 40)
        c = Node(name="n2", listen="tcp://127.0.0.1:0", join=[a.address], config=cfg())
        await c.start()
        out = await asyncio.wait_for(a.gather(refs), 10)
        assert sorted(o[0] for o in out) == list(range(60))
        assert "n2" in {o[1] for o in out}
        assert c.scheduler.worker.stats().stolen_in > 0
        assert b.scheduler.worker.stats().stolen_out == c.scheduler.worker.stats().stolen_in
        assert a.scheduler.owner.stats().moved == c.scheduler.worker.stats().stolen_in
        assert a.scheduler.owner.stats().completed == 60
    finally:
        for n in (c, b, a):
            if n is not None:
                await n.stop(grace=0.5)


async def test_node_declared_dead_resubmits_exactly_once():
    """n1 is declared dead while it still runs its tasks: they are re-run on n2, and whichever
    copy finishes first is the result; the other copy's result is dropped, never delivered."""
    async with cluster(cfg(run_local=False), cfg(), cfg()) as (a, _b, _c):
        refs = [a.submit(F + "sleep_ms", i, 50) for i in range(16)]
        await wait_for(lambda: a.scheduler.owner.views["n1"].inflight > 0)
        a.scheduler.node_down("n1", graceful=False, reason="test verdict")
        out = await asyncio.wait_for(a.gather(refs), 10)
        assert sorted(o[0] for o in out) == list(range(16))
        st = a.scheduler.owner.stats()
        assert st.resubmitted >= 1 and st.completed == 16
        await wait_for(lambda: a.scheduler.owner.stats().duplicates_dropped >= 1, timeout=5)
        assert all(r.attempts >= 1 for r in refs)


async def test_retries_exhausted_is_task_lost():
    async with cluster(cfg(run_local=False), cfg(), cfg()) as (a, _b, _c):
        ref = a.submit(F + "async_sleep", 5, retries=0, affinity="n1")
        await wait_for(lambda: ref.node == "n1" and a.scheduler.owner.views["n1"].inflight == 1)
        a.scheduler.node_down("n1", graceful=False, reason="test verdict")
        with pytest.raises(TaskLost, match="retries are used up"):
            await ref


async def test_leaving_node_resumes_task_from_checkpoint_elsewhere():
    a = Node(name="n0", listen="tcp://127.0.0.1:0", config=cfg(run_local=False))
    await a.start()
    b = Node(name="n1", listen="tcp://127.0.0.1:0", join=[a.address], config=cfg())
    await b.start()
    c = None
    try:
        await wait_for(lambda: "n1" in a.scheduler.owner.views)
        ref = a.submit(F + "steps", 40, 0.02, retries=0)  # a graceful leave does not use a retry
        await wait_for(lambda: (ref._rec.ckpt or {}).get("i", 0) >= 5)
        c = Node(name="n2", listen="tcp://127.0.0.1:0", join=[a.address], config=cfg())
        await c.start()
        await wait_for(lambda: "n2" in a.scheduler.owner.views)
        await b.stop(grace=0.1)
        res = await asyncio.wait_for(ref, 10)
        assert res["i"] == 40 and res["node"] == "n2"
        assert res["resumed_from"] >= 5
        assert ref.attempts == 2
    finally:
        for n in (c, b, a):
            if n is not None:
                await n.stop(grace=0.5)


async def test_key_dedup_and_process_executor():
    async with cluster(cfg(run_local=False), cfg()) as (a, _b):
        r1 = a.submit(F + "inc", 1, key="k1")
        r2 = a.submit(F + "inc", 1, key="k1")
        assert r1.id == r2.id == "k1" and r1.key == "k1"
        assert await r1 == await r2 == 2
        pid = await a.submit(F + "in_process", executor="process")
        assert pid != os.getpid()
        assert await a.submit(F + "add", 2, 3, executor="process") == 5
        with pytest.raises(TaskFailed, match="bad"):
            await a.submit(F + "boom", "bad", executor="process")


async def test_sync_checkpoint_from_thread_reaches_owner():
    async with cluster(cfg(run_local=False), cfg()) as (a, _b):
        ref = a.submit(F + "sync_steps", 5, 0.01)
        assert (await ref)["i"] == 5


async def test_stopping_owner_fails_pending_refs():
    a = Node(name="n0", listen="tcp://127.0.0.1:0", config=cfg())
    await a.start()
    ref = a.submit(F + "async_sleep", 30)
    await wait_for(lambda: a.scheduler.worker.n_running == 1)
    await a.stop(grace=0.1)
    with pytest.raises(TaskLost, match="shutting down"):
        await ref
    with pytest.raises(TaskError, match="stopped"):
        a.submit(F + "noop")


async def test_default_config_runs_no_task_and_says_how_to_allow(tmp_path):
    """scheduler.allow_modules defaults to nothing: a task is refused, naming the fix, and
    its module is not even imported."""
    default = Config.from_dict({"scheduler": {"resources": {"cpu": 1, "gpu": 0}}})
    assert default.scheduler.allow_modules == []
    sys.modules.pop("tests.tasks_forbidden", None)
    async with cluster(default, default) as nodes:
        a = nodes[0]
        for where in ("n1", "n0"):  # a peer's task, and the submitter's own local run
            with pytest.raises(TaskFailed) as ei:
                await a.submit("tests.tasks_forbidden:touch", str(tmp_path / "x"), affinity=where)
            msg = str(ei.value)
            assert f"refused on node '{where}'" in msg and "allow_modules is empty" in msg, msg
            assert "allow_modules = ['tests']" in msg and "--app" in msg, msg
        assert "tests.tasks_forbidden" not in sys.modules
        assert not (tmp_path / "x").exists()
        assert [n.scheduler.worker.stats().refused for n in nodes] == [1, 1]


class _Unpickled:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.path}",))


async def test_stdlib_is_refused_even_with_allow_star(tmp_path, monkeypatch):
    """os:system, pickle:loads and subprocess:run never run, even on a node that allows "*":
    the submitter fails fast, and a worker refuses them itself (a hostile peer skips the
    submitter's check). Naming them in allow_modules is a config error."""
    marker = tmp_path / "pwned"
    attempts = [
        ("os:system", (f"touch {marker}",)),
        ("pickle:loads", (pickle.dumps(_Unpickled(str(marker))),)),
        ("subprocess:run", (["touch", str(marker)],)),
    ]
    async with cluster(cfg(run_local=False), cfg(allow_modules=["*"])) as (a, b):
        for path, args in attempts:
            with pytest.raises(TaskError, match="standard library.*allow that module"):
                a.submit(path, *args)  # the submitter refuses at once
        # the worker enforces it: same submissions with the submitter's check disabled
        monkeypatch.setattr(owner_mod, "is_never_run", lambda _m: False)
        for path, args in attempts:
            with pytest.raises(TaskFailed, match=f"'{path}' refused on node 'n1'.*standard library"):
                await a.submit(path, *args)
        # and a raw spec sent straight to the worker's channel, as a hostile peer would
        spec = [999, "os:system", [f"touch {marker}"], None, 0, None, 0, 0, None, 1, None, None, None]
        await a.send("n1", CHANNEL, [M_SUBMIT, "n0", [spec]])
        await wait_for(lambda: b.scheduler.worker.stats().refused == 4)
        assert not marker.exists()
        # "*" still runs ordinary installed code
        assert await a.submit(F + "inc", 1) == 2
    for bad in (["os"], ["os.path"], ["pickle"], ["importlib"], ["aionet"], ["*", "subprocess"]):
        with pytest.raises(ConfigError, match="never runs tasks from it"):
            Node(name="x", config=cfg(allow_modules=bad))
    with pytest.raises(ConfigError, match="not a module name"):
        Node(name="x", config=cfg(allow_modules=["../evil"]))


async def test_allow_modules_is_checked_before_import_and_on_what_the_path_reaches(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    monkeypatch.delitem(sys.modules, "tests.tasks_forbidden", raising=False)
    async with cluster(
        cfg(run_local=False),
        cfg(allow_modules=["tests.tasks_fns"]),
        cfg(allow_modules=["tests.tasks"]),  # a prefix matches whole module names only
        cfg(allow_modules=["tests.tasks_forbidden"]),
    ) as (a, _b, _c, _d):
        for node in ("n1", "n2"):
            with pytest.raises(TaskFailed, match="not in its scheduler.allow_modules.*allow_modules = \\['tests'\\]"):
                await a.submit("tests.tasks_forbidden:touch", str(marker), affinity=node)
            assert "tests.tasks_forbidden" not in sys.modules  # refused by name, never imported
        assert not marker.exists()
        # an allowed module cannot be a door to what it imports
        with pytest.raises(TaskFailed, match="reaches through the module 'os'"):
            await a.submit(F + "os.system", f"touch {marker}", affinity="n1")
        with pytest.raises(TaskFailed, match="defined in 'posixpath'.*standard library"):
            await a.submit(F + "path_join", "a", "b", affinity="n1")
        with pytest.raises(TaskFailed, match="dunder"):
            await a.submit(F + "inc.__call__", 1, affinity="n1")
        assert not marker.exists()
        assert await a.submit(F + "inc", 1, affinity="n1") == 2
        # the node that allows the module runs it
        assert await a.submit("tests.tasks_forbidden:touch", str(marker), affinity="n3") == "ran"
        assert marker.exists()


async def test_task_option_never_silently_shadows_a_function_keyword():
    """``timeout=`` is a task option; a function that takes ``timeout`` too makes the call
    ambiguous (an error, not a silent pick); ``kwargs=`` says which is which."""
    async with cluster(cfg()) as (a,):
        for fn in (tasks_fns.with_options, F + "with_options"):  # a callable, or a path already imported
            with pytest.raises(TypeError, match="'timeout' is a task option.*kwargs="):
                a.submit(fn, 1, timeout=5)
            with pytest.raises(TypeError, match="'priority' is a task option"):
                a.submit(fn, 1, priority=3)
        # kwargs= holds the function's keywords; every other keyword is then a task option
        ref = a.submit(F + "with_options", 1, kwargs={"timeout": 7, "priority": 2}, timeout=5, priority=1)
        assert await ref == [1, 7, 2]
        ref = a.submit(F + "with_options", 1, kwargs={}, timeout=5)
        assert ref._rec.timeout == 5 and await ref == [1, 1.0, 0]
        with pytest.raises(TypeError, match="unknown task option 'tiemout'"):
            a.submit(F + "with_options", 1, kwargs={}, tiemout=5)
        with pytest.raises(TypeError, match="kwargs= must be a dict"):
            a.submit(F + "with_options", 1, kwargs=[("timeout", 1)])
        # no clash: options and function keywords mix as before
        assert await a.submit(F + "async_add", 2, b=5, timeout=5) == 7
        assert await a.map(F + "with_options", [1, 2], kwargs={"priority": 9}, priority=1) == [[1, 1.0, 9], [2, 1.0, 9]]


def test_submit_before_start_is_a_clear_error():
    with pytest.raises(TaskError, match="start the node"):
        Node(name="x", config=cfg()).submit(F + "noop")


def test_bad_scheduler_config_is_rejected():
    with pytest.raises(ConfigError, match="unknown scheduling policy"):
        Node(name="x", config=Config.from_dict({"scheduler": {"policy": "fastest"}}))
    with pytest.raises(ConfigError, match="resources"):
        Node(name="x", config=Config.from_dict({"scheduler": {"resources": {"gpu": "many"}}}))
    with pytest.raises(ConfigError, match="unknown key"):
        Config.from_dict({"scheduler": {"polcy": "round-robin"}})


async def test_many_tasks_with_small_windows_complete_once():
    async with cluster(cfg(run_local=False, batch_size=7, max_queued_per_slot=1), cfg(), cfg()) as (a, _b, _c):
        out = await a.map(F + "inc", range(3000))
        assert out == list(range(1, 3001))
        st = a.scheduler.owner.stats()
        assert st.completed == 3000 and st.duplicates_dropped == 0
        assert not a.scheduler.owner.recs  # nothing left in the ownership table


async def test_shortest_expected_beats_round_robin_on_heterogeneous_nodes():
    """Two workers, n2 4x slower on the function: learned runtimes send it less work."""
    n, base, slow = 400, 0.005, {"n2": 4.0}
    times = {}
    for policy in ("round-robin", "shortest-expected"):
        worker = cfg(resources={"cpu": 4, "gpu": 0}, steal=False)  # placement alone decides
        async with cluster(cfg(run_local=False, policy=policy), worker, worker) as (a, b, c):
            t = time.monotonic()
            out = await a.map(F + "work", range(n), [base] * n, [slow] * n)
            times[policy] = time.monotonic() - t
            assert len(out) == n
            ran = (b.scheduler.worker.stats().ran, c.scheduler.worker.stats().ran)
            if policy == "round-robin":
                assert ran == (n // 2, n // 2)
            else:
                assert ran[0] > 2.5 * ran[1], ran
    assert times["round-robin"] / times["shortest-expected"] >= 1.5, times


async def test_stopping_nodes_mid_flight_leaves_no_unretrieved_task_exception():
    """Nodes stopped while tasks run, results are fetched and scheduler requests wait on a
    peer: every task the scheduler started is cancelled and awaited, so nothing reaches the
    loop's exception handler ("Task exception was never retrieved"), not even after gc."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
    try:
        async with cluster(cfg(run_local=False), cfg(), cfg()) as (a, b, c):

            async def hang(_arg: Any) -> None:
                await asyncio.Event().wait()

            b.add_service("test.hang", hang)
            big = a.submit(F + "big", 200_000, affinity="n1")  # a result held on n1
            await wait_for(big.done)
            refs = [a.submit(F + "async_sleep", 30) for _ in range(3)]
            refs += [a.submit(F + "sleep_ms", i, 300) for i in range(3)]
            refs.append(a.submit(F + "arr_sum", big, affinity="n2"))
            # scheduler requests in flight when the nodes stop (as resource/steal/fetch requests are)
            for n in (a, c):
                n.scheduler.spawn(n.scheduler.request_unless_dead("n1", "test.hang", None), "test-hang")
            await wait_for(lambda: b.scheduler.worker.n_running > 0 and c.scheduler.worker.n_running > 0)
            await a.stop(grace=0.1)  # the owner first: its requests and fetches are abandoned
            await b.stop(grace=0.1)
            for r in refs:
                with pytest.raises(TaskError):
                    await r
        del refs, big
        for _ in range(3):
            gc.collect()
            await asyncio.sleep(0.05)
        assert not seen, [ctx.get("message") for ctx in seen]
    finally:
        loop.set_exception_handler(previous)
