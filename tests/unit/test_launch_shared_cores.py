"""What a local launcher gives ranks that fill or outnumber the host's cores (pure decision), and
that ``aionet launch`` passes it to every rank unless the caller chose the setting."""

from __future__ import annotations

import asyncio
import io
import sys

from aionet.config import Config
from aionet.launch.cores import shared_cores_config
from aionet.launch.local import launch, shared_cores_env, shared_cores_notice, shared_cores_settings, usable_cores

KEY = "AIONET_COLLECTIVES_PIPELINE_SEGMENTS"
POLL = "AIONET_NODE_BUSY_POLL_US"


def test_ranks_that_fill_the_cores_get_whole_ring_chunks_and_keep_busy_polling() -> None:
    for ranks, cores in ((2, 2), (16, 16)):
        settings = shared_cores_settings(ranks, cores)
        assert settings == {KEY: "1"}
        cfg = Config.from_dict({}, env=settings)
        assert cfg.collectives.pipeline_segments == 1 and cfg.node.busy_poll_us == 200
        implied = Config.from_dict(shared_cores_config(ranks, cores), env={})
        assert implied.collectives.pipeline_segments == 1 and implied.node.busy_poll_us == 200


def test_ranks_that_outnumber_the_cores_also_stop_busy_polling() -> None:
    for ranks, cores in ((4, 2), (3, 2), (17, 16)):
        settings = shared_cores_settings(ranks, cores)
        assert settings == {KEY: "1", POLL: "0"}
        cfg = Config.from_dict({}, env=settings)
        assert cfg.collectives.pipeline_segments == 1 and cfg.node.busy_poll_us == 0
        implied = Config.from_dict(shared_cores_config(ranks, cores), env={})
        assert implied.collectives.pipeline_segments == 1 and implied.node.busy_poll_us == 0


def test_a_world_across_hosts_keeps_its_chunks_but_an_oversubscribed_host_stops_polling() -> None:
    # 8 ranks, 4 on this 2-core host: the NIC overlaps the ring's pieces; the spinning is per host
    assert shared_cores_config(8, 2, local_ranks=4) == {"node": {"busy_poll_us": 0}}
    assert shared_cores_config(8, 2, local_ranks=2) == {}
    assert shared_cores_config(8, 4, local_ranks=2) == {}


def test_ranks_with_cores_to_spare_or_an_unknown_core_count_keep_the_default() -> None:
    for ranks, cores in ((2, 3), (4, 8), (4, 0)):
        assert shared_cores_settings(ranks, cores) == {}
        assert shared_cores_config(ranks, cores) == {}
    assert Config.from_dict({}, env={}).collectives.pipeline_segments == 2


def test_only_settings_the_environment_lacks_are_added() -> None:
    assert shared_cores_env(4, {}, cores=2) == {KEY: "1", POLL: "0"}
    assert shared_cores_env(4, {KEY: "2"}, cores=2) == {POLL: "0"}
    assert shared_cores_env(4, {POLL: "200"}, cores=2) == {KEY: "1"}
    assert shared_cores_env(2, {}, cores=2) == {KEY: "1"}
    assert shared_cores_env(2, {}, cores=3) == {}


def test_the_notice_names_every_setting_given_and_how_to_choose() -> None:
    # what `aionet launch` and `aionet bench` print
    assert shared_cores_notice(4, 2, {KEY: "1", POLL: "0"}) == (
        f"4 ranks on 2 cores: every rank gets {KEY}=1 {POLL}=0 (set them to choose)"
    )
    assert shared_cores_notice(2, 2, {KEY: "1"}) == f"2 ranks on 2 cores: every rank gets {KEY}=1 (set it to choose)"


def test_usable_cores_is_at_least_one() -> None:
    assert usable_cores() >= 1


def _run(nprocs: int, cores: int, env: dict[str, str]) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = f"import os; print(os.environ.get({KEY!r}, 'unset'), os.environ.get({POLL!r}, 'unset'), sep='/')"
    result = asyncio.run(
        launch([sys.executable, "-c", code], nprocs, prefix=False, out=out, err=err, env=env, cores=cores)
    )
    assert result.code == 0, err.getvalue()
    return out.getvalue(), err.getvalue()


def test_launch_gives_every_rank_the_setting_when_ranks_fill_the_cores_and_says_so() -> None:
    out, err = _run(3, 2, {"PATH": "/usr/bin:/bin"})
    assert out.split() == ["1/0", "1/0", "1/0"]
    assert f"3 ranks on 2 cores: every rank gets {KEY}=1 {POLL}=0 (set them to choose)" in err
    out, err = _run(2, 2, {"PATH": "/usr/bin:/bin"})
    assert out.split() == ["1/unset", "1/unset"]
    assert f"2 ranks on 2 cores: every rank gets {KEY}=1 (set it to choose)" in err


def test_launch_keeps_the_callers_own_choice_and_adds_nothing_with_enough_cores() -> None:
    out, err = _run(3, 2, {"PATH": "/usr/bin:/bin", KEY: "4", POLL: "50"})
    assert out.split() == ["4/50", "4/50", "4/50"] and KEY not in err and POLL not in err
    out, err = _run(3, 2, {"PATH": "/usr/bin:/bin", KEY: "4"})
    assert out.split() == ["4/0", "4/0", "4/0"] and KEY not in err and f"{POLL}=0 (set it to choose)" in err
    out, err = _run(2, 8, {"PATH": "/usr/bin:/bin"})
    assert out.split() == ["unset/unset", "unset/unset"] and err == ""
