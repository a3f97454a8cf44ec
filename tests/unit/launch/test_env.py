"""Launcher detection fed with each launcher's environment (aionet.launch.env is pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aionet.config import Config
from aionet.errors import ConfigError
from aionet.launch import config_from_env, detect, expand_nodelist, expand_tasks_per_node


def test_started_by_hand_is_not_a_launch() -> None:
    assert detect({"PATH": "/usr/bin", "HOME": "/root"}) is None
    # a SLURM batch script (no job step) is not a launched rank either
    assert detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n[1-4]"}) is None


def test_open_mpi_single_host_uses_loopback_and_any_of_the_first_ranks_as_seeds() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "2",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "2",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    }
    info = detect(env, options={"port": 9000})
    assert info is not None
    assert (info.launcher, info.rank, info.world_size, info.name) == ("openmpi", 2, 4, "rank-2")
    assert info.listen == "tcp://127.0.0.1:9002"
    assert info.seeds == ("tcp://127.0.0.1:9000", "tcp://127.0.0.1:9001", "tcp://127.0.0.1:9002")
    assert info.advertise == ""


def test_open_mpi_across_hosts_needs_the_seed_host_and_says_how() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    env["OMPI_COMM_WORLD_LOCAL_SIZE"] = "4"
    with pytest.raises(ConfigError, match="mpi4py.*AIONET_LAUNCH_SEED_HOST"):
        detect(env)
    info = detect(env, "gpu2.example", options={"seed_host": "gpu1.example"})
    assert info is not None
    assert info.listen == "tcp://0.0.0.0:7701"
    assert info.advertise == "tcp://gpu2.example:7701"
    assert info.seeds[0] == "tcp://gpu1.example:7700"


def test_pmi_mpich() -> None:
    info = detect({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    assert info is not None and (info.launcher, info.rank, info.world_size) == ("pmi", 1, 2)
    assert info.listen == "tcp://127.0.0.1:7701"


def test_torchrun_ports_sit_above_master_port_and_rank_zero_host_is_the_seed() -> None:
    env = {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "trainer-0.example",
        "MASTER_PORT": "29500",
    }
    info = detect(env, "trainer-1.example")
    assert info is not None and info.launcher == "torchrun" and info.rank == 5
    assert info.listen == "tcp://0.0.0.0:29502"
    assert info.advertise == "tcp://trainer-1.example:29502"
    assert info.seeds[0] == "tcp://trainer-0.example:29501"
    single = detect({**env, "RANK": "1", "WORLD_SIZE": "4"})
    assert single is not None and single.listen == "tcp://127.0.0.1:29502" and single.advertise == ""


def test_slurm_step_expands_the_node_list_for_seeds() -> None:
    env = {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "6",
        "SLURM_STEP_ID": "0",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_STEP_NODELIST": "gpu[07-08],cpu1",
        "SLURM_STEP_TASKS_PER_NODE": "2(x3)",
        "SLURMD_NODENAME": "gpu08",
    }
    info = detect(env, options={"transport": "zmq+tcp"})
    assert info is not None and (info.launcher, info.rank, info.world_size, info.local_world_size) == (
        "slurm",
        3,
        6,
        2,
    )
    assert info.listen == "zmq+tcp://0.0.0.0:7701"
    assert info.advertise == "zmq+tcp://gpu08:7701"
    assert info.seeds[:3] == ("zmq+tcp://gpu07:7700", "zmq+tcp://gpu08:7700", "zmq+tcp://cpu1:7700")


def test_kubernetes_statefulset_pod_ordinal_and_headless_service_names() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "HOSTNAME": "aionet-2"}
    assert detect(env) is None  # without AIONET_LAUNCH_WORLD_SIZE a pod is configured by its own files
    info = detect(env, options={"world_size": 4, "service": "aionet-hl"}, namespace_file="ml\n")
    assert info is not None and (info.launcher, info.rank, info.world_size, info.name) == (
        "kubernetes",
        2,
        4,
        "aionet-2",
    )
    assert info.advertise == "tcp://aionet-2.aionet-hl.ml.svc.cluster.local:7700"
    assert info.seeds == (
        "tcp://aionet-0.aionet-hl.ml.svc.cluster.local:7700",
        "tcp://aionet-1.aionet-hl.ml.svc.cluster.local:7700",
    )
    assert info.name_format.format(rank=3) == "aionet-3"


def test_aionet_launch_variables_win_over_other_launchers() -> None:
    env = {"AIONET_NODE_RANK": "1", "AIONET_NODE_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"}
    env["OMPI_COMM_WORLD_SIZE"] = "9"
    info = detect(env)
    assert info is not None and (info.launcher, info.rank, info.world_size, info.name) == ("aionet", 1, 2, "rank-1")


@pytest.mark.parametrize("rank,world", [("4", "4"), ("-1", "2"), ("0", "0")])
def test_a_rank_outside_its_world_is_an_error(rank: str, world: str) -> None:
    with pytest.raises(ConfigError):
        detect({"PMI_RANK": rank, "PMI_SIZE": world})


def test_garbage_numbers_name_the_variable() -> None:
    with pytest.raises(ConfigError, match="OMPI_COMM_WORLD_RANK"):
        detect({"OMPI_COMM_WORLD_RANK": "two", "OMPI_COMM_WORLD_SIZE": "4"})


def test_config_file_and_aionet_variables_beat_what_the_launcher_implies(tmp_path) -> None:
    env = {"PMI_RANK": "1", "PMI_SIZE": "3", "AIONET_NODE_JOIN": "tcp://seed.example:7700"}
    path = tmp_path / "node.toml"
    path.write_text('[node]\nname = "mine"\n')
    cfg, info = config_from_env(path, env)
    assert info is not None
    assert cfg.node.name == "mine"  # from the file
    assert cfg.node.join == ["tcp://seed.example:7700"]  # from AIONET_NODE_JOIN
    assert cfg.node.listen == ["tcp://127.0.0.1:7701"] and (cfg.node.rank, cfg.node.world_size) == (1, 3)
    off, none = config_from_env(None, {**env, "AIONET_LAUNCH_DETECT": "false"})
    assert none is None and off.node.world_size == 0


def test_a_one_host_world_that_fills_the_cores_gets_whole_ring_chunks_from_every_launcher() -> None:
    openmpi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    slurm = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n1"}
    slurm["SLURM_STEP_TASKS_PER_NODE"] = "2"
    for env, rank_var in ((openmpi, "OMPI_COMM_WORLD_RANK"), (torchrun, "RANK"), (slurm, "SLURM_PROCID")):
        for rank in ("0", "1"):  # every rank of the world decides alike
            cores = int(env.get("OMPI_COMM_WORLD_LOCAL_SIZE", "2"))  # the world's size: it fills them
            cfg, info = config_from_env(None, {**env, rank_var: rank}, cores=cores)
            assert info is not None and info.host_cores == cores and info.rank == int(rank)
            assert cfg.collectives.pipeline_segments == 1, info.launcher
            # ranks = cores (Open MPI's 4 on 4, the others' 2 on 2): each has a core to poll on
            assert cfg.node.busy_poll_us == 200, info.launcher
            crowded = config_from_env(None, {**env, rank_var: rank}, cores=1)[0]
            assert crowded.collectives.pipeline_segments == 1 and crowded.node.busy_poll_us == 0, info.launcher
        assert config_from_env(None, env, cores=8)[0].collectives.pipeline_segments == 2  # cores to spare
        assert config_from_env(None, env, cores=0)[0].collectives.pipeline_segments == 2  # count unknown
        assert config_from_env(None, env, cores=0)[0].node.busy_poll_us == 200


def test_whole_ring_chunks_stay_off_across_hosts_busy_polling_follows_the_host_and_both_yield_to_the_user() -> None:
    across = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    across["AIONET_LAUNCH_SEED_HOST"] = "gpu1.example"
    spread = config_from_env(None, across, cores=2)[0]
    assert spread.collectives.pipeline_segments == 2  # the NIC overlaps the pieces
    assert spread.node.busy_poll_us == 0  # but this host's 4 ranks wait for its 2 cores
    assert config_from_env(None, across, cores=4)[0].node.busy_poll_us == 200
    one_host = {"PMI_RANK": "0", "PMI_SIZE": "4", "MPI_LOCALNRANKS": "4"}
    # the default's own value, named in the environment, is a choice: kept
    chosen = {**one_host, "AIONET_COLLECTIVES_PIPELINE_SEGMENTS": "2"}
    assert config_from_env(None, chosen, cores=2)[0].collectives.pipeline_segments == 2
    assert (
        config_from_env(None, {**one_host, "AIONET_COLLECTIVES_PIPELINE_SEGMENTS": "3"}, cores=2)[
            0
        ].collectives.pipeline_segments
        == 3
    )
    polled = config_from_env(None, {**one_host, "AIONET_NODE_BUSY_POLL_US": "200"}, cores=2)[0]
    assert polled.node.busy_poll_us == 200 and polled.collectives.pipeline_segments == 1
    assert config_from_env(None, one_host, cores=2)[0].node.busy_poll_us == 0
    # aionet launch decides for its ranks itself (it sets the variable); its variables alone imply nothing
    own = {"AIONET_NODE_RANK": "0", "AIONET_NODE_WORLD_SIZE": "4"}
    assert config_from_env(None, own, cores=2)[0].collectives.pipeline_segments == 2
    assert config_from_env(None, own, cores=2)[0].node.busy_poll_us == 200


def test_config_rejects_a_rank_outside_the_world_and_a_name_format_without_rank() -> None:
    with pytest.raises(ConfigError, match="node.rank"):
        Config.from_dict({"node": {"rank": 3, "world_size": 2}}, env={})
    with pytest.raises(ConfigError, match="name_format"):
        Config.from_dict({"launch": {"name_format": "worker"}}, env={})


def test_nodelist_examples() -> None:
    assert expand_nodelist("n1") == ["n1"]
    assert expand_nodelist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_nodelist("r[1-2]n[8-9]") == ["r1n8", "r1n9", "r2n8", "r2n9"]
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    for bad in ("gpu[01-03", "gpu]", "gpu[a-b]", "gpu[5-3]"):
        with pytest.raises(ConfigError):
            expand_nodelist(bad)


_prefix = st.text("abcxyz-", min_size=1, max_size=5).filter(lambda s: not s[-1].isdigit())


@given(
    prefix=_prefix,
    numbers=st.lists(st.integers(0, 999), min_size=1, max_size=20, unique=True),
    width=st.integers(1, 4),
)
def test_compressed_ranges_expand_to_exactly_the_hosts(prefix: str, numbers: list[int], width: int) -> None:
    """Compress a host set the way SLURM prints it, expand it back: the same hosts, in order."""
    numbers.sort()
    runs: list[tuple[int, int]] = []
    for n in numbers:
        if runs and runs[-1][1] == n - 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    body = ",".join(f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}" for a, b in runs)
    hosts = expand_nodelist(f"{prefix}[{body}],other")
    assert hosts == [f"{prefix}{n:0{width}d}" for n in numbers] + ["other"]
