"""NodeCore: the node's request handling without gRPC, a facade over its components.

The gRPC servicer (service.py), the control channel (control.py) and the TCP data plane
(kvstored/transport/tcp_server.py, through the
:class:`~kvstored.transport.base.BlockServer` port NodeCore implements) call this class.
Nothing in here knows about protobuf or sockets, so all of it is testable with plain Python
values. Each concern is one component, built with the state it needs::

    NodeCore (facade: wiring, node state, metrics helpers)
      limits  RequestLimits  node/limits.py   batch/key/block/meta bounds, epoch, lease length
      gate    DrainGate      node/limits.py   draining; puts in flight
      reads   Reads          node/reads.py    pins, chunked and export reads, inline Get, probes
      puts    LocalPuts      node/local_put.py  lease-free reserve / commit / abort, inline Put
      grants  Grants         node/grants.py   pins and reservations under leases and sessions
                                              (LeaseBook, node/sessions.py: the fencing rule)

Every component calls the thread-safe :class:`~kvstored.tiers.tiered.TieredStore`; none
holds its own lock while calling it, so none can deadlock against the store's lock.

Thread-safe: called from the event loop, the gRPC executor threads and the data-plane
connection threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from kvstored.errors import KvstoredError
from kvstored.node.grants import Grants
from kvstored.node.limits import DrainGate, RequestLimits
from kvstored.node.local_put import LocalPuts, ReservedItem, ReserveOutcome
from kvstored.node.reads import GetOutcome, Reads
from kvstored.node.sessions import LeaseBook
from kvstored.node.slots import SlotGrants
from kvstored.types import (
    BlockInfo,
    ExportedBlock,
    PinnedBlock,
    PutOutcome,
    Reservation,
    StoreStats,
    Tier,
)

if TYPE_CHECKING:
    from kvstored.config import NodeConfig
    from kvstored.node.metrics import NodeMetrics
    from kvstored.tiers.tiered import TieredStore
    from kvstored.transport.framing import FrameLimits


class NodeCore:
    """Validation, leases and draining in front of a :class:`TieredStore` (a facade).

    Args:
        store: the block store (thread-safe).
        cfg: the node's settings (limits, lease TTL).
        epoch: this daemon start's epoch (clients check it before using the arena).
        metrics: where to count; None = no metrics.
        clock: monotonic seconds; injectable for lease tests.

    Attributes:
        limits, gate, reads, puts, grants: the components (module docstring).
        test_hook: see :attr:`Grants.test_hook` (set here, forwarded there).
    """

    def __init__(
        self,
        store: TieredStore,
        cfg: NodeConfig,
        *,
        epoch: int,
        metrics: NodeMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.epoch = epoch
        self.metrics = metrics
        self.clock = clock
        self.started_at = clock()
        self.listen_addresses: list[str] = []
        self.data_address = ""
        self.metrics_address = ""
        self.rpcs_in_flight = 0
        """gRPC handlers running now (counted on the event loop by node/service.py); the drain
        waits for them so no handler is cancelled mid-way."""
        self.limits = limits = RequestLimits(cfg, epoch=epoch, metrics=metrics)
        self.gate = gate = DrainGate(cfg.node_id)
        self.reads = reads = Reads(store, limits, gate, metrics)
        self.puts = puts = LocalPuts(store, limits, gate, metrics)
        leases = LeaseBook(cfg.max_quarantine_bytes_per_session, lambda: self.clock())
        self.grants = Grants(
            limits=limits, gate=gate, reads=reads, puts=puts, leases=leases, metrics=metrics
        )
        self.slots = SlotGrants(
            store=store, leases=leases, limits=limits, gate=gate, metrics=metrics,
            budget_bytes=min(cfg.max_slot_bytes_per_session,
                             cfg.max_quarantine_bytes_per_session // 2),
        )
        if metrics is not None:
            metrics.quarantined_bytes.set_function(leases.quarantined_bytes)
            metrics.sessions_active.set_function(leases.num_sessions)
            metrics.watch_leases(leases.num_active)

    # ---- state -------------------------------------------------------------------------
    @property
    def leases(self) -> LeaseBook:
        """The lease book (sessions, active leases, quarantine) of :attr:`grants`."""
        return self.grants.leases

    @property
    def test_hook(self) -> Callable[[str], None] | None:
        """See :attr:`Grants.test_hook`."""
        return self.grants.test_hook

    @test_hook.setter
    def test_hook(self, hook: Callable[[str], None] | None) -> None:
        self.grants.test_hook = hook

    @property
    def draining(self) -> bool:
        """True once shutdown began: new puts are refused with :class:`Draining`."""
        return self.gate.draining

    def start_draining(self) -> None:
        """Refuse new work from now on: puts, and reads that pin (PinBlocks, Get, data-plane
        GET) with :class:`Draining`. Work in flight finishes: commits of existing reservations,
        releases of existing pins and a read already streaming still succeed."""
        self.gate.start_draining()

    def uptime_s(self) -> float:
        """Seconds since this core was created."""
        return self.clock() - self.started_at

    def num_outstanding(self) -> tuple[int, int, int]:
        """``(active pin leases, active reservation leases, data-plane/inline puts in flight)``
        (quarantined leases are not counted: their holder is late already)."""
        puts = self.gate.num_puts_in_flight()
        leases = self.grants.leases
        return leases.num_active("pin"), leases.num_active("reservation"), puts

    def put_in_flight(self) -> AbstractContextManager[None]:
        """Count a put for the drain; refuse it with :class:`Draining` once draining."""
        return self.gate.put_in_flight()

    # ---- validation (RequestLimits) ----------------------------------------------------
    def check_batch(self, num_keys: int) -> None:
        """Raise :class:`BatchTooLarge` if a call carries more than ``max_batch_keys`` keys."""
        self.limits.check_batch(num_keys)

    def check_namespace_id(self, namespace_id: bytes) -> None:
        """Raise :class:`InvalidArgument` for a namespace id longer than 64 bytes."""
        self.limits.check_namespace_id(namespace_id)

    def check_epoch(self, epoch: int) -> None:
        """Raise retriable :class:`Unavailable` when a client's epoch (if any) is not ours."""
        self.limits.check_epoch(epoch)

    def key_error(self, index: int, key: bytes) -> KvstoredError | None:
        """The error for a bad key at ``index`` of a batch, or None if it is valid."""
        return self.limits.key_error(index, key)

    def check_keys(self, keys: Sequence[bytes]) -> None:
        """Raise for the whole call on the first bad key (calls without per-item status)."""
        self.limits.check_keys(keys)

    def put_item_error(
        self, index: int, key: bytes, size_bytes: int, meta: bytes
    ) -> KvstoredError | None:
        """The error for a bad put item (key, size, meta), or None if it is valid."""
        return self.limits.put_item_error(index, key, size_bytes, meta)

    def frame_limits(self) -> FrameLimits:
        """The bounds of one data-plane request under this node's config."""
        return self.limits.frame_limits()

    def lease_s(self, lease_ms: int) -> float:
        """The lease to grant for a client's ``lease_ms`` request (0 = node default)."""
        return self.limits.lease_s(lease_ms)

    # ---- lease-free puts (LocalPuts) ---------------------------------------------------
    def reserve_items(
        self, items: Sequence[tuple[bytes, int, bytes]], namespace_id: bytes, *,
        copy: bool = False, spare_only: bool = False,
    ) -> list[Reservation | PutOutcome]:
        """See :meth:`LocalPuts.reserve_items`."""
        return self.puts.reserve_items(items, namespace_id, copy=copy, spare_only=spare_only)

    def reserve_one(
        self, index: int, key: bytes, size_bytes: int, meta: bytes, namespace_id: bytes,
        *, seen: set[bytes] | None = None, copy: bool = False,
        handoff_age_s: float | None = None, spare_or_redundant: bool = False,
    ) -> Reservation | PutOutcome:
        """See :meth:`LocalPuts.reserve_one`."""
        return self.puts.reserve_one(index, key, size_bytes, meta, namespace_id, seen=seen,
                                     copy=copy, handoff_age_s=handoff_age_s,
                                     spare_or_redundant=spare_or_redundant)

    def commit_reserved(self, items: Sequence[Reservation | PutOutcome]) -> list[PutOutcome]:
        """See :meth:`LocalPuts.commit_reserved`."""
        return self.puts.commit_reserved(items)

    def abort_reserved(self, items: Sequence[object]) -> None:
        """See :meth:`LocalPuts.abort_reserved`."""
        self.puts.abort_reserved(items)

    def put_inline(
        self, items: Sequence[tuple[bytes, memoryview | bytes, bytes]], namespace_id: bytes,
        *, may_block: bool = True,
    ) -> list[PutOutcome] | object:
        """See :meth:`LocalPuts.put_inline`."""
        return self.puts.put_inline(items, namespace_id, may_block=may_block)

    # ---- reads (Reads) -----------------------------------------------------------------
    def pin_items(
        self, keys: Sequence[bytes], namespace_id: bytes, *, may_block: bool = True,
        cut: bool = False,
    ) -> list[PinnedBlock | None | KvstoredError]:
        """See :meth:`Reads.pin_items`."""
        return self.reads.pin_items(keys, namespace_id, may_block=may_block, cut=cut)

    def pinned_chunks(
        self, keys: Sequence[bytes], namespace_id: bytes, *, chunk_keys: int = 64
    ) -> Generator[
        tuple[int, list[PinnedBlock | ExportedBlock | None | KvstoredError]], None, None
    ]:
        """See :meth:`Reads.pinned_chunks`."""
        return self.reads.pinned_chunks(keys, namespace_id, chunk_keys=chunk_keys)

    def export_chunks(
        self, keys: Sequence[bytes], namespace_id: bytes, *, chunk_keys: int = 64
    ) -> Generator[tuple[int, list[ExportedBlock | None | KvstoredError]], None, None]:
        """See :meth:`Reads.export_chunks`."""
        return self.reads.export_chunks(keys, namespace_id, chunk_keys=chunk_keys)

    def touch_hits(self, hits: Sequence[PinnedBlock], namespace_id: bytes = b"") -> None:
        """See :meth:`Reads.touch_hits`."""
        self.reads.touch_hits(hits, namespace_id)

    def unpin_all(self, blocks: Sequence[object]) -> None:
        """See :meth:`Reads.unpin_all`."""
        self.reads.unpin_all(blocks)

    def get_inline(
        self, keys: Sequence[bytes], namespace_id: bytes, *, budget_bytes: int
    ) -> list[GetOutcome]:
        """See :meth:`Reads.get_inline`."""
        return self.reads.get_inline(keys, namespace_id, budget_bytes=budget_bytes)

    def lookup_prefix(self, keys: Sequence[bytes], namespace_id: bytes) -> list[Tier]:
        """See :meth:`Reads.lookup_prefix`."""
        return self.reads.lookup_prefix(keys, namespace_id)

    def exists(
        self, keys: Sequence[bytes], namespace_id: bytes = b"", *, with_tiers: bool = False
    ) -> tuple[list[bool], list[Tier | None]]:
        """See :meth:`Reads.exists`."""
        return self.reads.exists(keys, namespace_id, with_tiers=with_tiers)

    def list_blocks(self, namespace_id: bytes, limit: int) -> tuple[list[BlockInfo], bool]:
        """See :meth:`Reads.list_blocks`."""
        return self.reads.list_blocks(namespace_id, limit)

    def remove(self, keys: Sequence[bytes], namespace_id: bytes = b"") -> list[bool]:
        """Per key: removed (False = absent in this namespace, or pinned and kept)."""
        self.limits.check_keys(keys)
        self.limits.check_namespace_id(namespace_id)
        return self.store.remove(keys, namespace_id=namespace_id)

    def stats(self) -> StoreStats:
        """The store's counters and usage."""
        return self.store.stats()

    # ---- grants (Grants): every lease-bearing operation --------------------------------
    def pin_blocks(
        self,
        keys: Sequence[bytes],
        namespace_id: bytes,
        *,
        session_id: int,
        lease_ms: int = 0,
        epoch: int = 0,
        may_block: bool = True,
        request_id: int = 0,
    ) -> tuple[int, list[PinnedBlock | None | KvstoredError]]:
        """See :meth:`Grants.pin_blocks` (``session_id`` required: a grant needs a session)."""
        return self.grants.pin_blocks(
            keys, namespace_id, session_id=session_id, lease_ms=lease_ms, epoch=epoch,
            may_block=may_block, request_id=request_id,
        )

    def reserve_put(
        self,
        items: Sequence[tuple[bytes, int, bytes]],
        namespace_id: bytes,
        *,
        session_id: int,
        lease_ms: int = 0,
        epoch: int = 0,
        request_id: int = 0,
    ) -> tuple[int, list[ReserveOutcome]]:
        """See :meth:`Grants.reserve_put` (``session_id`` required: a grant needs a session)."""
        return self.grants.reserve_put(
            items, namespace_id, session_id=session_id, lease_ms=lease_ms, epoch=epoch,
            request_id=request_id,
        )

    def reserve_put_items(
        self,
        items: Sequence[tuple[bytes, int, bytes]],
        namespace_id: bytes,
        *,
        session_id: int,
        lease_ms: int = 0,
        epoch: int = 0,
        request_id: int = 0,
        may_block: bool = True,
    ) -> tuple[int, list[ReservedItem] | object]:
        """See :meth:`Grants.reserve_put_items`."""
        return self.grants.reserve_put_items(
            items, namespace_id, session_id=session_id, lease_ms=lease_ms, epoch=epoch,
            request_id=request_id, may_block=may_block,
        )

    def commit_put(self, reservation_id: int, *, abort: bool = False) -> list[PutOutcome]:
        """See :meth:`Grants.commit_put`."""
        return self.grants.commit_put(reservation_id, abort=abort)

    def release_pins(self, pin_ids: Sequence[int]) -> int:
        """See :meth:`Grants.release_pins`."""
        return self.grants.release_pins(pin_ids)

    def release_pins_report(self, pin_ids: Sequence[int]) -> tuple[int, list[int]]:
        """See :meth:`Grants.release_pins_report`."""
        return self.grants.release_pins_report(pin_ids)

    def release_orphans(self, session_id: int, request_ids: Sequence[int]) -> int:
        """See :meth:`Grants.release_orphans`."""
        return self.grants.release_orphans(session_id, request_ids)

    def reap_expired(self) -> int:
        """See :meth:`Grants.reap_expired`."""
        return self.grants.reap_expired()

    def open_session(self, peer: str = "") -> int:
        """See :meth:`Grants.open_session`."""
        return self.grants.open_session(peer)

    def close_session(self, session_id: int) -> None:
        """See :meth:`Grants.close_session`."""
        self.grants.close_session(session_id)

    def quarantined_bytes(self) -> int:
        """Bytes in quarantine over all sessions."""
        return self.grants.quarantined_bytes()

    def release_all(self) -> None:
        """See :meth:`Grants.release_all`."""
        self.grants.release_all()

    # ---- metrics helpers ---------------------------------------------------------------
    def count_transfer(
        self, transport: str, direction: str, num_blocks: int, num_bytes: int
    ) -> None:
        """Count payload moved by a transport (shm, tcp, grpc) in a direction (in, out)."""
        if self.metrics is not None:
            self.metrics.count_transfer(transport, direction, num_blocks, num_bytes)

    def count_one_sided(
        self, *, hit_blocks: int, hit_bytes: int, fallback_blocks: int, miss_blocks: int,
        lookup_blocks: int, lookup_hit_blocks: int,
    ) -> None:
        """Count what a local client read or probed one-sided (no round trip; its report,
        ``ControlRequest.one_sided``): hits as store gets and DRAM hits (``Stats``,
        ``kvstored_store_*``, ``kvstored_tier_hits_total``), every outcome in
        ``kvstored_one_sided_blocks_total``, lookups in ``kvstored_lookup_*``. No pin and
        no PinBlocks is counted: none was taken. The counts are the client's word (a local
        client shares the arena: trusted as for its writes)."""
        if hit_blocks:
            self.store.count_one_sided_hits(hit_blocks)
        m = self.metrics
        if m is not None:
            m.count_one_sided(hit_blocks, hit_bytes, fallback_blocks, miss_blocks)
            if lookup_blocks:
                m.count_lookup(lookup_blocks, lookup_hit_blocks)

    def count_dataplane_request(self, op: str, code: str) -> None:
        """Count one data-plane request by op (``get``, ``put``) and ErrorCode name."""
        if self.metrics is not None:
            self.metrics.count_dataplane_request(op, code)

    def count_dataplane_connection(self, delta: int) -> None:
        """Move the open data-plane connections gauge by ``delta`` (+1 opened, -1 closed)."""
        if self.metrics is not None:
            self.metrics.dataplane_connections.inc(delta)
