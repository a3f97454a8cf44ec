"""The public policy interface: names, import paths and entry points resolve to policy objects,
bad names fail with the choices, and the owner drives custom and learning policies."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from importlib.metadata import EntryPoint

import pytest

from aionet.errors import ConfigError
from aionet.scheduler.learned import LearnedPolicy
from aionet.scheduler.placement import (
    Completion,
    LeastLoaded,
    PlacementPolicy,
    PolicyContext,
    PolicyRegistry,
    RoundRobin,
    check_policy,
)
from aionet.scheduler.policies import NodeView, TaskReq, candidates
from aionet.scheduler.wire import R_ERROR, R_VALUE

from .fake_host import FakeHost
from .test_owner import owner_with, placed

FN = "tests.tasks_fns:inc"


class LastNode:
    """A third-party policy: always the last node by name that has room."""

    def __init__(self) -> None:
        self.calls = 0
        self.seen: list[Completion] = []

    def choose(self, task: TaskReq, nodes: Sequence[NodeView], ctx: PolicyContext) -> str | None:
        self.calls += 1
        room = [n.name for n in nodes if n.has_room(task.priority)]
        return max(room) if room else None

    def observe(self, done: Completion) -> None:
        self.seen.append(done)


def make_last() -> LastNode:
    return LastNode()


def not_a_policy() -> object:
    return object()


@pytest.fixture
def host() -> Iterator[FakeHost]:
    h = FakeHost("me")
    yield h
    h.loop.close()


def test_builtins_resolve_by_name_once_per_registry() -> None:
    reg = PolicyRegistry(use_entry_points=False)
    assert isinstance(reg.get("round-robin"), RoundRobin)
    assert isinstance(reg.get("least-loaded"), LeastLoaded)
    assert isinstance(reg.get("learned"), LearnedPolicy)
    assert reg.get("learned") is reg.get("learned")  # one instance per owner: its weights persist
    assert PolicyRegistry(use_entry_points=False).get("learned") is not reg.get("learned")
    assert {"round-robin", "least-loaded", "shortest-expected", "locality", "learned"} <= set(reg.names())


def test_unknown_name_lists_the_choices() -> None:
    with pytest.raises(ConfigError, match="unknown scheduling policy 'fastest'.*least-loaded.*package.module"):
        check_policy("fastest")


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("no_such_pkg.mod:Policy", "cannot be imported"),
        ("aionet.scheduler.placement:NoSuchPolicy", "has no attribute"),
        ("aionet.scheduler.placement:ENTRY_POINT_GROUP", "not a class or factory"),
    ],
)
def test_bad_import_paths_say_what_is_wrong(spec: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        check_policy(spec)


def test_import_path_class_and_factory() -> None:
    reg = PolicyRegistry(use_entry_points=False)
    assert isinstance(reg.get(f"{__name__}:LastNode"), LastNode)
    assert isinstance(reg.get(f"{__name__}:make_last"), LastNode)
    assert isinstance(reg.get(f"{__name__}:LastNode"), PlacementPolicy)
    with pytest.raises(ConfigError, match="no choose"):
        reg.get(f"{__name__}:not_a_policy")  # refused when built, not at the first task
    with pytest.raises(ConfigError, match="must be a name or an object"):
        check_policy(42)


def test_entry_point_group(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = EntryPoint(name="last", value=f"{__name__}:LastNode", group="aionet.policies")
    monkeypatch.setattr("aionet.scheduler.placement.entry_points", lambda group: [ep] if group == ep.group else [])
    reg = PolicyRegistry()
    assert "last" in reg.names()
    assert isinstance(reg.get("last"), LastNode)


def test_config_names_an_import_path(host: FakeHost) -> None:
    h = FakeHost("me", policy=f"{__name__}:LastNode")
    try:
        o = owner_with(h, "a", "b", "c")
        ref = o.submit(FN, (1,), None)
        placed(o, h, ref)
        assert ref._rec.node == "c" and o.policy_obj.calls == 1
    finally:
        h.loop.close()


def test_per_call_policy_object_learns_from_completions(host: FakeHost) -> None:
    pol = LastNode()
    o = owner_with(host, "a", "b")
    ref = o.submit(FN, (1,), None, policy=pol)
    other = o.submit(FN, (2,), None, policy="round-robin")
    placed(o, host, ref)
    assert ref._rec.node == "b" and other._rec.node in ("a", "b")
    host.now = 2.5
    o.on_results("b", [[ref._rec.tid, 1, R_VALUE, 2, 0.25, 8]], None)
    o.on_results("a", [[other._rec.tid, 1, R_ERROR, ["ValueError", "x", ""], 0.5, 0]], None)
    first, second = pol.seen  # every completion reaches every learning policy; tids tell them apart
    assert (first.tid, first.node, first.runtime, first.latency, first.ok) == (ref._rec.tid, "b", 0.25, 2.5, True)
    assert (second.tid, second.ok) == (other._rec.tid, False)


def test_per_call_bad_policy_fails_the_submit(host: FakeHost) -> None:
    o = owner_with(host, "a")
    with pytest.raises(ConfigError, match="unknown scheduling policy"):
        o.submit(FN, (1,), None, policy="nope")


def test_a_node_the_policy_was_not_offered_falls_back(host: FakeHost) -> None:
    class Wrong:
        def choose(self, task: TaskReq, nodes: Sequence[NodeView], ctx: PolicyContext) -> str | None:
            return "elsewhere"

    o = owner_with(host, "a")
    ref = o.submit(FN, (1,), None, policy=Wrong())
    placed(o, host, ref)
    assert ref._rec.node == "a"


class FewestGPUsFirst:
    """The example in docs/scheduler.md ("Writing a policy"), verbatim in behaviour."""

    def choose(self, task: TaskReq, nodes: Sequence[NodeView], ctx: PolicyContext) -> str | None:
        cands = candidates(task, nodes)
        if not cands:
            return None

        def key(n: NodeView) -> tuple[bool, float, str]:
            wastes_gpu = n.total.get("gpu", 0) > 0 and not task.resources.get("gpu")
            return (wastes_gpu, (n.inflight + n.other) / n.slots, n.name)

        return min(cands, key=key).name


def test_the_documented_example_policy(host: FakeHost) -> None:
    o = owner_with(host)
    o.node_up("gpu", {"cpu": 8.0, "gpu": 1.0}, run_tasks=True)
    o.node_up("cpu", {"cpu": 2.0}, run_tasks=True)
    pol = FewestGPUsFirst()
    cpu_ref = o.submit(FN, (1,), None, policy=pol)
    gpu_ref = o.submit(FN, (2,), None, policy=pol, resources={"gpu": 1})
    host.loop.run_soon()
    assert cpu_ref._rec.node == "cpu" and gpu_ref._rec.node == "gpu"


def test_prefer_narrows_candidates_to_the_most_free_and_is_soft() -> None:
    from aionet.scheduler.policies import NodeView, TaskReq, candidates, least_loaded

    a = NodeView("a", {"cpu": 4, "gpu_memory": 8e9}, free={"gpu_memory": 8e9})
    b = NodeView("b", {"cpu": 4, "gpu_memory": 16e9}, free={"gpu_memory": 2e9}, inflight=0)
    c = NodeView("c", {"cpu": 4}, free={}, inflight=5)
    want = TaskReq("m:f", {"cpu": 1}, prefer="gpu_memory")
    assert [n.name for n in candidates(want, [a, b, c])] == ["a"]
    assert least_loaded(want, [a, b, c]) == "a"  # b is as idle: the preference decides
    full = NodeView("a", {"cpu": 1, "gpu_memory": 8e9}, free={"gpu_memory": 8e9}, inflight=9, window=1, max_prio=0)
    assert least_loaded(want, [full, b]) == "b"  # no room on the preferred node: the next best
    nobody = TaskReq("m:f", {"cpu": 1}, prefer="fpga")
    assert {n.name for n in candidates(nobody, [a, b, c])} == {"a", "b", "c"}


def test_gpu_nodes_offer_gpu_memory_unless_declared(monkeypatch) -> None:
    import types

    import aionet.scheduler.service as sched_service

    class FakeDevices:
        def discover(self) -> dict:
            return {"gpus": [{"memory_total": 16 << 30}, {"memory_total": 32 << 30}]}

    monkeypatch.setattr(sched_service, "glob", types.SimpleNamespace(glob=lambda pattern: ["/dev/nvidia0"]))
    assert sched_service._gpu_resources(FakeDevices(), {}) == {"gpu": 2.0, "gpu_memory": float(48 << 30)}
    assert sched_service._gpu_resources(FakeDevices(), {"gpu": 1.0}) == {"gpu_memory": float(48 << 30)}
    monkeypatch.setattr(sched_service, "glob", types.SimpleNamespace(glob=lambda pattern: []))
    assert sched_service._gpu_resources(FakeDevices(), {}) == {"gpu": 0.0}  # no device files: no probe
