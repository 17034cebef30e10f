"""NodeDaemon: wiring and lifecycle of one node process.

One process serves, from one asyncio loop:

- the node gRPC API (grpc.aio) on every ``node.listen`` address (unix socket and TCP,
  loopback by default), plus the scheduler service (``enable_scheduler``);
- the TCP data plane (:class:`~kvstored.transport.tcp_server.DataPlaneServer`, its own threads);
- the lean control channel (:class:`~kvstored.node.control.ControlServer`) on
  ``<first unix listen path>.ctl``: the hot ops of local clients, one round trip per batch;
- Prometheus ``/metrics`` (prometheus_client's WSGI server thread);
- the lease reaper (an owned task moving lapsed pins/reservations into quarantine; see
  kvstored/node/sessions.py for when their space is freed).

Lifecycle::

    start():  check host-dependent config (SSD cap vs disk, arena group) -> validate addresses
              -> open store (arena, SSD index) -> bind gRPC -> socket/arena modes and group
              -> gRPC up -> data plane up -> metrics up -> reaper task -> sd_notify READY=1 (in run())
    stop():   draining (new puts and new reads refused with Draining; commits, pin releases
              and metadata calls still served) -> wait for outstanding puts, pins,
              reservations, data-plane requests and running gRPC handlers (<= drain_grace_s)
              -> stop gRPC (handlers still running get at least RPC_FINISH_GRACE_S, never
              cancelled at once) -> stop data plane -> drop leases -> spill DRAM to SSD
              (spill_on_shutdown) -> close the store (flushes the SSD index, unlinks the
              arena) -> remove unix sockets

Blocking store calls of the gRPC handlers run in the ``kvstored-store`` thread pool; the
loop itself never waits on the store's lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import signal
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import grpc
import structlog

from kvstored.addresses import format_host_port, parse_host_port
from kvstored.config import (
    GRPC_MAX_MESSAGE_BYTES,
    GRPC_SLACK_BYTES,
    RdmaConfig,
    check_node_host,
    resolve_group,
)
from kvstored.errors import AlreadyExists, ConfigInvalid, KvstoredError
from kvstored.node.control import SOCKET_SUFFIX, ControlServer
from kvstored.node.core import NodeCore
from kvstored.node.fault_hooks import (
    dataplane_hook_from_env,
    loop_stall_hook_from_env,
    remote_copy_hook_from_env,
    remote_fill_hook_from_env,
    reregister_hook_from_env,
)
from kvstored.node.metrics import NodeMetrics
from kvstored.node.service import NodeServicer, add_node_service
from kvstored.sdnotify import Watchdog, sd_notify, stop_event_on_signals
from kvstored.security.tls import TlsFiles, port_credentials
from kvstored.tenancy import TenantQuota
from kvstored.transport.listen import add_grpc_port
from kvstored.transport.master_rpc import MasterClient
from kvstored.transport.tcp_server import DataPlaneServer
from kvstored.types import Tier

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from kvstored.config import ClusterConfig, NodeConfig
    from kvstored.node.cluster import MasterLink
    from kvstored.node.rdma_node import NodeRdma
    from kvstored.node.rdma_peers import PeerTransports
    from kvstored.node.remote import FetchResult
    from kvstored.node.replicate import Replicator
    from kvstored.node.spill import PeerRoom, Spiller
    from kvstored.tiers.tiered import TieredStore
    from kvstored.transport.master_rpc import ClusterReplica
    from kvstored.transport.master_targets import TermFence

log = structlog.get_logger(__name__)

UNIX_PATH_MAX_BYTES = 107
_STORE_THREADS = 8
RPC_FINISH_GRACE_S = 5.0
"""Least time a gRPC handler still running at the end of the drain gets to finish."""




def _version() -> str:
    try:
        from importlib.metadata import version

        return version("kvstored")
    except Exception:  # not installed (running from a checkout)
        return "0+unknown"


def _prepare_unix_socket(path: str) -> None:
    """Create the socket's directory; remove a stale socket file, refuse a live one.

    Raises:
        ConfigInvalid: path too long, not a socket, or another daemon is listening there.
    """
    if len(os.fsencode(path)) > UNIX_PATH_MAX_BYTES:
        raise ConfigInvalid(
            f"unix socket path {path!r} is {len(os.fsencode(path))} bytes; the limit is "
            f"{UNIX_PATH_MAX_BYTES}; choose a shorter node.listen path"
        )
    p = pathlib.Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise ConfigInvalid(f"cannot create the directory of unix socket {path!r}: {exc.strerror}") from None
    if not p.exists() and not p.is_symlink():
        return
    if not p.is_socket():
        raise ConfigInvalid(f"{path!r} exists and is not a unix socket; remove it or change node.listen")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        try:
            probe.connect(path)
        except OSError:
            p.unlink(missing_ok=True)  # stale socket of a dead daemon
            log.info("stale_socket_removed", path=path)
            return
    raise ConfigInvalid(f"another process is already listening on unix:{path}; stop it or change node.listen")


class NodeDaemon:
    """The node process: store, gRPC server, data plane, metrics, lease reaper.

    Args:
        cfg: the node's settings (validated).
        store: an already-open store to serve (tests); by default one is opened from ``cfg``
            in :meth:`start` and closed in :meth:`stop`.
        enable_scheduler: also host the scheduler service (``kvstored serve`` does).
        cluster: the link to a master (``kvstored node --master``); None or an empty
            ``master_address`` = a standalone node.
        tenant_quotas: per-tenant DRAM/SSD quotas (``[tenants.<name>]``, docs/tenants.md)
            of the store this daemon opens; ignored when ``store`` is given.
        tls: mutual TLS (``[tls]``; kvstored/security/tls.py) on every TCP gRPC listener,
            the data plane, and the node's own calls to the master and its peers; unix
            sockets stay plaintext. None = no TLS anywhere (every caller is TRUSTED_LOCAL).
        rdma: ``[rdma]`` (docs/rdma.md): with a device, the arena is registered as one
            memory region, ``rdma`` is advertised to the master, and reads of peers that
            advertise it too are one-sided READs (kvstored/node/rdma_peers.py). Default:
            ``enabled = "auto"``.
    """

    def __init__(
        self,
        cfg: NodeConfig,
        *,
        store: TieredStore | None = None,
        enable_scheduler: bool = True,
        cluster: ClusterConfig | None = None,
        tenant_quotas: Mapping[str, TenantQuota] | None = None,
        tls: TlsFiles | None = None,
        rdma: RdmaConfig | None = None,
    ) -> None:
        self.cfg = cfg
        self.rdma_cfg = rdma if rdma is not None else RdmaConfig()
        self.node_rdma: NodeRdma | None = None
        self.peer_transports: PeerTransports | None = None
        self._peer_master: MasterClient | None = None
        self.tenant_quotas = dict(tenant_quotas or {})
        self.tls = tls
        self.cluster = cluster
        self.master_link: MasterLink | None = None
        self.spiller: Spiller | None = None
        self.replicator: Replicator | None = None
        self.store: TieredStore | None = store
        self._enable_scheduler = enable_scheduler
        self.core: NodeCore | None = None
        self.metrics = NodeMetrics()
        self.epoch = time.time_ns()
        self.grpc_addresses: list[str] = []
        self.data_address = ""
        self.metrics_address = ""
        self._server: grpc.aio.Server | None = None
        self._data_plane: DataPlaneServer | None = None
        self._httpd: WSGIServer | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._servicer: NodeServicer | None = None
        self._control: ControlServer | None = None
        self._unix_paths: list[str] = []
        self._stopped = False
        self._started = False

    @property
    def arena_path(self) -> str | None:
        """Path of the shared-memory arena file (None = anonymous arena)."""
        return self.store.arena_path if self.store is not None else None

    def _check_listen(self) -> list[str]:
        out = []
        for addr in self.cfg.listen:
            if addr.startswith("unix:"):
                path = addr[len("unix:") :]
                if not path:
                    raise ConfigInvalid(f"{self.cfg.describe_key('listen')} entry {addr!r} has an empty path")
                path = os.path.abspath(path)
                _prepare_unix_socket(path)
                out.append(f"unix:{path}")
            else:
                try:
                    parse_host_port(addr)
                except KvstoredError as exc:
                    raise ConfigInvalid(
                        f"{self.cfg.describe_key('listen')} entry {addr!r} is neither unix:PATH nor a valid "
                        f"HOST:PORT: {exc}"
                    ) from None
                out.append(addr)
        if not out:
            raise ConfigInvalid("node.listen is empty; give at least one unix:PATH or HOST:PORT")
        for name in ("data_address", "metrics_address"):
            value = getattr(self.cfg, name)
            if value:
                try:
                    parse_host_port(value)
                except KvstoredError as exc:
                    raise ConfigInvalid(f"{self.cfg.describe_key(name)} {value!r} is not a valid HOST:PORT: "
                                        f"{exc}") from None
        return out

    async def start(self) -> None:
        """Open the store and start serving on every address.

        Raises:
            ConfigInvalid: a listen address is malformed, in use, or not permitted; the SSD
                cap exceeds its disk; the arena group does not exist (all checked before
                anything is bound or allocated).
            StorageIOError: the arena or the SSD tier cannot be opened.
        """
        if self._started:
            return
        self._started = True
        try:
            check_node_host(self.cfg)
            listen = self._check_listen()
            from kvstored.node.rdma_node import find_rdma_device

            rdma_device = find_rdma_device(self.rdma_cfg)  # "on" without one: before any mmap
        except BaseException:
            self._stopped = True
            raise
        cfg = self.cfg
        try:
            if self.store is None:
                from kvstored.tiers.tiered import TieredStore

                self.store = TieredStore.from_config(cfg, tenant_quotas=self.tenant_quotas)
            store = self.store
            self.core = core = NodeCore(store, cfg, epoch=self.epoch, metrics=self.metrics)
            self.metrics.add_store_collector(store.stats, lambda: (core.draining, core.uptime_s()))
            self.metrics.add_tenant_collector(store.tenant_usage)
            self._executor = ThreadPoolExecutor(_STORE_THREADS, thread_name_prefix="kvstored-store")
            max_msg = min(
                GRPC_MAX_MESSAGE_BYTES, max(cfg.max_inline_bytes, cfg.max_block_bytes) + GRPC_SLACK_BYTES
            )
            server = grpc.aio.server(
                options=[
                    ("grpc.max_receive_message_length", max_msg),
                    ("grpc.max_send_message_length", -1),
                    ("grpc.so_reuseport", 0),
                ]
            )
            self._server = server
            self._servicer = NodeServicer(core, self._executor, version=_version(),
                                          check_roles=self.tls is not None)
            from kvstored.node.rdma_node import open_node_rdma

            self.node_rdma = open_node_rdma(self.rdma_cfg, store, epoch=self.epoch,
                                            found=rdma_device)
            self._servicer.rdma = self.node_rdma
            if self.cluster is not None:  # a put's default replicas (Describe)
                self._servicer.replicas_for = self.cluster.replicas_for
            add_node_service(server, self._servicer)
            if self._enable_scheduler:
                self._add_scheduler(server)
            for addr in listen:
                port = add_grpc_port(server, addr, "node.listen",
                                     credentials=port_credentials(addr, self.tls))
                if addr.startswith("unix:"):
                    self._unix_paths.append(addr[len("unix:") :])
                    self.grpc_addresses.append(addr)
                else:
                    host, _ = parse_host_port(addr)
                    self.grpc_addresses.append(format_host_port(host, port))
            self._share_local_files()  # sockets exist once bound: modes set before serving
            await server.start()
            await self._start_control()
            if cfg.data_address:
                self._data_plane = DataPlaneServer(
                    core, cfg.data_address, hook=dataplane_hook_from_env(),
                    ssl_context=self.tls.server_context() if self.tls is not None else None)
                try:
                    self.data_address = self._data_plane.start()
                except OSError as exc:
                    raise ConfigInvalid(
                        f"cannot listen on data address {cfg.data_address}: {exc.strerror or exc}; "
                        "change node.data_address"
                    ) from None
            if cfg.metrics_address:
                self._start_metrics(cfg.metrics_address)
            core.listen_addresses = list(self.grpc_addresses)
            core.data_address = self.data_address
            core.metrics_address = self.metrics_address
            self._reaper = asyncio.create_task(self._reap_loop(), name="kvstored-lease-reaper")
            if self.cluster is not None and self.cluster.master_address:
                await self._start_master_link(core)
        except BaseException:
            self._stopped = True  # nothing to drain: stop() becomes a no-op
            await self._teardown(spill=False)
            raise
        log.info(
            "node_started", node_id=cfg.node_id, epoch=self.epoch, grpc=self.grpc_addresses,
            data=self.data_address, metrics=self.metrics_address, arena=self.arena_path or "",
            dram_size_bytes=store.arena_size_bytes, tls=self.tls is not None,
        )

    async def _start_control(self) -> None:
        """Serve the control channel beside the first unix socket (none without one)."""
        if not self._unix_paths or self._servicer is None:
            return
        path = self._unix_paths[0] + SOCKET_SUFFIX
        if len(os.fsencode(path)) > UNIX_PATH_MAX_BYTES:
            log.warning("control_channel_off", reason="socket path too long", path=path)
            return
        _prepare_unix_socket(path)
        self._control = ControlServer(self._servicer, path)
        await self._control.start()
        if self.cfg.socket_mode is not None:
            os.chmod(path, self.cfg.socket_mode)
        self._servicer.control_path = path

    def _share_local_files(self) -> None:
        """Apply ``socket_mode`` to the unix sockets, then ``arena_mode``/``arena_group`` to
        the arena file (default group: the first socket's), so that the users who may connect
        may also map the arena (a client that cannot map it falls back to TCP).

        Raises:
            ConfigInvalid: the mode or group cannot be applied (naming the key).
        """
        cfg = self.cfg
        for path in self._unix_paths:
            if cfg.socket_mode is not None:
                try:
                    os.chmod(path, cfg.socket_mode)
                except OSError as exc:
                    raise ConfigInvalid(
                        f"cannot set {cfg.describe_key('socket_mode')} = {cfg.socket_mode:#o} on "
                        f"{path}: {exc.strerror}"
                    ) from None
        arena_path = self.arena_path
        if arena_path is None:
            return
        gid = -1
        if cfg.arena_group is not None:
            gid = resolve_group(cfg.arena_group)
        elif cfg.arena_mode & 0o070 and self._unix_paths:
            gid = os.stat(self._unix_paths[0]).st_gid
        try:
            if gid != -1 and os.stat(arena_path).st_gid != gid:
                os.chown(arena_path, -1, gid)
            os.chmod(arena_path, cfg.arena_mode)
        except OSError as exc:
            raise ConfigInvalid(
                f"cannot give the arena {arena_path} mode {cfg.arena_mode:#o} and group {gid} "
                f"({cfg.describe_key('arena_mode')}, {cfg.describe_key('arena_group')}): "
                f"{exc.strerror}"
            ) from None
        st = os.stat(arena_path)
        log.info("arena_shared", path=arena_path, mode=f"{st.st_mode & 0o777:#o}", gid=st.st_gid)

    async def _start_master_link(self, core: NodeCore) -> None:
        from kvstored.node.cluster import MasterLink

        tcp = [a for a in self.grpc_addresses if not a.startswith("unix:")]
        if not tcp or not self.data_address:
            raise ConfigInvalid(
                "a cluster node needs a HOST:PORT in node.listen and a node.data_address "
                f"(peers and the master reach it there); got listen={self.grpc_addresses}, "
                f"data_address={self.data_address!r}"
            )
        assert self.cluster is not None
        from kvstored.node.put_replicas import ReplicationFactors, master_replicas

        factors = ReplicationFactors()  # of blocks held here: inventories and events carry them
        self.master_link = MasterLink(
            self.cluster, node_id=self.cfg.node_id, epoch=self.epoch, grpc_address=tcp[0],
            data_address=self.data_address, store=core.store,
            load=lambda: float(sum(core.num_outstanding())), executor=self._executor,
            zone=self.cfg.zone, factors=factors,
            tls=self.tls, transports=("tcp", "rdma") if self.node_rdma is not None else ("tcp",),
        )
        self.master_link.before_reregister = reregister_hook_from_env()  # tests only
        from kvstored.node.metrics import TermCollector

        self.metrics.registry.register(TermCollector(self.master_link.fence))
        await self.master_link.start()
        try:  # a duplicate --node-id is a configuration error: exit 2, never take over
            await self.master_link.wait_first_registration(min(2.0, self.cluster.rpc_timeout_s))
        except AlreadyExists as exc:
            raise ConfigInvalid(f"--node-id {self.cfg.node_id!r} (node.node_id): {exc}") from None
        if self._servicer is not None:  # reads across the pool (kvstored/node/remote.py)
            from kvstored.node.remote import master_reads

            self.peer_transports = self._peer_transports(self.master_link.fence)
            self._servicer.peer_transports = self.peer_transports
            self._servicer.remote = master_reads(
                core, self.cluster.master_address, node_id=self.cfg.node_id,
                fetch_timeout_s=self.cluster.remote_fetch_timeout_s,
                pool_size=self.cluster.peer_pool_size, rpc_timeout_s=self.cluster.rpc_timeout_s,
                tls=self.tls, fence=self.master_link.fence,
                transport_for=self.peer_transports.transport_for,
                suspect_holder_s=self.cluster.suspect_holder_s,
                hedge_after_s=self.cluster.hedge_after_ms / 1000.0,
                before_copy=remote_fill_hook_from_env(),
                before_repair_copy=remote_copy_hook_from_env(),
                peer_view=self._peer_view)
            if self._data_plane is not None:  # engines on the TCP data plane read the pool too
                self._data_plane.fill_from_peers = self._servicer.remote.fill
                self._data_plane.on_replica_factor = factors.record  # peers' put replicas
                # a peer's PUT stored blocks: report them now (the sender keeps its copy
                # of a moved block until the master names ours: node/spill.py)
                loop, link = asyncio.get_running_loop(), self.master_link

                def on_stored() -> None:  # on a data-plane thread
                    with contextlib.suppress(RuntimeError):  # the loop closed: stopping
                        loop.call_soon_threadsafe(link.wake)

                self._data_plane.on_stored = on_stored
            self._register_nodrop(core)
            # a put's extra replicas (kvstored/node/put_replicas.py)
            self._servicer.replicator = master_replicas(
                core.store, self.cluster, node_id=self.cfg.node_id,
                max_block_bytes=self.cfg.max_block_bytes, factors=factors, tls=self.tls,
                fence=self.master_link.fence, peer_view=self._peer_view, zone=self.cfg.zone)
        await self._start_replicator(core)
        if self.cluster.spill_enabled:  # puts across the pool (kvstored/node/spill.py)
            from kvstored.node.spill import master_spiller

            self.spiller = master_spiller(core.store, self.cluster, node_id=self.cfg.node_id,
                                          max_block_bytes=self.cfg.max_block_bytes, tls=self.tls,
                                          fence=self.master_link.fence, factor_of=factors.get)
            from kvstored.node.spill import SpillCollector

            self.metrics.registry.register(SpillCollector(self.spiller))
            self.spiller.start()
            # backpressure: a put that would evict an original waits for a spill round first
            core.store.set_pool_room(self.spiller.wait_for_room,
                                     wait_s=self.cluster.spill_put_wait_s)

    def _peer_view(self) -> list[PeerRoom]:
        """The node's cached peer view (the spiller's last ListNodes: healthy peers, their
        room and zone), for reads and a put's replicas while no master can answer; [] on a
        node without a spiller (``spill_enabled = false``)."""
        spiller = self.spiller
        return list(spiller.peers) if spiller is not None else []

    def _peer_transports(self, fence: TermFence) -> PeerTransports:
        """The transport choice of reads across the pool (kvstored/node/rdma_peers.py): RDMA
        to peers that advertise it when this node has a device, TCP otherwise."""
        from kvstored.node.metrics import RdmaCollector
        from kvstored.node.rdma_peers import PeerTransports, grpc_peer_calls
        from kvstored.transport.tcp import DataPlaneClient

        assert self.cluster is not None
        cluster, cfg = self.cluster, self.cfg
        self._peer_master = master = MasterClient(
            cluster.master_address, timeout_s=cluster.rpc_timeout_s, tls=self.tls, fence=fence)
        ssl_context = self.tls.client_context() if self.tls is not None else None

        def tcp_for(address: str) -> DataPlaneClient:
            return DataPlaneClient(address, pool_size=cluster.peer_pool_size,
                                   max_block_bytes=cfg.max_block_bytes,
                                   peer_export=True,  # the peer sends without promoting or touching
                                   ssl_context=ssl_context)

        list_peers, connect_peer, disconnect_peer = grpc_peer_calls(
            master.list_nodes, node_id=cfg.node_id, epoch=self.epoch, tls=self.tls)
        peers = PeerTransports(self.node_rdma, self.rdma_cfg, node_id=cfg.node_id,
                               epoch=self.epoch, tcp_for=tcp_for, list_peers=list_peers,
                               connect_peer=connect_peer, disconnect_peer=disconnect_peer,
                               max_block_bytes=cfg.max_block_bytes)
        node_rdma = self.node_rdma
        self.metrics.registry.register(RdmaCollector(
            lambda: (peers.counts.rdma_blocks, peers.counts.tcp_blocks, peers.counts.fallbacks,
                     node_rdma.num_sessions if node_rdma is not None else 0)))
        return peers

    def _register_nodrop(self, core: NodeCore) -> None:
        """Export what this node did instead of dropping a block (``kvstored_nodrop_*``)."""
        from kvstored.node.spill import NoDropCollector

        remote, plane = self._servicer.remote if self._servicer else None, self._data_plane
        store = core.store
        self.metrics.registry.register(NoDropCollector({
            "evictions_for_good": lambda: store.evictions_for_good,
            "promotions_skipped": lambda: store.promotions_skipped,
            "served_from_ssd": lambda: core.reads.num_served_from_ssd,
            "copies_skipped": lambda: remote.num_skipped if remote is not None else 0,
            "streamed_through": lambda: plane.num_streamed_through if plane is not None else 0,
            "handoffs_taken": lambda: store.handoffs_taken,
            "handoffs_declined": lambda: store.handoffs_declined,
            "spare_puts_refused": lambda: store.spare_puts_refused,
        }))

    async def _start_replicator(self, core: NodeCore) -> None:
        """The master's commands (copy, promote, drop, leave: kvstored/node/replicate.py)."""
        from kvstored.node.replicate import Replicator

        link = self.master_link
        assert link is not None
        servicer = self._servicer

        def copy_from(items: Sequence[tuple[bytes, ClusterReplica]], namespace_id: bytes
                      ) -> FetchResult | None:
            remote = servicer.remote if servicer is not None else None
            return remote.copy_from(items, namespace_id) if remote is not None else None

        self.replicator = Replicator(
            epoch=self.epoch, copy_from=copy_from, keep_copies=core.store.keep_copies,
            remove=lambda keys, ns: core.remove(keys, ns), leave=link.request_leave,
            executor=self._executor, on_applied=link.wake,
            peer_left=getattr(core.store, "forget_keeper", None))
        await self.replicator.start()
        link.replicator = self.replicator

    def _start_metrics(self, address: str) -> None:
        from prometheus_client import start_wsgi_server

        host, port = parse_host_port(address)
        try:
            self._httpd, _ = start_wsgi_server(port, addr=host, registry=self.metrics.registry)
        except OSError as exc:
            raise ConfigInvalid(
                f"cannot serve metrics on {address}: {exc.strerror or exc}; change "
                "node.metrics_address (empty string disables it)"
            ) from None
        self.metrics_address = format_host_port(host, self._httpd.server_port)

    def _add_scheduler(self, server: grpc.aio.Server) -> None:
        """Host the scheduler service, its block locator reading this node's store."""
        from kvstored.scheduler.config import SchedulerConfig
        from kvstored.scheduler.service import add_scheduler_service

        assert self.core is not None
        core = self.core

        def block_locator(keys: Sequence[bytes], namespace_id: bytes = b"") -> list[Tier]:
            """Tiers of the leading present blocks (like LookupPrefix: metadata only)."""
            return core.store.lookup_prefix(keys, namespace_id=namespace_id)

        # scheduler metrics on the node's /metrics
        add_scheduler_service(server, SchedulerConfig(), block_locator=block_locator,
                              registry=self.metrics.registry)
        log.info("scheduler_service_added")

    async def _reap_loop(self) -> None:
        assert self.core is not None
        interval = min(1.0, self.cfg.pin_lease_s / 4)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            try:
                await loop.run_in_executor(self._executor, self.core.reap_expired)
            except Exception:
                log.exception("lease_reap_failed")

    async def _wait_drained(self, deadline: float) -> None:
        assert self.core is not None
        waiting_for: tuple[int, ...] = ()
        while time.monotonic() < deadline:
            pins, reservations, puts = self.core.num_outstanding()
            busy = self._data_plane.num_busy() if self._data_plane is not None else 0
            rpcs = self.core.rpcs_in_flight
            if not (pins or reservations or puts or busy or rpcs):
                return
            if (pins, reservations, puts, busy, rpcs) != waiting_for:  # what the drain waits on
                waiting_for = (pins, reservations, puts, busy, rpcs)
                log.info("drain_waiting", num_pins=pins, num_reservations=reservations,
                         num_puts=puts, num_dataplane_requests=busy, num_rpcs=rpcs)
            await asyncio.sleep(0.02)
        pins, reservations, puts = self.core.num_outstanding()
        log.warning(
            "drain_grace_expired", num_pins=pins, num_reservations=reservations, num_puts=puts,
            num_rpcs=self.core.rpcs_in_flight,
        )

    async def stop(self) -> None:
        """Drain and shut down (idempotent); see the module docstring for the order."""
        if self._stopped or not self._started:
            return
        self._stopped = True
        core = self.core
        if core is not None:
            core.start_draining()
        if self.replicator is not None:
            await self.replicator.stop()
            self.replicator = None
        if self.master_link is not None:  # leave the cluster first: no one is sent here
            await self.master_link.stop()
            self.master_link = None
        log.info("node_draining", grace_s=self.cfg.drain_grace_s)
        deadline = time.monotonic() + self.cfg.drain_grace_s
        await self._wait_drained(deadline)
        await self._teardown(spill=self.cfg.spill_on_shutdown, deadline=deadline)
        log.info("node_stopped", node_id=self.cfg.node_id)

    async def _teardown(self, *, spill: bool, deadline: float | None = None) -> None:
        loop = asyncio.get_running_loop()
        remaining = 0.0 if deadline is None else max(0.0, deadline - time.monotonic())
        if self.spiller is not None:  # before the store closes: it pins and removes blocks
            if self.core is not None:  # puts no longer wait for a spiller that stops
                self.core.store.set_pool_room(None)
            await loop.run_in_executor(self._executor, self.spiller.close)
            self.spiller = None
        if self.replicator is not None:
            await self.replicator.stop()
            self.replicator = None
        if self.master_link is not None:
            await self.master_link.stop(unregister=False)
            self.master_link = None
        if self._server is not None:
            if self._servicer is not None:
                self._servicer.end_sessions()  # session streams would hold the grace otherwise
            if self._control is not None:
                self._control.stop_listening()
            # new RPCs are refused from here on; running handlers finish (bounded)
            grace_s = 0.0 if deadline is None else max(remaining, RPC_FINISH_GRACE_S)
            await self._server.stop(grace=grace_s)
            self._server = None
        if self._control is not None:
            await self._control.close()
            self._control = None
        if self._servicer is not None and self._servicer.remote is not None:
            if self._data_plane is not None:
                self._data_plane.fill_from_peers = None  # TCP GETs stop reading peers
            self._servicer.remote.close()  # no handler runs any more: peer pools and channel
            self._servicer.remote = None
        if self.peer_transports is not None:  # our QPs into peers, then their TCP clients
            await loop.run_in_executor(self._executor, self.peer_transports.close)
            self.peer_transports = None
        if self._peer_master is not None:
            self._peer_master.close()
            self._peer_master = None
        if self._servicer is not None and self._servicer.replicator is not None:
            self._servicer.replicator.close()  # no Replicate runs any more
            self._servicer.replicator = None
        if self._data_plane is not None:
            await loop.run_in_executor(self._executor, self._data_plane.stop, max(0.0, remaining))
            self._data_plane = None
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        if self.node_rdma is not None:  # peers' QPs gone and the MR deregistered before
            if self._servicer is not None:  # the store unmaps the arena it exports
                self._servicer.rdma = None
            self.node_rdma.close()
            self.node_rdma = None
        if self.core is not None:
            self.core.release_all()
        if self.store is not None:
            store = self.store
            if spill:
                try:
                    t0 = time.monotonic()
                    num = await loop.run_in_executor(self._executor, store.spill_to_ssd)
                    log.info("dram_spilled_to_ssd", num_blocks=num,
                             duration_ms=round((time.monotonic() - t0) * 1000, 1))
                except Exception:
                    log.exception("spill_failed")
            try:
                await loop.run_in_executor(self._executor, store.close)
            except Exception:
                log.exception("store_close_failed")
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        for path in self._unix_paths:
            with contextlib.suppress(OSError):
                os.unlink(path)
        self._unix_paths = []

    async def run(self, *, on_started: Callable[[NodeDaemon], None] | None = None) -> None:
        """Start, notify systemd, serve until SIGTERM/SIGINT, then drain and stop.

        Args:
            on_started: called once everything listens (e.g. to print the addresses).
        """
        watchdog = Watchdog.from_env()  # WatchdogSec= in the unit; pings from this loop
        with stop_event_on_signals() as stop_event:  # before anyone can learn we are up
            if watchdog is not None:
                watchdog.start()
            stall = loop_stall_hook_from_env()
            if stall is not None:  # test-only: SIGUSR2 blocks this loop (the watchdog test)
                asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, stall)
            try:
                await self.start()
                if on_started is not None:
                    on_started(self)
                sd_notify(f"READY=1\nSTATUS=serving on {', '.join(self.grpc_addresses)}")
                if self.store is not None:
                    self.store.start_prefault()  # serving already; first-touch faults move off the hot path
                await stop_event.wait()
                sd_notify("STOPPING=1")
            finally:
                try:
                    await self.stop()  # the drain and spill still ping: the loop stays live
                finally:
                    if stall is not None:
                        asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR2)
                    if watchdog is not None:
                        await watchdog.stop()
