"""Node settings: TOML (or YAML) file -> validated dataclasses, with ``AIONET_<SECTION>_<KEY>`` overrides.

Plain dataclasses rather than pydantic: the schema is small and flat, import time stays low
(``aionet`` is imported by every worker process), and we control the error text exactly
(unknown keys are named, with the closest valid key suggested).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config_yaml import is_yaml, read_yaml
from .errors import ConfigError

ENV_PREFIX = "AIONET_"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
#: keys that name files, besides any key ending in ``_file``: a relative path in a config file
#: is relative to that file's directory (see :func:`resolve_paths`)
PATH_KEYS = {
    "security": ("tls_cert", "tls_key", "tls_ca"),
    "transport.tls": ("cert", "key", "ca"),
    "transport.zmq": ("curve_allowed_clients",),
}


@dataclass
class NodeSection:
    name: str = ""
    listen: list[str] = field(default_factory=lambda: ["tcp://127.0.0.1:0"])
    join: list[str] = field(default_factory=list)
    advertise: str = ""
    join_timeout: float = 60.0  # s to keep retrying seeds that are not up yet (0 = fail at once)
    # a launched world (aionet.launch: mpirun, srun, torchrun, a StatefulSet, `aionet launch`):
    # this node's rank, and how many ranks start() waits for (0: not launched, no waiting)
    rank: int = -1
    world_size: int = 0
    # microseconds the event loop keeps polling after each message (and after a request or a
    # waiting send) before it sleeps: the reply or ack is read without waiting for the OS to
    # wake the process, at the cost of up to that much CPU per message. Over tcp:// and tls://
    # only (README "Busy polling"; aionet/core/busy_poll.py); 0: off. Launched ranks that
    # outnumber their host's cores get 0 (aionet/launch/cores.py)
    busy_poll_us: float = 200.0


@dataclass
class TransportSection:
    tcp: dict[str, Any] = field(default_factory=dict)
    tls: dict[str, Any] = field(default_factory=dict)  # tcp options + cert/key/ca (default: [security])
    zmq: dict[str, Any] = field(default_factory=dict)
    inproc: dict[str, Any] = field(default_factory=dict)
    ucx: dict[str, Any] = field(default_factory=dict)
    rdma: dict[str, Any] = field(default_factory=dict)
    connect_timeout: float = 5.0


@dataclass
class CodecSection:
    compression: str = "none"  # "none" | "lz4"
    compress_min_bytes: int = 65536
    oob_min_bytes: int = 2048  # bytes-like objects at least this large travel out of band
    # A compressed frame claiming to grow more than this is refused as a bomb before anything is
    # allocated (senders keep such frames raw). lz4 itself cannot exceed ~255; lower = stricter.
    max_compression_ratio: float = 255.0


@dataclass
class LimitsSection:
    max_message_bytes: int = 16 * 2**30  # one message, all frames together
    max_frame_bytes: int = 16 * 2**30  # one out-of-band buffer
    max_header_bytes: int = 16 * 2**20  # frame 0 (the msgpack header)
    max_frames: int = 4096  # buffers per message
    max_str_len: int = 16 * 2**20
    max_bin_len: int = 16 * 2**20
    max_array_len: int = 2**20
    max_map_len: int = 2**20
    max_depth: int = 64


@dataclass
class LinkSection:
    max_inflight_bytes: int = 256 * 2**20
    mailbox_size: int = 65536  # messages per mailbox before senders are back-pressured
    mailbox_bytes: int = 256 * 2**20  # ... or received bytes per mailbox (one larger message fits an empty one)
    handshake_timeout: float = 5.0
    give_up_after: float = 30.0
    # s a link declared dead keeps its unacknowledged messages, so that a peer that was only
    # frozen or partitioned gets them replayed when it comes back (0: give them up at once)
    death_grace: float = 30.0
    # async service handlers running at once per requesting peer; at the bound the node stops
    # reading from that peer (back-pressure, nothing dropped) until one finishes
    max_concurrent_requests: int = 1024
    # one peer's messages waiting in all mailboxes together (peers choose channel names, so
    # the per-mailbox bounds alone do not bound memory); then that peer is not read from
    peer_mailbox_bytes: int = 1024 * 2**20
    peer_mailbox_size: int = 262144
    max_handshakes: int = 128  # connections mid-handshake at once; when full the oldest is shed
    max_handshakes_per_host: int = 16  # ... from one remote host (its oldest is shed first)
    # a sent message of 1 MiB up to this many bytes is copied into link-owned buffers, so
    # `send` returns before the peer's ack and back-to-back sends overlap; larger ones are
    # sent zero-copy and `send` waits for the ack. 0 (default): never copy, every big send
    # waits for its ack; on a 2-core loopback box the copy cost more than the overlap gained
    # (BENCHMARKS.md, "Large messages"); 8 MiB suits links with a real round trip
    big_copy_max_bytes: int = 0


@dataclass
class HeartbeatSection:
    """Membership and failure detection (see aionet/membership/ for how they interact)."""

    interval: float = 0.2  # s between heartbeats to each watched peer
    phi_threshold: float = 8.0  # suspicion level that starts a verification
    min_std: float = 0.05  # s: floor on the heartbeat jitter the detector assumes
    acceptable_pause: float = 0.1  # s of extra silence always tolerated
    fanout: int = 3  # ring successors each node heartbeats (= watchers per node)
    indirect_probes: int = 3  # other members asked to probe a suspect
    probe_timeout: float = 0.5  # s a verification round waits for proof of life (more if stalls were seen)
    suspect_timeout: float = 5.0  # s an unconfirmable suspicion lasts before death
    max_piggyback: int = 6  # membership updates carried per heartbeat
    load_interval: float = 1.0  # s between load samples
    forget_after: float = 300.0  # s dead/left members stay listed
    # a responder sidecar answers for this process while its loop is busy (Linux; see
    # aionet/membership/liveness.py); a member whose loop stays blocked longer is dead
    liveness_responder: bool = True
    max_loop_stall: float = 60.0


@dataclass
class CollectivesSection:
    """``node.group()`` collectives (aionet/collectives/)."""

    small_bytes: int = 65536  # allreduce at or below this: recursive doubling; above: the ring
    segment_bytes: int = 8 * 2**20  # ring chunks travel in pieces this large (pipelined)
    # ... and in at least this many pieces per chunk, so that reducing one overlaps receiving the
    # next. 1: whole chunks (no overlap within a step): when the ranks fill one host's cores, where
    # the CPU and not the overlap sets the pace, that measured 15-30 % less CPU per byte at 16 MiB,
    # n = 4, and ~12 % at n = 2 (BENCHMARKS.md). Must be equal on every rank; launchers set 1 for
    # all the ranks of such a world (aionet.launch.cores)
    pipeline_segments: int = 2
    timeout: float = 0.0  # s a collective may take before it raises CollectiveError (0: no limit)
    # bytes a rank holds for calls it has not started yet (a root broadcasting ahead); beyond
    # it the group breaks with CollectiveError rather than the node's memory growing unbounded
    max_ahead_bytes: int = 1024 * 2**20
    # float32 allreduce on the wire: "none" | "fp16" | "bf16" (half the bytes; error bound in
    # aionet/collectives/compression.py); allreduce(compression=...) overrides it per call
    compression: str = "none"
    # allreduces of at least this many bytes go over the group's native ring (TCP streams of its
    # own, moved by compiled code: aionet/collectives/native.py) where every member listens on
    # tcp:// and has it built; 0: never. Must be equal on every rank
    native_bytes: int = 2**20


@dataclass
class SchedulerSection:
    # round-robin | least-loaded | shortest-expected | locality | learned, an ``aionet.policies``
    # entry point, or "package.module:Factory" (docs/scheduler.md, "Writing a policy")
    policy: str = "least-loaded"
    run_local: bool = True  # this node runs tasks too (false: it only submits)
    resources: dict[str, Any] = field(default_factory=dict)  # e.g. {cpu = 8, gpu = 0, memory = "16GiB", ssd = 1}
    default_retries: int = 3  # re-runs after node deaths when submit() gives no retries=
    batch_size: int = 1000  # task specs / results per message
    inline_max_bytes: int = 65536  # larger results stay on the executing node until fetched
    queue_time: float = 0.05  # seconds of queued work per slot an owner keeps on each node
    max_queued_per_slot: int = 256  # cap on that queue, in tasks per slot
    steal: bool = True  # idle nodes take queued tasks from busy ones
    steal_interval: float = 0.05  # how often idle nodes look for work and load is published
    suspect_grace: float = 0.3  # without membership: a reset connection not back within this is a dead node
    wait_for_nodes: float = 5.0  # how long a task waits when no node at all accepts tasks
    # s a node asked to leave (SIGTERM, SIGUSR1, node.drain()) keeps finishing the tasks it has
    # accepted; it takes no new ones, and what is still here after this is re-run elsewhere
    drain_timeout: float = 20.0  # (under Kubernetes' default 30 s termination grace)
    process_workers: int = 0  # processes for executor="process" (0: one per cpu)
    # task functions this node runs: module names or prefixes ("mypkg", "mypkg.tasks"); empty: none
    # (`aionet serve --app pkg.mod:setup` adds "pkg"); ["*"]: anything installed, trusted clusters only.
    # The standard library, aionet, pip/setuptools, cloudpickle and dill never run (aionet/scheduler/allow.py).
    allow_modules: list[str] = field(default_factory=list)


@dataclass
class BuffersSection:
    """Pinned staging buffers for device arrays (see aionet/core/device_transfer.py). Sizes accept
    ``"256MiB"``-style strings; :meth:`normalize` turns them into ints."""

    max_bytes: int | str = 256 * 2**20  # bound on the staging pool (in use + idle)
    pinned: str | bool = "auto"  # auto (pinned when CUDA works) | true | false
    staging_chunk_bytes: int | str = 4 * 2**20  # bytes per staged chunk / link message
    staging_depth: int = 2  # chunks being copied ahead (2 = double buffering)
    device_host_fallback: bool = True  # no GPU here: deliver device arrays as numpy (else an error)
    # collectives on device arrays reduce on host working copies, pinned and kept for the next
    # call of the same size: idle ones are bounded by this (larger arrays use plain memory once)
    scratch_max_bytes: int | str = 2**30

    def normalize(self) -> None:
        for key in ("max_bytes", "staging_chunk_bytes", "scratch_max_bytes"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise ConfigError(f'buffers.{key} must be a size such as 4194304 or "4MiB", not {value!r}')
            try:
                size = parse_size(value)
            except ConfigError:
                raise ConfigError(f'buffers.{key} must be a size such as 4194304 or "4MiB", not {value!r}') from None
            if size <= 0 and key != "scratch_max_bytes":
                raise ConfigError(f"buffers.{key} must be positive")
            if size < 0:
                raise ConfigError(f"buffers.{key} must not be negative")
            setattr(self, key, size)
        pinned = self.pinned
        if isinstance(pinned, bool):
            pinned = "true" if pinned else "false"
        if not isinstance(pinned, str) or pinned.lower() not in ("auto", "true", "false"):
            raise ConfigError(f"buffers.pinned must be 'auto', 'true' or 'false', not {self.pinned!r}")
        self.pinned = pinned.lower()
        if self.staging_depth < 1:
            raise ConfigError("buffers.staging_depth must be at least 1")
        if int(self.staging_chunk_bytes) > int(self.max_bytes):
            raise ConfigError(
                f"buffers.staging_chunk_bytes ({self.staging_chunk_bytes}) must not exceed buffers.max_bytes "
                f"({self.max_bytes}): the pool must hold at least one chunk"
            )


@dataclass
class SecuritySection:
    token_file: str = ""
    token: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    allow_pickle: bool = False


@dataclass
class HttpSection:
    """The observability server (aionet/observe): ``/``, ``/status``, ``/metrics``, ``/health``.
    ``port`` 0 = off; ``host`` is where it binds (a non-loopback host exposes cluster details);
    ``interval`` is how often the dashboard's live stream refreshes, in seconds."""

    port: int = 0
    host: str = "127.0.0.1"
    interval: float = 1.0


@dataclass
class TraceSection:
    """Always-on tracing (``aionet trace`` turns it on for a while anyway; see aionet/observe/trace.py)."""

    enabled: bool = False  # keep the last max_events trace events, ready for `aionet trace`
    max_events: int = 100_000  # ring buffer size (about 300 bytes each)


@dataclass
class LaunchSection:
    """How ``Node.from_env()`` / ``aionet serve`` read a launcher's environment (aionet/launch/)."""

    detect: bool = True  # read torchrun / MPI / SLURM / Kubernetes variables when present
    port: int = 0  # rank k listens on port + local rank (0: 7700; torchrun: MASTER_PORT + 1)
    transport: str = "tcp"  # URL scheme of the computed listen addresses
    name_format: str = "rank-{rank}"  # node names of the world's ranks
    seed_host: str = ""  # MPI over several hosts without mpi4py: the host running rank 0
    pod: str = ""  # Kubernetes pod name (default: $HOSTNAME inside a pod)
    service: str = ""  # Kubernetes headless Service (default: the StatefulSet's name)
    world_size: int = 0  # Kubernetes: the StatefulSet's replicas
    wait_timeout: float = 120.0  # s start() waits for every rank of the world to be alive


@dataclass
class LogSection:
    """``level`` sets the ``aionet`` stdlib logger's level when a Node is built ("" leaves it
    to the program; ``aionet serve`` then uses info). Library code adds no handler."""

    level: str = ""  # "" | debug | info | warning | error | critical
    format: str = "console"  # "console" | "json" (for `aionet serve`'s stderr handler)


@dataclass
class CacheSection:
    """The distributed cache (aionet/cache/, docs/cache.md)."""

    replicas: int = 2  # nodes holding each key (its primary first); 1 = no copy survives a node's death
    max_bytes: int = 1024 * 2**20  # this node's cache budget; unpinned entries are evicted LRU first
    request_timeout: float = 10.0  # s a cache call keeps retrying while a key's primary is unreachable
    settle: float = 5.0  # s after a membership change a primary asks the other replicas before a first write
    # "" = embedded (versions and locks on each key's primary replica); "etcd://host:2379": on etcd
    coordination: str = ""


@dataclass
class Config:
    node: NodeSection = field(default_factory=NodeSection)
    transport: TransportSection = field(default_factory=TransportSection)
    codec: CodecSection = field(default_factory=CodecSection)
    limits: LimitsSection = field(default_factory=LimitsSection)
    link: LinkSection = field(default_factory=LinkSection)
    heartbeat: HeartbeatSection = field(default_factory=HeartbeatSection)
    scheduler: SchedulerSection = field(default_factory=SchedulerSection)
    collectives: CollectivesSection = field(default_factory=CollectivesSection)
    buffers: BuffersSection = field(default_factory=BuffersSection)
    security: SecuritySection = field(default_factory=SecuritySection)
    http: HttpSection = field(default_factory=HttpSection)
    launch: LaunchSection = field(default_factory=LaunchSection)
    trace: TraceSection = field(default_factory=TraceSection)
    log: LogSection = field(default_factory=LogSection)
    cache: CacheSection = field(default_factory=CacheSection)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, env: Mapping[str, str] | None = None) -> Config:
        """Build from a nested mapping (as read from TOML or YAML), then apply environment overrides."""
        cfg = cls()
        _apply(cfg, data, where="")
        if env is None:
            env = os.environ
        apply_env(cfg, env)
        cfg.validate()
        return cfg

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None) -> Config:
        """Read a TOML file, or YAML when the name ends in ``.yaml``/``.yml`` (same schema and
        checks); errors name the file and the key."""
        p = Path(path)
        try:
            with p.open("rb") as fh:
                data = read_yaml(fh, p) if is_yaml(p) else tomllib.load(fh)
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {p}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: invalid TOML: {exc}") from exc
        try:
            return cls.from_dict(resolve_paths(data, p.resolve().parent), env=env)
        except ConfigError as exc:
            raise ConfigError(f"{p}: {exc}") from None

    def validate(self) -> None:
        if self.codec.compression not in ("none", "lz4"):
            raise ConfigError(f"codec.compression must be 'none' or 'lz4', not {self.codec.compression!r}")
        if not 1.0 <= self.codec.max_compression_ratio <= 255.0:
            raise ConfigError(
                f"codec.max_compression_ratio must be between 1 and 255 (lz4's own maximum), "
                f"not {self.codec.max_compression_ratio!r}"
            )
        for name in ("max_message_bytes", "max_frame_bytes", "max_header_bytes", "max_frames"):
            if getattr(self.limits, name) <= 0:
                raise ConfigError(f"limits.{name} must be positive")
        validate_heartbeat(self.heartbeat)
        co = self.collectives
        if co.small_bytes < 0 or co.segment_bytes < 4096 or not co.timeout >= 0 or co.max_ahead_bytes < 1:
            raise ConfigError(
                "collectives.small_bytes must be >= 0, collectives.segment_bytes >= 4096 and "
                "collectives.timeout >= 0 (0: no limit), collectives.max_ahead_bytes >= 1"
            )
        if co.native_bytes < 0:
            raise ConfigError(f"collectives.native_bytes must be >= 0 (0: no native ring), not {co.native_bytes!r}")
        if not 1 <= co.pipeline_segments <= 64:
            raise ConfigError(f"collectives.pipeline_segments must be between 1 and 64, not {co.pipeline_segments!r}")
        if co.compression not in ("none", "fp16", "bf16"):
            raise ConfigError(f"collectives.compression must be 'none', 'fp16' or 'bf16', not {co.compression!r}")
        if self.link.max_inflight_bytes <= 0:
            raise ConfigError("link.max_inflight_bytes must be positive")
        if self.link.big_copy_max_bytes < 0:
            raise ConfigError("link.big_copy_max_bytes must be >= 0 (0: big sends wait for the ack, never copied)")
        if not self.link.death_grace >= 0:
            raise ConfigError("link.death_grace must be >= 0 (seconds; 0 gives up at once)")
        if self.link.mailbox_bytes <= 0:
            raise ConfigError("link.mailbox_bytes must be positive")
        if self.link.max_concurrent_requests <= 0:
            raise ConfigError("link.max_concurrent_requests must be positive")
        if self.link.peer_mailbox_bytes <= 0 or self.link.peer_mailbox_size <= 0:
            raise ConfigError("link.peer_mailbox_bytes and link.peer_mailbox_size must be positive")
        if self.link.max_handshakes < 1 or self.link.max_handshakes_per_host < 1:
            raise ConfigError("link.max_handshakes and link.max_handshakes_per_host must be at least 1")
        if self.node.world_size < 0 or (self.node.world_size and not 0 <= self.node.rank < self.node.world_size):
            raise ConfigError(
                f"node.rank ({self.node.rank}) must be within node.world_size ({self.node.world_size}); "
                "world_size 0 means the node was not launched as part of a world"
            )
        if self.trace.max_events < 1:
            raise ConfigError("trace.max_events must be at least 1")
        if "{rank}" not in self.launch.name_format:
            raise ConfigError(f"launch.name_format must contain {{rank}}, not {self.launch.name_format!r}")
        if not self.scheduler.drain_timeout >= 0:
            raise ConfigError("scheduler.drain_timeout must be >= 0 seconds (0: hand back at once)")
        if not self.node.join_timeout >= 0:  # also refuses NaN
            raise ConfigError("node.join_timeout must be >= 0 seconds (0 = fail at once if no seed answers)")
        if not 0 <= self.node.busy_poll_us <= 1_000_000:
            raise ConfigError("node.busy_poll_us must be between 0 (off) and 1000000 microseconds (default 200)")
        if isinstance(self.node.listen, str):
            self.node.listen = [self.node.listen]
        if self.log.level and self.log.level.lower() not in LOG_LEVELS:
            raise ConfigError(f"log.level must be one of {', '.join(LOG_LEVELS)}, not {self.log.level!r}")
        if self.log.format not in ("console", "json"):
            raise ConfigError(f"log.format must be 'console' or 'json', not {self.log.format!r}")
        self.buffers.normalize()
        validate_cache(self.cache)
        if not 0 <= self.http.port <= 65535 or not self.http.interval > 0:
            raise ConfigError("http.port must be 0 (off) to 65535 and http.interval a positive number of seconds")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def resolve_paths(data: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """A copy of ``data`` (a config file's tables) where every relative file path is made
    relative to ``base``, the file's directory, rather than to wherever the program was
    started: ``*_file`` keys and :data:`PATH_KEYS`, in sections and in transport option tables.
    Environment overrides are not touched (they are relative to the working directory)."""

    def fix(value: Any) -> Any:
        if isinstance(value, str) and value:
            p = Path(value).expanduser()
            return str(p if p.is_absolute() else base / p)
        if isinstance(value, list):
            return [fix(v) for v in value]
        return value

    def walk(table: Mapping[str, Any], where: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in table.items():
            here = f"{where}.{key}" if where else str(key)
            if isinstance(value, Mapping):
                out[key] = walk(value, here)
            elif str(key).endswith("_file") or key in PATH_KEYS.get(where, ()):
                out[key] = fix(value)
            else:
                out[key] = value
        return out

    return walk(data, "")


def _section_types(section: Any) -> dict[str, Any]:
    return typing.get_type_hints(type(section))


def _suggest(key: str, options: list[str]) -> str:
    close = difflib.get_close_matches(key, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _apply(cfg: Config, data: Mapping[str, Any], where: str) -> None:
    sections = {f.name: f for f in dataclasses.fields(cfg)}
    unknown = [k for k in data if k not in sections]
    if unknown:
        k = unknown[0]
        raise ConfigError(
            f"unknown config section{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}"
            f"{_suggest(k, list(sections))}; valid sections: {', '.join(sections)}"
        )
    for sname, values in data.items():
        section = getattr(cfg, sname)
        if not isinstance(values, Mapping):
            raise ConfigError(f"[{sname}] must be a table")
        types = _section_types(section)
        bad = [k for k in values if k not in types]
        if bad:
            raise ConfigError(
                f"unknown key{'s' if len(bad) > 1 else ''} {', '.join(f'{sname}.{k}' for k in bad)}"
                f"{_suggest(bad[0], list(types))}; valid keys in [{sname}]: {', '.join(types)}"
            )
        for key, value in values.items():
            setattr(section, key, _coerce(value, types[key], f"{sname}.{key}"))


def _coerce(value: Any, typ: Any, name: str, key: str | None = None) -> Any:
    """``value`` as ``typ``; ``name`` says where it came from in errors, ``key`` (default: the
    name) is the setting's own name, whose ``_bytes`` ending admits sizes such as "1MiB"."""
    origin = typing.get_origin(typ)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise ConfigError(f"{name} must be a boolean, not {value!r}")
    if typ is int:
        if isinstance(value, bool):
            raise ConfigError(f"{name} must be an integer, not {value!r}")
        if isinstance(value, str) and (key or name).endswith("_bytes"):
            try:
                return parse_size(value)  # sizes may be written "256MiB"
            except ConfigError:
                raise ConfigError(f'{name} must be a size such as 1048576 or "1MiB", not {value!r}') from None
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} must be an integer, not {value!r}") from None
    if typ is float:
        if isinstance(value, bool):
            raise ConfigError(f"{name} must be a number, not {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} must be a number, not {value!r}") from None
    if typ is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be a string, not {value!r}")
        return value
    if origin is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{name} must be a list of strings, not {value!r}")
        return list(value)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{name} must be a table, not {value!r}")
        return dict(value)
    return value


def apply_env(cfg: Config, env: Mapping[str, str]) -> None:
    """Apply ``AIONET_<SECTION>_<KEY>=value`` overrides; unknown AIONET_ names are an error."""
    sections = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    for var, raw in env.items():
        if not var.startswith(ENV_PREFIX):
            continue
        rest = var[len(ENV_PREFIX) :].lower()
        sname, _, key = rest.partition("_")
        if sname not in sections or not key:
            continue  # not a config override (e.g. AIONET_LOG_LEVEL handled as log.level below)
        section = sections[sname]
        types = _section_types(section)
        if key not in types:
            raise ConfigError(f"environment variable {var}: unknown key {sname}.{key}{_suggest(key, list(types))}")
        typ = types[key]
        value: Any = raw
        if typing.get_origin(typ) is dict:
            import json

            try:
                value = json.loads(raw)
            except ValueError:
                raise ConfigError(f"environment variable {var} must be a JSON object") from None
        setattr(section, key, _coerce(value, typ, f"{sname}.{key} (from {var})", key))


def parse_size(text: str | int) -> int:
    """'2GiB' -> 2147483648. Accepts plain integers and B/KiB/MiB/GiB/TiB/KB/MB/GB suffixes."""
    if isinstance(text, int):
        return text
    s = text.strip().lower().replace(" ", "")
    units = {
        "tib": 2**40,
        "gib": 2**30,
        "mib": 2**20,
        "kib": 2**10,
        "tb": 10**12,
        "gb": 10**9,
        "mb": 10**6,
        "kb": 10**3,
        "b": 1,
    }
    for suffix, mult in units.items():
        if s.endswith(suffix):
            try:
                return int(float(s[: -len(suffix)]) * mult)
            except ValueError:
                break
    try:
        return int(s)
    except ValueError:
        raise ConfigError(f"not a size: {text!r}") from None


def validate_heartbeat(cfg: Any) -> None:
    """The ``[heartbeat]`` rules, shared by Config and a Membership built from a bare section."""
    for key in ("interval", "min_std", "probe_timeout", "suspect_timeout", "load_interval", "max_loop_stall"):
        if not getattr(cfg, key) > 0:
            raise ConfigError(f"heartbeat.{key} must be positive")
    if cfg.acceptable_pause < 0 or cfg.phi_threshold <= 0 or cfg.forget_after < 0:
        raise ConfigError("heartbeat.acceptable_pause/forget_after must be >= 0 and phi_threshold > 0")
    for key in ("fanout", "indirect_probes", "max_piggyback"):
        if getattr(cfg, key) < 0 or (key == "fanout" and cfg.fanout < 1):
            raise ConfigError(f"heartbeat.{key} must be {'at least 1' if key == 'fanout' else 'non-negative'}")


def validate_cache(cfg: CacheSection) -> None:
    """The ``[cache]`` rules."""
    if cfg.replicas < 1:
        raise ConfigError("cache.replicas must be at least 1 (2 or more survive a node's death)")
    if cfg.max_bytes <= 0:
        raise ConfigError('cache.max_bytes must be a positive size such as "1GiB"')
    for key in ("request_timeout", "settle"):
        if not getattr(cfg, key) > 0:
            raise ConfigError(f"cache.{key} must be positive (seconds)")
    if cfg.coordination:
        scheme, _, rest = cfg.coordination.partition("://")
        if scheme != "etcd" or not rest.split(":")[0].strip("/"):
            raise ConfigError(
                f'cache.coordination must be "" (embedded) or "etcd://host:port", not {cfg.coordination!r}'
            )
