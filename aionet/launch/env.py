"""Who am I in a launched job? Rank, world size and seeds from the launcher's environment.

Pure: a mapping of environment variables (and the host name) in, a :class:`LaunchInfo` out, so
every launcher's variables are tested by feeding them. Recognised, first match wins: aionet's
own (``AIONET_NODE_RANK``/``AIONET_NODE_WORLD_SIZE``, set by ``aionet launch`` or by hand),
torchrun, Open MPI, MPICH/PMI, SLURM (``srun``), and Kubernetes StatefulSets.

There is no central store and no head node. Every rank listens on a port it can compute,
``launch.port + local_rank`` (torchrun: ``MASTER_PORT + 1 + local_rank``, since torchrun's own
store holds ``MASTER_PORT``), so the seed list (the first few ranks' addresses) is known to all
and any of them lets a node in; gossip does the rest.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .cores import shared_cores_config

__all__ = ["DEFAULT_PORT", "LaunchInfo", "detect", "expand_nodelist", "expand_tasks_per_node"]

DEFAULT_PORT = 7700
#: how many ranks' addresses go in the seed list (any one reachable is enough)
SEEDS = 3
_K8S_POD = re.compile(r"^(?P<set>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-(?P<ordinal>\d+)$")


@dataclass(frozen=True)
class LaunchInfo:
    """This process's place in a launched world, and the node settings that follow from it."""

    launcher: str  # aionet | torchrun | openmpi | pmi | slurm | kubernetes
    rank: int
    world_size: int
    local_rank: int = 0
    local_world_size: int = 1
    name: str = ""
    listen: str = ""
    advertise: str = ""
    seeds: tuple[str, ...] = ()
    name_format: str = "rank-{rank}"
    extra: dict[str, Any] = field(default_factory=dict)
    #: the host's core count, the same for every rank on it (0: not known)
    host_cores: int = 0

    def config(self) -> dict[str, dict[str, Any]]:
        """Node settings as a config mapping (lowest precedence: files, AIONET_* and arguments win).

        A world that runs on one host and fills its cores also gets whole ring chunks
        (:mod:`aionet.launch.cores`): every rank sees the same world size and core count, so
        every rank decides alike. Ranks that outnumber their host's cores get no busy polling
        (a per-node setting: decided from the ranks on this host, across hosts too)."""
        node: dict[str, Any] = {"rank": self.rank, "world_size": self.world_size}
        if self.name:
            node["name"] = self.name
        if self.listen:
            node["listen"] = [self.listen]
        if self.advertise:
            node["advertise"] = self.advertise
        if self.seeds:
            node["join"] = list(self.seeds)
        out: dict[str, dict[str, Any]] = {"node": node, "launch": {"name_format": self.name_format}}
        for section, values in shared_cores_config(self.world_size, self.host_cores, self.local_world_size).items():
            out.setdefault(section, {}).update(values)
        return out


def _int(env: Mapping[str, str], var: str) -> int | None:
    raw = env.get(var)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {var}={raw!r} is not an integer") from None


def _or(value: int | None, default: int) -> int:
    """A launcher that does not say the local rank runs the whole world on one host: rank = local rank."""
    return default if value is None else value


def _check(launcher: str, rank: int, world: int) -> None:
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"{launcher}: rank {rank} is not within a world of size {world}")


def _url(scheme: str, host: str, port: int) -> str:
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{scheme}://{host}:{port}"


def _world(
    launcher: str,
    *,
    rank: int,
    world: int,
    local_rank: int,
    local_world: int,
    base: int,
    scheme: str,
    name_format: str,
    hostname: str,
    seed_hosts: list[str] | None,
    cores: int = 0,
) -> LaunchInfo:
    """Addresses for a world whose ranks listen on ``base + local_rank`` of their host.

    ``seed_hosts`` are hosts known to run local rank 0 (the first few nodes); None means the
    whole world shares this host, which then uses loopback only (no token needed)."""
    _check(launcher, rank, world)
    port = base + local_rank
    if seed_hosts is None:
        listen = _url(scheme, "127.0.0.1", port)
        advertise = ""
        seeds = [_url(scheme, "127.0.0.1", base + r) for r in range(min(world, SEEDS))]
    else:
        listen = _url(scheme, "0.0.0.0", port)
        advertise = _url(scheme, hostname, port)
        seeds = [_url(scheme, h, base) for h in seed_hosts[:SEEDS]]
        # ranks on this host: reachable without DNS, and seeds too
        seeds += [_url(scheme, "127.0.0.1", base + r) for r in range(min(local_world, SEEDS)) if r != local_rank]
    return LaunchInfo(
        launcher=launcher,
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=local_world,
        name=name_format.format(rank=rank),
        listen=listen,
        advertise=advertise,
        seeds=tuple(dict.fromkeys(seeds)),
        name_format=name_format,
        host_cores=cores,
    )


def expand_nodelist(spec: str) -> list[str]:
    """SLURM's compressed host list: ``"gpu[01-03,07],login1"`` -> gpu01, gpu02, gpu03, gpu07, login1.

    Several bracket groups in one name multiply out (``r[1-2]n[1-2]``); zero padding is kept."""
    out: list[str] = []
    for part in _split_top(spec.strip()):
        out.extend(_expand_one(part))
    return out


def _split_top(spec: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in spec:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"SLURM node list {spec!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise ConfigError(f"SLURM node list {spec!r}: unbalanced '['")
    parts.append("".join(cur))
    return [p for p in parts if p]


def _expand_one(name: str) -> list[str]:
    start = name.find("[")
    if start < 0:
        return [name]
    end = name.find("]", start)
    prefix, body, rest = name[:start], name[start + 1 : end], name[end + 1 :]
    items: list[str] = []
    for piece in body.split(","):
        lo, sep, hi = piece.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ConfigError(f"SLURM node list: cannot read range {piece!r} in {name!r}")
        if not sep:
            items.append(lo)
            continue
        width = len(lo)
        if int(hi) < int(lo):
            raise ConfigError(f"SLURM node list: range {piece!r} in {name!r} runs backwards")
        if int(hi) - int(lo) > 100_000:
            raise ConfigError(f"SLURM node list: range {piece!r} in {name!r} is implausibly large")
        items.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
    return [prefix + item + tail for item in items for tail in _expand_one(rest)]


def expand_tasks_per_node(spec: str) -> list[int]:
    """SLURM_TASKS_PER_NODE: ``"2(x3),1"`` -> [2, 2, 2, 1]."""
    out: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ConfigError(f"SLURM_TASKS_PER_NODE={spec!r}: cannot read {part!r}")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


def detect(
    env: Mapping[str, str],
    hostname: str = "localhost",
    *,
    options: Mapping[str, Any] | None = None,
    namespace_file: str | None = None,
    cores: int = 0,
) -> LaunchInfo | None:
    """The launcher this process runs under, or None when it was started by hand.

    ``options`` are the ``[launch]`` settings (port, transport, name_format, seed_host, pod,
    world_size, service); ``namespace_file`` is the text of Kubernetes' service-account namespace
    file, when there is one; ``cores`` the host's core count (0: unknown). Both are read by the
    caller: this function does no I/O."""
    opts = dict(options or {})
    scheme = str(opts.get("transport") or "tcp")
    name_format = str(opts.get("name_format") or "rank-{rank}")
    base = int(opts["port"]) if opts.get("port") else None
    common: dict[str, Any] = {"scheme": scheme, "name_format": name_format, "hostname": hostname, "cores": cores}

    # aionet's own: `aionet launch` (or a user) set rank and world size; listen/join come from AIONET_NODE_*
    rank, world = _int(env, "AIONET_NODE_RANK"), _int(env, "AIONET_NODE_WORLD_SIZE")
    if rank is not None and world is not None and world > 0:
        _check("AIONET_NODE_RANK", rank, world)
        return LaunchInfo("aionet", rank, world, name=name_format.format(rank=rank), name_format=name_format)

    # torchrun / torch.distributed.run
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    if rank is not None and world is not None and ("MASTER_ADDR" in env or "TORCHELASTIC_RUN_ID" in env):
        local_rank = _or(_int(env, "LOCAL_RANK"), rank)
        local_world = _int(env, "LOCAL_WORLD_SIZE") or world
        master_port = _int(env, "MASTER_PORT")
        port = base if base is not None else (master_port + 1 if master_port else DEFAULT_PORT)
        master = env.get("MASTER_ADDR", "127.0.0.1")
        single = local_world == world
        return _world(
            "torchrun", rank=rank, world=world, local_rank=local_rank, local_world=local_world,
            base=port, seed_hosts=None if single else [master], **common,
        )  # fmt: skip

    # Open MPI
    rank, world = _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE")
    if rank is not None and world is not None:
        local_rank = _or(_int(env, "OMPI_COMM_WORLD_LOCAL_RANK"), rank)
        local_world = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE") or world
        return _mpi("openmpi", rank, world, local_rank, local_world, base, str(opts.get("seed_host") or ""), common)

    # MPICH / Intel MPI (Hydra's PMI)
    rank, world = _int(env, "PMI_RANK"), _int(env, "PMI_SIZE")
    if rank is not None and world is not None:
        local_rank = _or(_int(env, "MPI_LOCALRANKID"), rank)
        local_world = _int(env, "MPI_LOCALNRANKS") or world
        return _mpi("pmi", rank, world, local_rank, local_world, base, str(opts.get("seed_host") or ""), common)

    # SLURM (srun): a batch script alone has SLURM_PROCID too, so a job step is required
    rank = _int(env, "SLURM_PROCID")
    world = _int(env, "SLURM_NTASKS") or _int(env, "SLURM_NPROCS")
    if rank is not None and world is not None and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env):
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
        hosts = expand_nodelist(nodelist) if nodelist else []
        local_rank = _or(_int(env, "SLURM_LOCALID"), rank)
        tasks = expand_tasks_per_node(env["SLURM_STEP_TASKS_PER_NODE"]) if env.get("SLURM_STEP_TASKS_PER_NODE") else []
        node_id = _int(env, "SLURM_NODEID") or 0
        local_world = tasks[node_id] if node_id < len(tasks) else world
        me = env.get("SLURMD_NODENAME") or hostname
        return _world(
            "slurm", rank=rank, world=world, local_rank=local_rank, local_world=local_world,
            base=base if base is not None else DEFAULT_PORT,
            seed_hosts=None if len(hosts) <= 1 else hosts, **{**common, "hostname": me},
        )  # fmt: skip

    # Kubernetes StatefulSet: pod "<set>-<ordinal>" behind a headless Service
    pod = str(opts.get("pod") or "") or (env.get("HOSTNAME", hostname) if "KUBERNETES_SERVICE_HOST" in env else "")
    m = _K8S_POD.match(pod) if pod else None
    if m is not None:
        world = int(opts.get("world_size") or 0) or None
        if world is None:  # a StatefulSet configured by its own files (deploy/k8s/ is): no launched world
            return None
        service = str(opts.get("service") or "") or m.group("set")
        ns = env.get("POD_NAMESPACE") or (namespace_file or "").strip() or "default"
        port = base if base is not None else DEFAULT_PORT
        rank = int(m.group("ordinal"))
        _check("kubernetes", rank, world)

        def dns(i: int) -> str:
            return f"{m.group('set')}-{i}.{service}.{ns}.svc.cluster.local"

        return LaunchInfo(
            "kubernetes",
            rank,
            world,
            name=pod,
            listen=_url(scheme, "0.0.0.0", port),
            advertise=_url(scheme, dns(rank), port),
            seeds=tuple(_url(scheme, dns(i), port) for i in range(min(world, SEEDS)) if i != rank),
            name_format=m.group("set") + "-{rank}",
        )
    return None


def _mpi(
    launcher: str,
    rank: int,
    world: int,
    local_rank: int,
    local_world: int,
    base: int | None,
    seed: str,
    common: dict[str, Any],
) -> LaunchInfo:
    port = base if base is not None else DEFAULT_PORT
    if local_world == world:
        return _world(
            launcher, rank=rank, world=world, local_rank=local_rank, local_world=local_world,
            base=port, seed_hosts=None, **common,
        )  # fmt: skip
    # several hosts: MPI does not tell which host runs rank 0; the caller may learn it over MPI
    # itself (see aionet.launch.bootstrap) or the user names a seed
    if not seed:
        raise ConfigError(
            f"{launcher}: this world spans several hosts and the host of rank 0 is unknown; install mpi4py "
            "(aionet then asks MPI) or set AIONET_LAUNCH_SEED_HOST to the host that runs rank 0"
        )
    return _world(
        launcher, rank=rank, world=world, local_rank=local_rank, local_world=local_world,
        base=port, seed_hosts=[seed], **common,
    )  # fmt: skip
