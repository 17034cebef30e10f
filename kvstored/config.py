"""Typed configuration and the one loader.

Precedence: defaults < TOML file (``--config``) < env vars ``KVSTORED_<SECTION>__<FIELD>``
(e.g. ``KVSTORED_NODE__DRAM_SIZE_BYTES=2GiB``) < CLI flags, layered by pydantic-settings:
:class:`KvstoredConfig` is a ``BaseSettings`` whose sources are the flags (init kwargs), the
environment and the TOML file, in that order of priority. Unknown keys are errors that name
the key. Sizes accept human strings (``"64GiB"``) through one parser,
:func:`kvstored.units.parse_size`, and are stored as int ``*_bytes``.
:func:`load_effective_config` says where each value came from (``kvstored config show``).

Validation happens in three steps, all before a port is bound or memory is allocated:

1. per field (types, ranges, non-empty paths, the 32-bit gRPC message limit);
2. across fields (:meth:`NodeConfig._check_combinations`: key length range, a block must fit
   in the DRAM tier);
3. against the host (:func:`check_node_host`: the SSD cap must fit on the SSD's filesystem,
   the arena group must exist), run by the daemon's start path.

Every error names the key; a key set by an env var or a flag also names that variable or
flag (``node.dram_size_bytes (env var KVSTORED_NODE__DRAM_SIZE_BYTES)``).

Example TOML::

    [node]
    listen = ["unix:/run/kvstored/node.sock", "127.0.0.1:7070"]
    dram_size_bytes = "8GiB"
    ssd_dir = "/var/lib/kvstored/ssd"
    ssd_size_bytes = "200GiB"
"""

from __future__ import annotations

import grp
import os
import pathlib
import re
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import platformdirs
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from kvstored.addresses import default_socket_path
from kvstored.errors import ConfigInvalid, InvalidArgument
from kvstored.tenancy import TenantQuota, check_tenant
from kvstored.units import format_size, parse_size

DEFAULT_GRPC_PORT = 7070
DEFAULT_DATA_PORT = 7071
DEFAULT_METRICS_PORT = 7072

GRPC_MAX_MESSAGE_BYTES = (1 << 31) - 1
"""gRPC's message size options are 32-bit signed ints."""
GRPC_SLACK_BYTES = 1 << 20
"""Room for the rest of a Put/Get message beyond its payload."""
MAX_BLOCK_BYTES_LIMIT = GRPC_MAX_MESSAGE_BYTES - GRPC_SLACK_BYTES
"""Largest ``max_block_bytes`` / ``max_inline_bytes`` (2 GiB - 1 MiB - 1 byte): an inline Put
carries a whole block in one gRPC message."""
DEFAULT_MAX_BLOCK_BYTES = 64 << 20
MAX_NODE_ID_CHARS = 128
NODE_ID_RE = re.compile(rf"[\x21-\x7e]{{1,{MAX_NODE_ID_CHARS}}}")
"""What a node id may be (the master refuses others): 1..128 printable ASCII characters,
no spaces (a host name fits)."""


def node_id_problem(node_id: str) -> str | None:
    """Why ``node_id`` is not a valid node id (without the value), or None when it is."""
    if NODE_ID_RE.fullmatch(node_id):
        return None
    return f"must have 1..{MAX_NODE_ID_CHARS} printable ASCII characters without spaces"
PAGE_BYTES = 4096
"""The DRAM arena is a whole number of pages; blocks occupy whole pages of it."""


def _size(v: Any) -> int:
    try:
        return parse_size(v)
    except InvalidArgument as exc:
        raise ValueError(str(exc)) from None


Size = Annotated[int, BeforeValidator(_size)]


def _grpc_limit(v: int) -> int:
    if v > MAX_BLOCK_BYTES_LIMIT:
        raise ValueError(
            f"is {v} bytes ({format_size(v)}); the limit is {MAX_BLOCK_BYTES_LIMIT} bytes "
            "(2 GiB - 1 MiB - 1: gRPC message sizes are 32-bit and an inline put carries a "
            "whole block in one message)"
        )
    return v


GrpcSize = Annotated[Size, AfterValidator(_grpc_limit)]


def _mode(v: Any) -> int:
    """File mode: an int (TOML ``0o660``) or an octal string (``"0660"``, ``"0o660"``)."""
    if isinstance(v, str):
        text = v.strip().lower().removeprefix("0o")
        try:
            v = int(text, 8)
        except ValueError:
            raise ValueError("is not an octal file mode such as 0660") from None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 0o777:
        raise ValueError("must be a file mode between 0 and 0o777 (e.g. 0o660)")
    return v


FileMode = Annotated[int, BeforeValidator(_mode)]


def _round_down_page(n: int) -> int:
    return n // PAGE_BYTES * PAGE_BYTES


def _round_up_page(n: int) -> int:
    return -(-n // PAGE_BYTES) * PAGE_BYTES


def default_ssd_dir() -> pathlib.Path:
    """SSD tier directory under the user's data dir."""
    return pathlib.Path(platformdirs.user_data_dir("kvstored")) / "ssd"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class NodeConfig(_Model):
    """Settings of one node daemon (``[node]`` in the TOML file)."""

    node_id: str = Field(default_factory=lambda: os.uname().nodename)
    """Node name shown by kvstorectl; default: the host name."""
    zone: str = ""
    """This node's failure domain (a rack, a host group; ``kvstored node --zone``), sent to
    the master when it registers: replicas of one block go to distinct zones first. "" =
    none declared (the node is its own domain)."""
    listen: list[str] = Field(
        default_factory=lambda: [f"unix:{default_socket_path()}", f"127.0.0.1:{DEFAULT_GRPC_PORT}"]
    )
    """gRPC listen addresses: ``unix:PATH`` or ``HOST:PORT`` (loopback by default)."""
    data_address: str = f"127.0.0.1:{DEFAULT_DATA_PORT}"
    """TCP data-plane listen address (bulk bytes for clients without the arena); port 0 = any."""
    dataplane_request_timeout_s: float = Field(default=30.0, gt=0)
    """Longest one data-plane request may take as a whole, from its first byte to the last
    byte of its response, seconds (not per socket call: a peer trickling bytes cannot stretch
    it). When it passes, the request's pins and reservations are released and the connection
    is closed. Default 30 s."""
    dataplane_min_bytes_per_s: Size = Field(default=64 << 20, gt=0)
    """Slowest transfer a data-plane request is allowed, bytes/s: its deadline is
    ``dataplane_request_timeout_s`` plus its payload at this rate (a PUT's announced sizes; a
    GET's blocks as each chunk is pinned), so large requests are not cut while a trickling
    peer still is. Default 64 MiB/s."""
    dataplane_max_connections: int = Field(default=1024, gt=0)
    """Data-plane connections served at once; more are refused with UNAVAILABLE."""
    dataplane_idle_timeout_s: float = Field(default=60.0, gt=0)
    """An idle data-plane connection (between requests) is closed after this long, seconds."""
    dataplane_max_header_bytes: Size = Field(default=64 << 20, ge=64 << 10)
    """Most bytes of request bodies (keys, metas) buffered at once over all data-plane
    connections; a request waits (within its deadline) for its share, and one announcing more
    than this is refused at once. Default 64 MiB."""
    dataplane_max_request_bytes: Size = Field(default=1 << 30, ge=256 << 20)
    """Largest sum of payload sizes one data-plane PUT may announce, skipped items included,
    bytes (at least ``max_block_bytes`` is always allowed). A larger announcement is refused
    before anything is reserved or read. Default 1 GiB; at least 256 MiB, the client's chunk."""
    metrics_address: str = f"127.0.0.1:{DEFAULT_METRICS_PORT}"
    """Prometheus /metrics listen address; empty string disables it."""
    dram_size_bytes: Size = Field(default=1 << 30, gt=0)
    """Hard cap of the DRAM tier (shared-memory arena), bytes. Default 1 GiB."""
    arena_dir: pathlib.Path = pathlib.Path("/dev/shm")
    """Directory (tmpfs) holding the shared-memory arena file."""
    arena_mode: FileMode = 0o600
    """Mode of the arena file (octal). Local clients map it read-write, so a client running
    as another user needs ``0o660`` plus membership of ``arena_group``. Default 0o600 (only
    the daemon's user)."""
    shm_tenants: list[str] | None = None
    """Tenants whose clients may use the shared-memory arena (docs/tenants.md). The arena is
    one file holding every tenant's blocks, readable by every process that maps it; with a
    list, a client of another tenant is told there is no arena (Describe) and its pins and
    reservations are refused, so it falls back to the TCP data plane or inline gRPC. Pair it
    with ``arena_group`` (the group of those tenants' engines) so the OS refuses the file to
    everyone else. None (default): every tenant may use it."""
    arena_group: str | None = None
    """Group (name or numeric gid) of the arena file. None: the group of the first unix
    socket when ``arena_mode`` grants the group access (so whoever may connect may map),
    else the daemon's group."""
    socket_mode: FileMode | None = None
    """Mode of the unix sockets (octal); connecting needs write permission, so clients of
    the socket's group need ``0o660``. None keeps what the umask gives (usually 0o755: only
    the daemon's user can connect)."""
    ssd_dir: pathlib.Path | None = Field(default_factory=default_ssd_dir)
    """SSD tier directory; None disables the SSD tier."""
    ssd_size_bytes: Size = Field(default=4 << 30, ge=0)
    """Hard cap of the SSD tier, bytes. Default 4 GiB; 0 disables the SSD tier."""
    ssd_direct_io: bool = True
    """Read SSD blocks with O_DIRECT when the filesystem supports it."""
    max_block_bytes: GrpcSize = Field(default=DEFAULT_MAX_BLOCK_BYTES, gt=0)
    """Largest block accepted, bytes. At most the DRAM tier and at most
    ``MAX_BLOCK_BYTES_LIMIT`` (2 GiB - 1 MiB - 1). Default 64 MiB, or the DRAM tier's size
    when that is smaller."""
    max_batch_keys: int = Field(default=8192, gt=0)
    """Most keys in one batched call."""
    max_inline_bytes: GrpcSize = Field(default=1 << 20, ge=0)
    """Largest total payload carried inline in one gRPC Put/Get; larger goes via arena/TCP."""
    min_key_bytes: int = Field(default=16, gt=0)
    """Shortest key accepted (128-bit block hashes)."""
    max_key_bytes: int = Field(default=64, gt=0)
    """Longest key accepted."""
    pin_lease_s: float = Field(default=30.0, gt=0)
    """Default lease of a shared-memory pin / put reservation, seconds. A lease that lapses
    puts its space in quarantine (never straight back in the free pool) until the client's
    session ends or it acknowledges (kvstored/node/sessions.py)."""
    max_quarantine_bytes_per_session: Size = Field(default=1 << 30, ge=0)
    """Most quarantined bytes (lapsed pins/reservations not yet acknowledged) one client
    session may hold; over it, that session's new pins and reservations get NoCapacity.
    Default 1 GiB."""
    max_slot_bytes_per_session: Size = Field(default=256 << 20, ge=0)
    """Most arena bytes of reserve-ahead slots one client session holds at once (granted in
    advance for its next puts; counted as reserved room, returned when the session ends;
    kvstored/node/slots.py). At most half of ``max_quarantine_bytes_per_session`` is granted,
    so an idle client's lapsed pool stays within that bound. 0 turns reserve-ahead off (each
    shared-memory put then costs a ReservePut and a CommitPut). Default 256 MiB."""
    drain_grace_s: float = Field(default=10.0, ge=0)
    """On SIGTERM: how long in-flight requests may take to finish, seconds."""
    spill_on_shutdown: bool = True
    """On SIGTERM: demote DRAM-only blocks to the SSD tier so they survive a restart."""
    log_json: bool = False
    """Render logs as JSON lines (set under systemd); ``log_format``, when set, wins."""
    log_format: Literal["json", "console"] | None = None
    """``json`` (one object per line, for journald) or ``console``; None follows
    ``log_json``. Every library's stdlib logging lines come out in the same format."""
    log_level: str = "info"
    """debug, info, warning or error."""

    @property
    def log_as_json(self) -> bool:
        """Whether logs are JSON lines (``log_format``, else ``log_json``)."""
        return self.log_format == "json" if self.log_format is not None else self.log_json

    _sources: dict[str, str] = PrivateAttr(default_factory=dict)
    """Where each explicitly set field came from (``"env var KVSTORED_NODE__X"``), for errors."""

    @field_validator("node_id")
    @classmethod
    def _node_id_valid(cls, v: str) -> str:
        problem = node_id_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v

    @field_validator("zone")
    @classmethod
    def _zone_valid(cls, v: str) -> str:
        if v and not NODE_ID_RE.fullmatch(v):
            raise ValueError(f"must be empty or have 1..{MAX_NODE_ID_CHARS} printable ASCII "
                             "characters without spaces")
        return v

    @field_validator("ssd_dir", "arena_dir", mode="before")
    @classmethod
    def _path_not_empty(cls, v: Any) -> Any:
        if isinstance(v, (str, pathlib.PurePath)) and not str(v).strip():
            raise ValueError(
                "is empty (it would silently mean the current directory); give a directory"
                " (to run without an SSD tier set node.ssd_size_bytes = 0)"
            )
        return v

    @field_validator("shm_tenants")
    @classmethod
    def _tenant_names(cls, v: list[str] | None) -> list[str] | None:
        for t in v or ():
            try:
                check_tenant(t, what="a tenant of node.shm_tenants")
            except InvalidArgument as exc:
                raise ValueError(str(exc)) from None
        return v

    @field_validator("arena_group", mode="before")
    @classmethod
    def _group_not_empty(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            return str(v)
        if isinstance(v, str) and not v.strip():
            raise ValueError("is empty; give a group name or gid, or leave it unset")
        return v

    @model_validator(mode="after")
    def _check_combinations(self) -> NodeConfig:
        """Cross-field rules (errors carry the keys involved in ``ctx["keys"]``)."""
        if self.min_key_bytes > self.max_key_bytes:
            raise PydanticCustomError(
                "config_conflict",
                "node.min_key_bytes ({min_key}) is larger than node.max_key_bytes ({max_key}): "
                "no key could be accepted; lower node.min_key_bytes or raise node.max_key_bytes",
                {"keys": ("min_key_bytes", "max_key_bytes"), "min_key": self.min_key_bytes,
                 "max_key": self.max_key_bytes},
            )
        arena_bytes = _round_down_page(self.dram_size_bytes)
        if "max_block_bytes" not in self.model_fields_set:
            # the default follows a small DRAM tier instead of refusing to start
            self.max_block_bytes = max(1, min(DEFAULT_MAX_BLOCK_BYTES, arena_bytes))
        elif _round_up_page(self.max_block_bytes) > arena_bytes:
            raise PydanticCustomError(
                "config_conflict",
                "node.max_block_bytes ({block}) is larger than the DRAM tier, node.dram_size_bytes "
                "({dram}, {arena} bytes of whole 4 KiB pages): such a block could never be "
                "stored; lower node.max_block_bytes or raise node.dram_size_bytes",
                {"keys": ("max_block_bytes", "dram_size_bytes"), "block": self.max_block_bytes,
                 "dram": self.dram_size_bytes, "arena": arena_bytes},
            )
        return self

    def describe_key(self, field: str) -> str:
        """``node.<field>``, plus the env var or flag that set it (for error messages)."""
        source = self._sources.get(field)
        return f"node.{field} ({source})" if source else f"node.{field}"


DEFAULT_MASTER_PORT = 7080


def default_master_data_dir() -> pathlib.Path:
    """Where the master keeps its small state file by default."""
    return pathlib.Path(platformdirs.user_data_dir("kvstored")) / "master"


class MasterConfig(_Model):
    """Settings of the metadata master (``[master]`` in the TOML file)."""

    listen: list[str] = Field(default_factory=lambda: [f"127.0.0.1:{DEFAULT_MASTER_PORT}"])
    """gRPC listen addresses (``HOST:PORT``; port 0 = any); loopback by default."""
    data_dir: pathlib.Path = Field(default_factory=default_master_data_dir)
    """Directory of the master's state file (its last start epoch)."""
    node_lease_s: float = Field(default=10.0, gt=0)
    """A node silent for this long leaves the cluster, seconds. Default 10."""
    write_lease_s: float = Field(default=30.0, gt=0)
    """A put started and not ended within this is aborted, seconds. Default 30."""
    unhealthy_after_failures: int = Field(default=3, ge=1)
    """Consecutive data-plane failures after which a node is unhealthy. Default 3."""
    unhealthy_retry_s: float = Field(default=0.0, ge=0)
    """An unhealthy node that keeps heartbeating is tried again (on probation: readable, not
    placed on until a transfer with it succeeds) after this long, seconds; 0 (the default) =
    one ``node_lease_s``. A failure on probation marks it unhealthy again and doubles this."""
    unhealthy_retry_max_s: float = Field(default=0.0, ge=0)
    """Cap of the doubled retry time, seconds; 0 (the default) = 8 x the retry time."""
    placement_policy: Literal["local-first", "most-free", "random"] = "local-first"
    """Default placement policy of new replicas."""
    gc_interval_s: float = Field(default=1.0, gt=0)
    """How often lapsed leases are expired and dropped replicas unlinked, seconds."""
    metrics_listen: str = ""
    """``HOST:PORT`` of the master's Prometheus ``/metrics`` (port 0 = any); empty (the
    default) disables it. The node units use 7072, so ``127.0.0.1:7082`` is suggested."""
    repair_bytes_per_s: Size = Field(default=256 << 20, gt=0)
    """Bytes per second of copy commands the repair, drain and hot-block replication queue
    at most, cluster-wide (a human size: ``"256MiB"``, the default), so re-replication never
    starves engine traffic; one block larger than a second's worth still goes, alone."""
    command_resend_s: float = Field(default=0.0, ge=0)
    """A command sent to a node and not acknowledged is sent again after this many seconds;
    0 (the default) = one node lease."""
    hot_reads_per_window: int = Field(default=0, ge=0)
    """A block looked up from another node than its holders more than this many times within
    ``hot_window_s`` gets one extra replica on the reading node; 0 (the default) = off."""
    hot_window_s: float = Field(default=10.0, gt=0)
    """The window of ``hot_reads_per_window``, seconds."""
    hot_max_extra_replicas: int = Field(default=2, ge=0)
    """At most this many extra replicas per block beyond its replication factor come from
    hot-block replication."""
    etcd: list[str] = Field(default_factory=list)
    """etcd client endpoints (``http://HOST:PORT`` or ``HOST:PORT``) to elect a leader through;
    empty (the default) = this master runs alone and always leads (docs/cluster.md, HA)."""
    election_prefix: str = "/kvstored"
    """etcd key prefix of the election (its key is ``PREFIX/leader``): masters of one cluster
    share it; another cluster on the same etcd uses another. Default ``/kvstored``."""
    election_lease_s: int = Field(default=5, ge=1, le=300)
    """TTL of the leader's etcd lease, whole seconds: a dead leader is replaced within about
    this long; a leader cut off from etcd stops answering before it lapses. Default 5."""
    events_endpoint: str = ""
    """ZeroMQ PUB address the master binds to publish KV events for routers, in vLLM's
    format (``tcp://HOST:PORT``, port 0 = any; docs/cluster.md "KV events"); empty (the
    default) = off."""
    events_replay_endpoint: str = ""
    """ZeroMQ ROUTER address answering replay requests (a start seq) with the buffered
    batches; empty (the default) = no replay. Needs ``events_endpoint``."""
    events_buffer_steps: int = Field(default=10_000, ge=1)
    """Batches kept for replay. Default 10000."""
    events_max_blocks: int = Field(default=256, ge=1)
    """Blocks per event batch at most. Default 256."""
    events_batch_ms: float = Field(default=10.0, ge=0)
    """A block event is sent at most this long after the index changed, milliseconds.
    Default 10."""
    scheduler: bool = True
    """Host the SLO-aware SchedulerService on the master's listen addresses, its block
    locations read from this master's index (docs/scheduler.md "On a cluster"). Default on."""
    scheduler_block_tokens: int = Field(default=256, gt=0)
    """Tokens per block in the scheduler's cost model (the engines' block size; a vLLM
    engine's ``block_size``). Default 256."""
    scheduler_copy_timeout_s: float = Field(default=10.0, gt=0)
    """Deadline of one copy the scheduler plans (the prefix's blocks to the prefill node),
    seconds. Default 10."""
    log_json: bool = False
    """Render logs as JSON lines (set under systemd); ``log_format``, when set, wins."""
    log_format: Literal["json", "console"] | None = None
    """``json`` (one object per line, for journald) or ``console``; None follows
    ``log_json``. Every library's stdlib logging lines come out in the same format."""
    log_level: str = "info"
    """debug, info, warning or error."""

    @property
    def log_as_json(self) -> bool:
        """Whether logs are JSON lines (``log_format``, else ``log_json``)."""
        return self.log_format == "json" if self.log_format is not None else self.log_json
    @model_validator(mode="after")
    def _check_events(self) -> MasterConfig:
        if self.events_replay_endpoint and not self.events_endpoint:
            raise ValueError("master.events_replay_endpoint needs master.events_endpoint "
                             f"(got replay {self.events_replay_endpoint!r} and no endpoint)")
        return self


class ClusterConfig(_Model):
    """A node's link to the master (``[cluster]`` in the TOML file)."""

    master_address: str = ""
    """``HOST:PORT`` of the master, ``HOST:PORT,HOST:PORT,...`` of several (the node follows
    the leader), or ``etcd://HOST:PORT[,HOST:PORT]/PREFIX`` (the leader elected under PREFIX);
    empty = a standalone node (no cluster)."""
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    """Seconds between heartbeats (capped at a third of the master's node lease)."""
    rpc_timeout_s: float = Field(default=5.0, gt=0)
    """Deadline of each call to the master, seconds."""
    inventory_chunk_blocks: int = Field(default=4096, gt=0)
    """Blocks per SyncInventory chunk."""
    remote_fetch_timeout_s: float = Field(default=2.0, gt=0)
    """Most seconds a read may spend finding and copying blocks from peers (the caller's
    own deadline may cut it shorter); past it the blocks are misses."""
    peer_pool_size: int = Field(default=4, gt=0)
    """Idle data-plane connections kept open per peer for remote reads."""
    spill_enabled: bool = True
    """Move this node's coldest blocks to peers with room when its last tier (SSD when
    configured, else DRAM) passes ``spill_high_watermark`` (kvstored/node/spill.py)."""
    spill_high_watermark: float = Field(default=0.90, gt=0, le=1)
    """Fraction of the last tier's capacity past which the node spills."""
    spill_low_watermark: float = Field(default=0.80, gt=0, le=1)
    """The node spills until its last tier is at or below this fraction."""
    spill_batch_blocks: int = Field(default=8, gt=0, le=1024)
    """Blocks moved per batch (one master round trip each, one data-plane PUT per peer)."""
    spill_interval_s: float = Field(default=0.5, gt=0)
    """Seconds between two checks of the watermark."""
    spill_timeout_s: float = Field(default=10.0, gt=0)
    """Deadline of one batch's data-plane transfer, seconds."""
    spill_put_wait_s: float = Field(default=2.0, ge=0)
    """Backpressure: the longest a local put (or a promotion) that would evict a block the
    pool holds nowhere else waits for the spiller to move blocks to peers, seconds (0: never
    wait, evict at once as before)."""
    spill_peer_view_s: float = Field(default=2.0, gt=0)
    """Seconds between refreshes of the spiller's cached peer view (ListNodes), which it
    spills to while the master cannot be reached (and which names the peers' coldest ages
    for pool LRU)."""
    pool_lru_enabled: bool = True
    """Pool LRU when the whole pool is full: a node that must evict a block the pool holds
    nowhere else hands it to a peer whose coldest such block is older (by more than
    ``pool_lru_margin_s``), which evicts that one instead; false = each node evicts its own
    coldest (docs/cluster.md "Pool LRU")."""
    pool_lru_margin_s: float = Field(default=1.0, ge=0)
    """How much older (seconds since last use) a peer's coldest original must be than ours
    before a hand-off is tried: hysteresis, so near-equal ages do not move blocks for
    nothing."""
    default_replicas: int = Field(default=1, ge=1, le=8)
    """Replicas a put wants when the client names none and its namespace is not in
    ``namespace_replicas`` (1 = only the writer's node; see docs/cluster.md "Replicas")."""
    namespace_replicas: dict[str, int] = Field(default_factory=dict)
    """Per namespace (its id in hex, 32 digits, as ``kvstorectl where`` prints it): the
    replicas a put of that namespace wants when the client names none (1..8)."""
    suspect_holder_s: float = Field(default=5.0, ge=0)
    """Seconds a peer whose data plane failed a read's transfer (connect refused or reset,
    no answer in time) stays *suspect*: lookups ask the master to rank its replicas last
    and the read tries the block's other holders first; a successful transfer clears it
    (kvstored/node/suspects.py). It only reorders: a block held only there is still tried.
    0 = off (failed holders are not remembered; each read still falls back to the next
    holder)."""
    hedge_after_ms: int = 100
    """Milliseconds a peer may stay silent during a read's or a COPY's transfer (no block
    announced since the request, or since its last block) before the same copy is also
    asked of the block's next holder: the first verified copy wins, the other is discarded,
    and the silent peer becomes suspect (a backup request, "The Tail at Scale"; default 100:
    several times the gap between two blocks of a healthy holder's batch on a LAN, so one is
    rarely hedged). 0 = off:
    a stopped peer that keeps its connections open costs the first read that meets it its
    whole deadline (``remote_fetch_timeout_s``)."""
    replicate_timeout_s: float = Field(default=10.0, gt=0)
    """Most seconds a put's extra replicas may take (master calls and transfers together;
    the caller's own deadline may cut it shorter); a replica not written by then is
    reported short."""

    @field_validator("hedge_after_ms")
    @classmethod
    def _hedge_after_ms_valid(cls, v: int) -> int:
        if v < 0:
            raise ValueError("hedge_after_ms must be >= 0 milliseconds (0 = off)")
        return v

    @field_validator("namespace_replicas")
    @classmethod
    def _namespace_replicas_valid(cls, v: dict[str, int]) -> dict[str, int]:
        out = {}
        for ns, n in v.items():
            try:
                raw = bytes.fromhex(ns)
            except ValueError:
                raw = b""
            if len(raw) != 16:
                raise ValueError(f"keys must be namespace ids of 32 hex digits, got {ns!r}")
            if not 1 <= n <= 8:
                raise ValueError(f"namespace {ns}: replicas must be in 1..8, got {n}")
            out[raw.hex()] = n
        return out

    def replicas_for(self, namespace_id: bytes) -> int:
        """The replicas a put of ``namespace_id`` wants when the client names none."""
        return self.namespace_replicas.get(namespace_id.hex(), self.default_replicas)

    @model_validator(mode="after")
    def _check_spill_watermarks(self) -> ClusterConfig:
        if self.spill_low_watermark >= self.spill_high_watermark:
            raise PydanticCustomError(
                "config_conflict",
                "cluster.spill_low_watermark ({low}) must be below cluster.spill_high_watermark ({high})",
                {"keys": ("spill_low_watermark", "spill_high_watermark"),
                 "low": self.spill_low_watermark, "high": self.spill_high_watermark},
            )
        return self


class RdmaConfig(_Model):
    """The node's RDMA data plane (``[rdma]`` in the TOML file; docs/rdma.md).

    With a device, the node registers its whole arena file as one memory region, advertises
    ``rdma`` beside ``tcp`` when it registers with the master, and answers ConnectRdma (one
    RC queue pair per peer node); its reads from peers that advertise ``rdma`` too are
    one-sided READs checked by the peers' slot headers, TCP for the rest and on any error.
    """

    enabled: Literal["auto", "on", "off"] = "auto"
    """``auto`` (default): use the first RDMA device if there is one, else TCP only (no
    device, no pyverbs, or a registration that fails is logged once); ``on``: refuse to
    start without one (ConfigInvalid naming what was missing); ``off``: TCP only."""
    device: str = ""
    """The RDMA device to open (e.g. ``mlx5_0``, ``rxe0``); "" = the first one listed."""
    bounce_buffer_bytes: Size = Field(default=16 << 20, ge=1 << 20)
    """Bytes of the registered buffer each peer's READs land in (at least the node's
    ``max_block_bytes`` is used); one per peer read over RDMA."""
    max_sessions: int = Field(default=64, gt=0, le=4096)
    """Most peer queue pairs this node keeps (one per reading peer); ConnectRdma past it
    answers NoCapacity (that peer reads over TCP)."""
    reconnect_s: float = Field(default=5.0, gt=0)
    """After a failed RDMA read or handshake, seconds a peer's reads stay on TCP before a
    new queue pair is tried."""
    peer_view_s: float = Field(default=2.0, gt=0)
    """Most seconds the cached view of which peers advertise ``rdma`` (the master's
    ListNodes) is reused before it is asked again."""


class TenantConfig(_Model):
    """Quotas of one tenant on every node (``[tenants.<name>]`` in the TOML file;
    docs/tenants.md). Payload bytes; a size string such as ``"2GiB"`` is accepted."""

    dram_quota_bytes: Size | None = None
    """Most DRAM bytes the tenant's blocks may hold on one node (reserved ones included);
    a put past it is refused with TenantQuotaExceeded. None (default): no quota."""
    ssd_quota_bytes: Size | None = None
    """Most SSD bytes the tenant's blocks may hold on one node; a demotion past it drops the
    block instead (never evicting another tenant's). None (default): no quota."""

    def quota(self) -> TenantQuota:
        """The store's form (kvstored.tenancy.TenantQuota)."""
        return TenantQuota(self.dram_quota_bytes, self.ssd_quota_bytes)


class TlsConfig(_Model):
    """Mutual TLS (``[tls]`` in the TOML file): all three files, or none (no TLS).

    With them, every gRPC listener that is not a unix socket and the TCP data plane accept
    only peers whose certificate ``ca_file`` signed, and present ``cert_file`` themselves;
    every outgoing channel (to the master, to peers' data planes) does the same. Roles and
    tenant come from the peer certificate (kvstored/security/identity.py). Unix sockets stay
    without TLS: their callers are local processes (docs/security.md).
    """

    cert_file: pathlib.Path | None = None
    """PEM certificate (chain) this process presents; None (the default) = no TLS."""
    key_file: pathlib.Path | None = None
    """PEM private key of ``cert_file``."""
    ca_file: pathlib.Path | None = None
    """PEM CA certificate(s) a peer's certificate must chain to."""

    @model_validator(mode="after")
    def _all_or_none(self) -> TlsConfig:
        given = {k: getattr(self, k) for k in ("cert_file", "key_file", "ca_file")}
        if any(v is not None for v in given.values()) and not all(v is not None for v in given.values()):
            missing = [f"tls.{k}" for k, v in given.items() if v is None]
            raise ValueError(
                f"TLS needs cert_file, key_file and ca_file together; missing {', '.join(missing)}"
            )
        return self

    @property
    def enabled(self) -> bool:
        """Whether TLS is configured (all three files given)."""
        return self.cert_file is not None


ENV_PREFIX = "KVSTORED_"
ENV_NESTED_DELIMITER = "__"


@dataclass(frozen=True, slots=True)
class _Layers:
    """What one :func:`load_config` call layers (read by ``settings_customise_sources``)."""

    toml_file: pathlib.Path | None
    environ: Mapping[str, str]


_LAYERS: ContextVar[_Layers | None] = ContextVar("kvstored_config_layers", default=None)


def _parse_env_list(name: str, value: str) -> Any:
    """An env var's list value in TOML syntax (``["unix:/x", "127.0.0.1:1"]``; JSON lists
    are TOML too).

    Raises:
        ConfigInvalid: naming the variable and the value.
    """
    try:
        return tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError as exc:
        raise ConfigInvalid(f"env var {name}: cannot parse list {value!r}: {exc}") from None


class _EnvSource(EnvSettingsSource):
    """``KVSTORED_<SECTION>__<FIELD>`` from a given mapping (not only ``os.environ``), lists in
    TOML syntax, and a variable of an unknown section refused by name (pydantic-settings
    would silently skip it)."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        sections = set(KvstoredConfig.model_fields)
        keys: dict[str, str | None] = {}
        for name, value in self._environ.items():
            # only KVSTORED_<SECTION>__<FIELD> are settings (KVSTORED_ADDRESS and a bare
            # KVSTORED_NODE are not: pydantic-settings would parse the latter as a section)
            if not name.upper().startswith(ENV_PREFIX) or ENV_NESTED_DELIMITER not in name:
                continue
            section = name[len(ENV_PREFIX):].split(ENV_NESTED_DELIMITER)[0].lower()
            if section not in sections:
                raise ConfigInvalid(
                    f"invalid configuration: env var {name}: {section!r} is not a config section "
                    f"(known: {', '.join(sorted(sections))}); rename or unset the variable"
                )
            if value.startswith("["):
                _parse_env_list(name, value)  # a bad list is named here, not deep in a source
            keys[name.lower()] = value  # case_sensitive=False
        return keys

    def decode_complex_value(self, field_name: str, field: Any, value: Any) -> Any:
        return _parse_env_list(field_name, value) if isinstance(value, str) else value


class KvstoredConfig(BaseSettings):
    """Root configuration: ``[node]``, ``[master]``, ``[cluster]``, ``[tls]``, ``[rdma]``,
    ``[tenants.<name>]``.

    Build it with :func:`load_config` (which names the file and the environment to read and
    turns validation errors into :class:`ConfigInvalid`); constructed directly, it layers
    its kwargs over ``os.environ`` and the defaults.
    """

    model_config = SettingsConfigDict(
        extra="forbid", validate_default=True, env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER, case_sensitive=False,
    )

    node: NodeConfig = Field(default_factory=NodeConfig)
    master: MasterConfig = Field(default_factory=MasterConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    tls: TlsConfig = Field(default_factory=TlsConfig)
    rdma: RdmaConfig = Field(default_factory=RdmaConfig)
    tenants: dict[str, TenantConfig] = Field(default_factory=dict)
    """Per-tenant quotas, keyed by tenant name (``[tenants.<name>]``)."""

    @field_validator("tenants")
    @classmethod
    def _tenant_keys(cls, v: dict[str, TenantConfig]) -> dict[str, TenantConfig]:
        for name in v:
            if not name:
                raise ValueError("the shared tenant \"\" takes no quota; name a tenant")
            try:
                check_tenant(name, what="the table name of [tenants.<name>]")
            except InvalidArgument as exc:
                raise ValueError(str(exc)) from None
        return v

    def tenant_quotas(self) -> dict[str, TenantQuota]:
        """``{tenant: TenantQuota}`` for the store."""
        return {name: t.quota() for name, t in self.tenants.items()}

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags (init kwargs) > env > TOML file > defaults; no dotenv or secrets dir."""
        layers = _LAYERS.get() or _Layers(None, os.environ)
        sources: list[PydanticBaseSettingsSource] = [init_settings, _EnvSource(settings_cls, layers.environ)]
        if layers.toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=layers.toml_file))
        return tuple(sources)


def _existing_ancestor(path: pathlib.Path) -> pathlib.Path:
    p = path.expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_node_host(cfg: NodeConfig) -> None:
    """Check the settings that depend on this host (call before binding or allocating).

    - the SSD cap must not exceed the size of the filesystem holding ``ssd_dir`` (statvfs of
      the directory, or of its nearest existing parent when it does not exist yet);
    - ``arena_group`` must name an existing group.

    Raises:
        ConfigInvalid: naming the key (and the env var or flag that set it) and the limit.
    """
    if cfg.ssd_dir is not None and cfg.ssd_size_bytes > 0:
        where = _existing_ancestor(cfg.ssd_dir)
        try:
            st = os.statvfs(where)
        except OSError as exc:
            raise ConfigInvalid(
                f"cannot inspect the filesystem of {cfg.describe_key('ssd_dir')} = {cfg.ssd_dir}: "
                f"{exc.strerror}"
            ) from None
        disk_bytes = st.f_blocks * st.f_frsize
        if cfg.ssd_size_bytes > disk_bytes:
            raise ConfigInvalid(
                f"{cfg.describe_key('ssd_size_bytes')} is {cfg.ssd_size_bytes} bytes "
                f"({format_size(cfg.ssd_size_bytes)}) but the filesystem of "
                f"{cfg.describe_key('ssd_dir')} = {cfg.ssd_dir} (statvfs of {where}) holds only "
                f"{disk_bytes} bytes ({format_size(disk_bytes)}); lower node.ssd_size_bytes or "
                "move node.ssd_dir to a larger disk"
            )
    if cfg.arena_group is not None:
        try:
            gid = resolve_group(cfg.arena_group)
        except KeyError:
            raise ConfigInvalid(
                f"{cfg.describe_key('arena_group')} = {cfg.arena_group!r} is not a group on this "
                "host; create it (groupadd) or change node.arena_group"
            ) from None
        if os.geteuid() != 0 and gid != os.getegid() and gid not in os.getgroups():
            raise ConfigInvalid(
                f"{cfg.describe_key('arena_group')} = {cfg.arena_group!r}: the daemon's user is "
                "not a member of that group, so it cannot give the arena to it; add the user to "
                "the group or change node.arena_group"
            )


def resolve_group(group: str) -> int:
    """A group name or numeric gid as a gid.

    Raises:
        KeyError: no such group.
    """
    if group.isdigit():
        return int(group)
    return grp.getgrnam(group).gr_gid


def _env_sources(environ: Mapping[str, str], sources: dict[tuple[str, ...], str]) -> None:
    """Record which env var sets each key (the values themselves come through
    :class:`_EnvSource`)."""
    for key in environ:
        if key.upper().startswith(ENV_PREFIX) and ENV_NESTED_DELIMITER in key:
            path = tuple(p.lower() for p in key[len(ENV_PREFIX):].split(ENV_NESTED_DELIMITER))
            sources[path] = f"env var {key}"


def _leaf_paths(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out += _leaf_paths(v, (*prefix, str(k)))
        else:
            out.append((*prefix, str(k)))
    return out


def _source_of(loc: tuple[str, ...], sources: Mapping[tuple[str, ...], str]) -> str | None:
    if loc in sources:
        return sources[loc]
    below = [src for path, src in sources.items() if path[: len(loc)] == loc]
    return below[0] if len(below) == 1 else None


def _format_error(err: Any, sources: Mapping[tuple[str, ...], str]) -> str:
    loc = tuple(str(p) for p in err["loc"])
    ctx = err.get("ctx") or {}
    keys = ctx.get("keys")
    if keys:  # a cross-field rule: name every key involved and where each was set
        msg = str(err["msg"])
        for field in keys:
            path = (*loc, field)
            source = sources.get(path)
            if source:
                name = ".".join(path)
                msg = msg.replace(name, f"{name} ({source})", 1)
        return msg
    name = ".".join(loc)
    source = _source_of(loc, sources)
    label = f"{name} ({source})" if source else name
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{label}: {msg} (got {err.get('input')!r})"


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    override_sources: Mapping[str, str] | None = None,
) -> KvstoredConfig:
    """Load the configuration: defaults < TOML file < env vars < ``overrides`` (CLI flags).

    Checks fields and cross-field rules; host-dependent checks (:func:`check_node_host`) are
    left to the daemon's start path, so an example config loads on any machine.

    Args:
        path: a TOML file, or None.
        overrides: nested dict such as ``{"node": {"dram_size_bytes": "2GiB"}}``; None values
            are ignored (flags not given).
        environ: environment to read (default ``os.environ``).
        override_sources: how errors name an override, e.g. ``{"node.ssd_dir": "--ssd-dir"}``
            (default: "command line").

    Raises:
        ConfigInvalid: unreadable file, bad TOML, unknown key, invalid value or a bad
            combination; the message names the key, the value received and, for a key set
            by an env var or flag, that variable or flag.
    """
    cfg, _ = _load(path, overrides=overrides, environ=environ, override_sources=override_sources)
    return cfg


def _load(
    path: str | os.PathLike[str] | None,
    *,
    overrides: Mapping[str, Any] | None,
    environ: Mapping[str, str] | None,
    override_sources: Mapping[str, str] | None,
) -> tuple[KvstoredConfig, dict[tuple[str, ...], str]]:
    """:func:`load_config`, plus where each explicitly set key came from."""
    sources: dict[tuple[str, ...], str] = {}
    toml_file: pathlib.Path | None = None
    if path is not None:
        try:  # read here first: pydantic-settings skips a missing file silently
            with open(path, "rb") as fh:
                tree = tomllib.load(fh)
        except OSError as exc:
            raise ConfigInvalid(f"cannot read config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigInvalid(f"config file {path} is not valid TOML: {exc}") from None
        sources.update({p: f"config file {path}" for p in _leaf_paths(tree)})
        toml_file = pathlib.Path(path)
    env = os.environ if environ is None else environ
    _env_sources(env, sources)
    clean: dict[str, Any] = {}
    if overrides:
        clean = {
            sec: {k: v for k, v in vals.items() if v is not None}
            for sec, vals in overrides.items()
        }
        clean = {sec: vals for sec, vals in clean.items() if vals}
        names = override_sources or {}
        for p in _leaf_paths(clean):
            flag = names.get(".".join(p))
            sources[p] = f"flag {flag}" if flag else "command line"
    token = _LAYERS.set(_Layers(toml_file, env))
    try:
        cfg = KvstoredConfig(**clean)
    except ValidationError as exc:
        problems = "; ".join(_format_error(err, sources) for err in exc.errors())
        raise ConfigInvalid(f"invalid configuration: {problems}") from None
    finally:
        _LAYERS.reset(token)
    cfg.node._sources = {p[1]: src for p, src in sources.items() if len(p) == 2 and p[0] == "node"}
    return cfg, sources


@dataclass(frozen=True, slots=True)
class EffectiveValue:
    """One key of the effective config: its value (JSON-ready: sizes as int bytes, paths as
    str, None for unset) and where it came from (``default``, ``config file PATH``,
    ``env var NAME``, ``flag --X`` or ``command line``)."""

    value: Any
    source: str


def load_effective_config(
    path: str | os.PathLike[str] | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    override_sources: Mapping[str, str] | None = None,
) -> tuple[KvstoredConfig, dict[str, dict[str, EffectiveValue]]]:
    """:func:`load_config`, and every key's value with its source, section by section.

    Returns:
        ``(config, {section: {field: EffectiveValue}})`` with every field of every section,
        in declaration order (``kvstored config show`` prints it).

    Raises:
        ConfigInvalid: as :func:`load_config`.
    """
    cfg, sources = _load(path, overrides=overrides, environ=environ, override_sources=override_sources)
    out: dict[str, dict[str, EffectiveValue]] = {}
    dumped = cfg.model_dump(mode="json")
    for section in type(cfg).model_fields:
        value = getattr(cfg, section)
        # a model section lists every field; a table of tables ([tenants.<name>]) its entries
        keys = type(value).model_fields if isinstance(value, BaseModel) else value
        out[section] = {
            key: EffectiveValue(dumped[section][key], _source_of((section, key), sources) or "default")
            for key in keys
        }
    return cfg, out
