"""policy="learned" on real in-process nodes over TCP: tasks complete, the policy learns from
their completions, and it sends most work to the fast node when one node is 4x slower."""

from __future__ import annotations

from collections import Counter

from aionet.scheduler.learned import LearnedPolicy
from tests.system.test_scheduler import F, cfg, cluster


async def test_learned_policy_places_runs_and_learns() -> None:
    async with cluster(cfg(run_local=False, policy="learned", steal=False), cfg(steal=False), cfg(steal=False)) as (
        a,
        b,
        c,
    ):
        pol = a.scheduler.owner.policy_obj
        assert isinstance(pol, LearnedPolicy)
        slow = {c.name: 4.0}
        out = await a.map(F + "work", range(300), [0.004] * 300, [slow] * 300, resources={"cpu": 1})
        where = Counter(out)  # work() returns the node it ran on
        assert sum(where.values()) == 300
        assert pol.stats()["samples"] >= 200  # learned from completions: tasks of >= 1 ms are all tracked
        assert where[b.name] > 1.5 * where[c.name], where  # the fast node did most of the work
