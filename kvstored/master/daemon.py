"""MasterDaemon: wiring and lifecycle of the ``kvstored master`` process.

One asyncio loop serves the MasterService on every ``master.listen`` address and runs one
owned maintenance task (every ``gc_interval_s``: expire lapsed node leases, abort lapsed
writes, unlink a bounded batch of dropped replicas, sample the metrics' state gauges).
``master.metrics_listen`` (empty: off) serves Prometheus ``/metrics`` from a thread
(kvstored.master.metrics).

The master keeps no block metadata on disk: a restarted master rebuilds its index from the
nodes, which re-register and resync when their heartbeats are answered REREGISTER (within
one heartbeat interval). Until a node has resynced, lookups answer without it (misses,
never stale entries), and for one node lease after a restart they say ``complete=false``
(the master cannot know which nodes are still to come back). ``data_dir`` holds one small JSON file
with the last start epoch, so
epochs (and the generations derived from them) increase across restarts even if the wall
clock steps back.

With ``master.etcd`` (``--etcd``) several masters run and one leads
(kvstored/master/election.py). Each leadership is a new term: the master builds a fresh
MasterState for it (a new epoch from ``data_dir``, the term = the election key's etcd create
revision, ``complete=false`` for one node lease) and swaps it into the servicer; while it
does not lead, every call is answered NotLeader naming the leader and maintenance skips.

With ``master.scheduler`` (the default) the same server hosts the SchedulerService
(kvstored/master/scheduling.py): block locations from this term's index, planned copies
asked of the prefill node; under etcd only the leader answers it.

Lifecycle::

    start():  data dir + epoch -> gRPC up -> /metrics up -> maintenance task
              [-> election campaigning] (then READY=1)
    stop():   [election stops: a leader revokes its lease] -> stop gRPC (grace 1 s)
              -> cancel the maintenance task -> stop /metrics
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
import structlog

from kvstored.clock import Clock, MonotonicClock
from kvstored.config import MasterConfig
from kvstored.errors import ConfigInvalid, InvalidArgument
from kvstored.master.election import ElectionHooks, Elector
from kvstored.master.metrics import MasterMetrics
from kvstored.master.observed import ObservedBlockIndex
from kvstored.master.service import MasterServicer, add_master_service
from kvstored.master.state import MasterState
from kvstored.sdnotify import Watchdog, sd_notify, stop_event_on_signals
from kvstored.security.tls import TlsFiles, port_credentials
from kvstored.transport.listen import add_grpc_port
from kvstored.transport.master_targets import check_election_prefix, parse_etcd_endpoints

if TYPE_CHECKING:
    from kvstored.master.events import KVEventPublisher
    from kvstored.master.scheduling import NodePrefetcher
    from kvstored.scheduler.service import SchedulerServicer

log = structlog.get_logger(__name__)

STATE_FILE = "master.json"
_GC_ROWS_PER_TICK = 8192  # ~40 ms of Python per tick at most; dropped rows are already invisible


def next_master_epoch(data_dir: pathlib.Path, now_ns: int | None = None) -> int:
    """This start's epoch: max(wall clock ns, last epoch + 1), persisted in ``data_dir``.

    Raises:
        ConfigInvalid: the directory cannot be created or the state file written.
    """
    now_ns = time.time_ns() if now_ns is None else now_ns
    path = data_dir / STATE_FILE
    last = 0
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            last = int(json.loads(path.read_text()).get("epoch", 0))
    except (OSError, ValueError, AttributeError) as exc:
        if isinstance(exc, OSError) and not path.exists() and not data_dir.is_dir():
            raise ConfigInvalid(
                f"cannot create master.data_dir {str(data_dir)!r}: {exc}; change master.data_dir"
            ) from None
        log.warning("master_state_unreadable", path=str(path), error=str(exc))
    epoch = max(now_ns, last + 1)
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps({"epoch": epoch}))
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigInvalid(
            f"cannot write {str(path)!r}: {exc.strerror or exc}; change master.data_dir"
        ) from None
    return epoch




class MasterDaemon:
    """The master process: one term's :class:`~kvstored.master.state.MasterState` (built at
    start), the MasterService over it, maintenance.

    Args:
        cfg: the master's settings (validated).
        clock: monotonic seconds for leases (default ``time.monotonic``).
        tls: mutual TLS on every listen address (``[tls]``; kvstored/security/tls.py);
            None = plaintext, every caller trusted (TRUSTED_LOCAL).
        election_hooks: test hooks of the election (with ``cfg.etcd`` only).
    """

    def __init__(self, cfg: MasterConfig, *, clock: Clock | None = None,
                 tls: TlsFiles | None = None, election_hooks: ElectionHooks | None = None) -> None:
        self.cfg = cfg
        self.tls = tls
        self.clock: Clock = clock or MonotonicClock()
        self.election_hooks = election_hooks
        self.elector: Elector | None = None
        self.servicer: MasterServicer | None = None
        self.epoch = 0
        self.grpc_addresses: list[str] = []
        self.state: MasterState | None = None  # this term's (built by start())
        self.metrics = MasterMetrics()
        self.metrics_address = ""
        self._httpd: Any = None
        self._server: grpc.aio.Server | None = None
        self._maintenance: asyncio.Task[None] | None = None
        self._started = False
        self.events: KVEventPublisher | None = None  # master.events_endpoint set
        self.events_address = ""
        self.events_replay_address = ""
        self.scheduler: SchedulerServicer | None = None  # master.scheduler set
        self._prefetcher: NodePrefetcher | None = None

    def _add_scheduler(self, server: grpc.aio.Server) -> None:
        """Host the SchedulerService: locations from this term's index, copies to nodes."""
        from kvstored.master.scheduling import IndexBlockLocator, NodePrefetcher
        from kvstored.scheduler.config import SchedulerConfig
        from kvstored.scheduler.service import add_scheduler_service

        locator = IndexBlockLocator(lambda: self.state)
        self._prefetcher = NodePrefetcher(lambda: self.state, self.tls, sizes=locator.block_bytes)
        self.scheduler = add_scheduler_service(
            server, SchedulerConfig(block_tokens=self.cfg.scheduler_block_tokens),
            block_locator=locator, registry=self.metrics.registry,
            copier=self._prefetcher, copy_timeout_s=self.cfg.scheduler_copy_timeout_s)

    async def start(self) -> None:
        """Bind every listen address and start serving.

        Raises:
            ConfigInvalid: a listen address is malformed or in use; the data dir is unusable.
        """
        if self._started:
            return
        self._started = True
        cfg = self.cfg
        if not cfg.listen:
            raise ConfigInvalid("master.listen is empty; give at least one HOST:PORT")
        endpoints: tuple[str, ...] = ()
        if cfg.etcd:
            try:
                endpoints = parse_etcd_endpoints(",".join(cfg.etcd), "master.etcd")
                check_election_prefix(cfg.election_prefix, "master.election_prefix")
            except InvalidArgument as exc:
                raise ConfigInvalid(str(exc)) from None
        restarted = (pathlib.Path(cfg.data_dir) / STATE_FILE).exists()
        self.epoch = next_master_epoch(pathlib.Path(cfg.data_dir))
        if cfg.events_endpoint:
            self._start_events()
        self.state = MasterState.from_config(cfg, self.clock, epoch=self.epoch,
                                             restarted=restarted, observer=self.events)
        if self.events is not None:
            self.events.node_of = self.state.node_of_holder
            self.events.new_term()  # AllBlocksCleared before this term's first block
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0),
                                          ("grpc.max_receive_message_length", 64 << 20)])
        self.servicer = MasterServicer(self.state, metrics=self.metrics,
                                       check_roles=self.tls is not None)
        add_master_service(server, self.servicer)
        if cfg.scheduler:
            self._add_scheduler(server)
        for addr in cfg.listen:
            host, sep, port = addr.rpartition(":")
            if not sep or not host or not port.isdigit() or addr.startswith("unix:"):
                raise ConfigInvalid(f"master.listen entry {addr!r} is not HOST:PORT")
            bound = add_grpc_port(server, addr, "master.listen",
                                  credentials=port_credentials(addr, self.tls))
            self.grpc_addresses.append(f"{host}:{bound}")
        self._server = server
        await server.start()
        self.metrics.sample(self.state.membership, epoch=self.epoch, repair=self.state.repair)
        if cfg.metrics_listen:
            self._start_metrics(cfg.metrics_listen)
        self._maintenance = asyncio.create_task(self._maintain(), name="kvstored-master-maintenance")
        if endpoints:
            self.elector = Elector(
                endpoints, cfg.election_prefix, name=f"{os.uname().nodename}:{os.getpid()}",
                addresses=self.grpc_addresses, lease_s=cfg.election_lease_s,
                on_lead=self._lead, on_step_down=lambda reason: None,
                clock=self.clock, hooks=self.election_hooks)
            self.servicer.gate = self.elector
            if self.scheduler is not None:
                self.scheduler.gate = self.elector
            await self.elector.start()
        log.info("master_started", epoch=self.epoch, grpc=self.grpc_addresses, tls=self.tls is not None,
                 etcd=list(endpoints),
                 metrics=self.metrics_address,
                 node_lease_s=cfg.node_lease_s, placement_policy=cfg.placement_policy)

    def _lead(self, term: int) -> None:
        """A new leadership: a fresh term's state, swapped into the servicer whole."""
        assert self.servicer is not None
        self.epoch = next_master_epoch(pathlib.Path(self.cfg.data_dir))
        old = self.state
        if old is not None and isinstance(old.index, ObservedBlockIndex):
            old.index.detach()  # an earlier term's index never publishes again
        self.state = MasterState.from_config(self.cfg, self.clock, epoch=self.epoch,
                                             restarted=True, term=term, observer=self.events)
        if self.events is not None:
            self.events.node_of = self.state.node_of_holder
            self.events.new_term()  # AllBlocksCleared, then this term's inventories
        self.servicer.set_state(self.state)
        log.info("master_term_started", term=term, epoch=self.epoch)

    @property
    def term(self) -> int:
        """The term this master answers under (0 before start)."""
        return self.state.term if self.state is not None else 0

    def maintain_once(self) -> tuple[list[str], int, int]:
        """One maintenance step of this term (:meth:`MasterState.maintain`): (nodes expired,
        writes aborted, replica rows unlinked); nothing while a follower."""
        assert self.state is not None, "start() first"
        if self.elector is not None and not self.elector.is_leading():
            return [], 0, 0
        gone, aborted, unlinked = self.state.maintain(_GC_ROWS_PER_TICK)  # (and promotes)
        if aborted:
            self.metrics.write_lease_expiries.inc(aborted)
        self.metrics.sample(self.state.membership, epoch=self.epoch, repair=self.state.repair)
        return gone, aborted, unlinked

    def _start_metrics(self, address: str) -> None:
        from prometheus_client import start_wsgi_server

        from kvstored.addresses import format_host_port, parse_host_port

        try:
            host, port = parse_host_port(address)
            self._httpd, _ = start_wsgi_server(port, addr=host, registry=self.metrics.registry)
        except (OSError, InvalidArgument) as exc:
            raise ConfigInvalid(
                f"cannot serve master metrics on {address!r}: "
                f"{getattr(exc, 'strerror', None) or exc}; change master.metrics_listen "
                "(empty string disables it)"
            ) from None
        self.metrics_address = format_host_port(host, self._httpd.server_port)

    def _start_events(self) -> None:
        """Bind the KV-event sockets (kvstored/master/events.py; pyzmq and msgspec)."""
        from kvstored.master.events import KVEventPublisher, PublisherSettings

        cfg = self.cfg
        self.events = KVEventPublisher(PublisherSettings(
            endpoint=cfg.events_endpoint, replay_endpoint=cfg.events_replay_endpoint,
            buffer_steps=cfg.events_buffer_steps, max_events=cfg.events_max_blocks,
            batch_ms=cfg.events_batch_ms))
        self.events.start()
        self.events_address = self.events.endpoint
        self.events_replay_address = self.events.replay_endpoint

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.gc_interval_s)
            try:
                self.maintain_once()
            except Exception:
                log.exception("master_maintenance_failed")

    async def stop(self) -> None:
        """Stop serving (idempotent); a leader steps down and revokes its etcd lease first."""
        if self.elector is not None:
            await self.elector.stop()
        if self._server is not None:
            await self._server.stop(grace=1.0)
            self._server = None
        if self.scheduler is not None:
            await self.scheduler.close()
        if self._prefetcher is not None:
            await self._prefetcher.close()
        if self._maintenance is not None:
            self._maintenance.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintenance
            self._maintenance = None
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self.events is not None:
            self.events.stop()
        log.info("master_stopped", epoch=self.epoch)

    async def run(self, *, on_started: Callable[[MasterDaemon], None] | None = None) -> None:
        """Start, notify systemd, serve until SIGTERM/SIGINT, then stop."""
        watchdog = Watchdog.from_env()  # WatchdogSec= in the unit; pings from this loop
        with stop_event_on_signals() as stop_event:
            if watchdog is not None:
                watchdog.start()
            try:
                await self.start()
                if on_started is not None:
                    on_started(self)
                sd_notify(f"READY=1\nSTATUS=master serving on {', '.join(self.grpc_addresses)}")
                await stop_event.wait()
                sd_notify("STOPPING=1")
            finally:
                try:
                    await self.stop()
                finally:
                    if watchdog is not None:
                        await watchdog.stop()
