"""NodeCore: the node's request handling without gRPC (validation, leases, draining, metrics).

The gRPC servicer (service.py) and the TCP data plane (kvstored/transport/tcp.py) both call
this class; it calls the thread-safe :class:`~kvstored.tiers.tiered.TieredStore`. Nothing in
here knows about protobuf or sockets, so all of it is testable with plain Python values.

Leases and fencing: pins (``pin_blocks``) and reservations (``reserve_put``) taken on behalf
of a shared-memory client are recorded in a :class:`~kvstored.node.sessions.LeaseBook` under
the client's session. The fencing rule lives in kvstored/node/sessions.py: space is freed only
on the holder's ack or when its session ended; a lapsed lease (``reap_expired``, called
periodically by the daemon) only moves the space into quarantine. Ids are random 63-bit
numbers, so an id from before a restart never names something of the new process.

::

    reserve_put --> id -> Lease([Reservation | PutOutcome ...]) --> commit_put (or abort)
    pin_blocks  --> id -> Lease([PinnedBlock ...])              --> release_pins
                      | lease lapses: quarantine (nothing freed) | session ends: release all

Validation happens per item where the wire has a per-item status (put, reserve, pin, get):
a bad item gets its own error and the good ones proceed. Calls without per-item status
(exists, lookup_prefix, remove) raise for the whole call, naming the bad index.

Locking: ``self._lock`` guards the in-flight counter only and the lease book has its own
lock; neither is held while calling the store, so they cannot deadlock against the store's
lock.

Thread-safe: called from the gRPC executor threads and the data-plane connection threads.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from kvstored.errors import (
    BatchTooLarge,
    BlockTooLarge,
    Draining,
    InvalidArgument,
    KeyInvalid,
    KvstoredError,
    LeaseExpired,
    NoCapacity,
    Unavailable,
)
from kvstored.keys import format_hash
from kvstored.node.pins import pin_items
from kvstored.node.sessions import NO_SESSION, Lease, LeaseBook, LeaseState
from kvstored.node.local_put import (  # noqa: F401  (ReserveOutcome re-exported)
    MAX_META_BYTES,
    PutOutcome,
    ReserveOutcome,
    ShmPutMixin,
)
from kvstored.types import PinnedBlock, Reservation, StoreStats, Tier
from kvstored.transport.framing import FrameLimits

if TYPE_CHECKING:
    from kvstored.config import NodeConfig
    from kvstored.metrics import NodeMetrics
    from kvstored.tiers.tiered import TieredStore

log = structlog.get_logger(__name__)

MAX_NAMESPACE_ID_BYTES = 64
"""Longest namespace id accepted, bytes (Namespace.id is 16)."""
MAX_LEASE_S = 600.0
"""Longest lease a client may ask for, seconds."""
DEFAULT_LIST_LIMIT = 10000
MAX_LIST_LIMIT = 1_000_000


@dataclass(frozen=True, slots=True)
class GetOutcome:
    """One block copied out inline: found or a miss, or an error for this item."""

    found: bool
    value: bytes = b""
    meta: bytes = b""
    tier: Tier | None = None
    error: KvstoredError | None = None


class NodeCore(ShmPutMixin):
    """Validation, leases and draining in front of a :class:`TieredStore`.

    Args:
        store: the block store (thread-safe).
        cfg: the node's settings (limits, lease TTL).
        epoch: this daemon start's epoch (clients check it before using the arena).
        metrics: where to count; None = no metrics.
        clock: monotonic seconds; injectable for lease tests.

    Attributes:
        test_hook: None, or ``fn(event)`` called at ``"reserve_put_held"`` / ``"pin_blocks_held"``
            once a reservation/pin is recorded and before the call returns (tests hold an RPC
            in flight there); costs one attribute test when unset.
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
        self._draining = False
        self._lock = threading.Lock()
        self.leases = LeaseBook(cfg.max_quarantine_bytes_per_session, lambda: self.clock())
        self._inflight_puts = 0
        self.rpcs_in_flight = 0
        """gRPC handlers running now (counted on the event loop by node/service.py); the drain
        waits for them so no handler is cancelled mid-way."""
        self.test_hook: Callable[[str], None] | None = None
        if metrics is not None:
            metrics.quarantined_bytes.set_function(self.leases.quarantined_bytes)
            metrics.sessions_active.set_function(self.leases.num_sessions)
            metrics.watch_leases(self.leases.num_active)

    # ---- state -------------------------------------------------------------------------
    @property
    def draining(self) -> bool:
        """True once shutdown began: new puts are refused with :class:`Draining`."""
        return self._draining

    def start_draining(self) -> None:
        """Refuse new work from now on: puts, and reads that pin (PinBlocks, Get, data-plane
        GET) with :class:`Draining`. Work in flight finishes: commits of existing reservations,
        releases of existing pins and a read already streaming still succeed."""
        self._draining = True

    def _check_reads_allowed(self) -> None:
        if self._draining:
            raise Draining(
                f"node {self.cfg.node_id} is draining for shutdown and refuses new reads; "
                "retry on another node or after it restarted"
            )

    def uptime_s(self) -> float:
        """Seconds since this core was created."""
        return self.clock() - self.started_at

    def num_outstanding(self) -> tuple[int, int, int]:
        """``(active pin leases, active reservation leases, data-plane/inline puts in flight)``
        (quarantined leases are not counted: their holder is late already)."""
        with self._lock:
            puts = self._inflight_puts
        return self.leases.num_active("pin"), self.leases.num_active("reservation"), puts

    @contextmanager
    def put_in_flight(self) -> Iterator[None]:
        """Count a put for the drain; refuse it with :class:`Draining` once draining."""
        if self._draining:
            raise Draining(
                f"node {self.cfg.node_id} is draining for shutdown and refuses new puts; "
                "retry on another node or after it restarted"
            )
        with self._lock:
            self._inflight_puts += 1
        try:
            yield
        finally:
            with self._lock:
                self._inflight_puts -= 1

    # ---- validation ----------------------------------------------------------------------
    def check_batch(self, num_keys: int) -> None:
        """Raise :class:`BatchTooLarge` if a call carries more than ``max_batch_keys`` keys."""
        if num_keys > self.cfg.max_batch_keys:
            raise BatchTooLarge(
                f"{num_keys} keys in one call; at most {self.cfg.max_batch_keys} are accepted "
                "(node.max_batch_keys); split the batch"
            )

    def check_namespace_id(self, namespace_id: bytes) -> None:
        """Raise :class:`InvalidArgument` for a namespace id longer than 64 bytes."""
        if len(namespace_id) > MAX_NAMESPACE_ID_BYTES:
            raise InvalidArgument(
                f"namespace_id is {len(namespace_id)} bytes; at most {MAX_NAMESPACE_ID_BYTES} "
                "(Namespace.id is 16 bytes)"
            )

    def check_epoch(self, epoch: int) -> None:
        """Raise retriable :class:`Unavailable` when a client's epoch (if any) is not ours."""
        if epoch and epoch != self.epoch:
            raise Unavailable(
                f"node {self.cfg.node_id} restarted: the request is for epoch {epoch} but the "
                f"node's epoch is {self.epoch}; describe the node again and remap its arena"
            )

    def key_error(self, index: int, key: bytes) -> KeyInvalid | None:
        """The error for a bad key at ``index`` of a batch, or None if it is valid."""
        n = len(key)
        lo, hi = self.cfg.min_key_bytes, self.cfg.max_key_bytes
        if n == 0:
            return KeyInvalid(f"key #{index} is empty; pass a block hash of {lo}..{hi} bytes")
        if n < lo or n > hi:
            return KeyInvalid(
                f"key #{index} is {n} bytes; keys must be {lo}..{hi} bytes "
                "(node.min_key_bytes, node.max_key_bytes)"
            )
        return None

    def check_keys(self, keys: Sequence[bytes]) -> None:
        """Raise for the whole call on the first bad key (calls without per-item status)."""
        self.check_batch(len(keys))
        lens = set(map(len, keys))
        if not lens or (min(lens) >= max(self.cfg.min_key_bytes, 1) and max(lens) <= self.cfg.max_key_bytes):
            return  # fast path (C-level loops)
        for i, key in enumerate(keys):
            err = self.key_error(i, key)
            if err is not None:
                raise err

    def put_item_error(
        self, index: int, key: bytes, size_bytes: int, meta: bytes
    ) -> KvstoredError | None:
        """The error for a bad put item (key, size, meta), or None if it is valid."""
        err: KvstoredError | None = self.key_error(index, key)
        if err is not None:
            return err
        if size_bytes > self.cfg.max_block_bytes:
            return BlockTooLarge(
                f"block #{index} ({format_hash(key)}) is {size_bytes} bytes; the limit is "
                f"{self.cfg.max_block_bytes} bytes (node.max_block_bytes)"
            )
        if len(meta) > MAX_META_BYTES:
            return InvalidArgument(
                f"meta of block #{index} ({format_hash(key)}) is {len(meta)} bytes; at most "
                f"{MAX_META_BYTES} bytes are stored with a block"
            )
        return None

    def frame_limits(self) -> FrameLimits:
        """The bounds of one data-plane request under this node's config (checked by the
        transport before it allocates anything for what a peer announces)."""
        cfg = self.cfg
        return FrameLimits(
            max_items=cfg.max_batch_keys,
            max_key_bytes=cfg.max_key_bytes,
            max_meta_bytes=MAX_META_BYTES,
            max_namespace_bytes=MAX_NAMESPACE_ID_BYTES,
            max_item_bytes=cfg.max_block_bytes,
            max_request_payload_bytes=max(cfg.dataplane_max_request_bytes, cfg.max_block_bytes),
            max_body_bytes=cfg.dataplane_max_header_bytes,
        )

    def _count_item_error(self, err: KvstoredError) -> KvstoredError:
        if self.metrics is not None:
            self.metrics.count_item_error(err.code.name)
        return err

    def lease_s(self, lease_ms: int) -> float:
        """The lease to grant for a client's ``lease_ms`` request (0 = node default)."""
        if lease_ms <= 0:
            return self.cfg.pin_lease_s
        return min(lease_ms / 1000.0, MAX_LEASE_S)

    def _record_lease(
        self,
        kind: str,
        session_id: int,
        items: list[object],
        num_bytes: int,
        lease_ms: int,
        request_id: int = 0,
    ) -> int:
        lease_id = self.leases.add(
            kind, session_id, items, num_bytes, self.lease_s(lease_ms), request_id
        )
        if lease_id is None:  # nobody will ack: the session ended, or the client gave up on it
            self._release(kind, items)
            if self.leases.is_open(session_id):
                raise LeaseExpired(
                    f"request {request_id} of session {session_id} arrived after the client "
                    "acknowledged it never received its answer; nothing was granted"
                )
            raise Unavailable(f"session {session_id} ended during the call; open a new session")
        if self.test_hook is not None:
            self.test_hook(f"{'reserve_put' if kind == 'reservation' else 'pin_blocks'}_held")
        return lease_id

    def _release(self, kind: str, items: Sequence[object]) -> None:
        if kind == "pin":
            self.unpin_all(items)
        else:
            self.abort_reserved(items)

    # ---- puts ----------------------------------------------------------------------------
    def reserve_items(
        self,
        items: Sequence[tuple[bytes, int, bytes]],
        namespace_id: bytes,
        *,
        copy: bool = False,
    ) -> list[Reservation | PutOutcome]:
        """Validate and reserve each item (no lease): a Reservation, or the item's outcome.

        A key repeated within the batch is an ok no-op after its first (valid) occurrence:
        first writer wins, as across batches. ``copy``: the items are remote-fill copies of
        blocks a peer holds (``TieredStore.reserve(copy=True)``: a copy never evicts a block
        the pool holds nowhere else; no room is the item's NoCapacity, not counted as an
        item error).

        The caller must commit (``commit_reserved``) or abort (``abort_reserved``) every
        returned Reservation. Used by the inline put and the data plane.
        """
        out: list[Reservation | PutOutcome] = []
        seen: set[bytes] = set()
        try:
            for i, (key, size, meta) in enumerate(items):
                out.append(self.reserve_one(i, key, size, meta, namespace_id, seen=seen,
                                            copy=copy))
        except BaseException:
            self.abort_reserved(out)
            raise
        return out

    def reserve_one(
        self, index: int, key: bytes, size_bytes: int, meta: bytes, namespace_id: bytes,
        *, seen: set[bytes] | None = None, copy: bool = False,
    ) -> Reservation | PutOutcome:
        """Validate and reserve item ``index`` of a batch (no lease).

        Used by the data plane to reserve each item only once its payload starts arriving.

        Returns:
            A Reservation the caller must commit or abort, or the item's outcome (already
            stored, or its own error, counted in metrics). ``seen`` (the batch's keys so far)
            makes a later duplicate of a key in the same batch an ok no-op: first writer wins
            within a batch too.
        """
        err = self.put_item_error(index, key, size_bytes, meta)
        if err is not None:
            return PutOutcome(False, self._count_item_error(err))
        if seen is not None:
            if key in seen:
                return PutOutcome(False)
            seen.add(key)
        try:
            res = self.store.reserve(key, size_bytes, namespace_id=namespace_id, meta=meta,
                                     copy=copy)
        except NoCapacity as exc:
            return PutOutcome(False, exc if copy else self._count_item_error(exc))
        except KvstoredError as exc:
            return PutOutcome(False, self._count_item_error(exc))
        return PutOutcome(False) if res is None else res

    def commit_reserved(self, items: Sequence[Reservation | PutOutcome]) -> list[PutOutcome]:
        """Commit every Reservation among ``items`` (head first, so the head is most recent)."""
        reservations = [x for x in items if isinstance(x, Reservation)]
        flags = iter(self.store.commit_many(reservations))
        return [PutOutcome(next(flags)) if isinstance(x, Reservation) else x for x in items]

    def abort_reserved(self, items: Sequence[object]) -> None:
        """Abort every Reservation among ``items`` (idempotent)."""
        for x in items:
            if isinstance(x, Reservation):
                self.store.abort(x)

    # ---- gets ----------------------------------------------------------------------------
    def pin_items(
        self, keys: Sequence[bytes], namespace_id: bytes, *, may_block: bool = True,
        cut: bool = False,
    ) -> list[PinnedBlock | None | KvstoredError]:
        """Validate keys and pin the good ones (no lease); bad keys get their own error.

        The caller must ``store.unpin`` every returned PinnedBlock. With ``cut`` (a chunked
        read that reads again from the first NoCapacity after its first key), the store
        stops at that key: it and every key after it get NoCapacity and are neither pinned
        nor counted (gets, misses, item errors), so a key is counted once per request
        whatever the chunking (issue 9).
        """
        return pin_items(self, keys, namespace_id, may_block=may_block, cut=cut)

    def pinned_chunks(
        self, keys: Sequence[bytes], namespace_id: bytes, *, chunk_keys: int = 64
    ) -> Generator[tuple[int, list[PinnedBlock | None | KvstoredError]], None, None]:
        """Pin ``keys`` a chunk at a time: yields ``(start index, per-key results)``.

        A chunk's pins are released when the consumer asks for the next chunk or closes the
        generator (use ``contextlib.closing``). When an SSD hit cannot be promoted because the
        chunk's own pins fill DRAM (NoCapacity after the chunk's first key), the chunk is cut
        there and the next one restarts at that key, so a read larger than DRAM still
        completes; only a block that cannot fit even alone reports NoCapacity.

        Raises:
            Draining: on the first ``next()``, when the node is draining (a read already
                past its first chunk finishes).
        """
        self._check_reads_allowed()
        i, n = 0, len(keys)
        hits: list[PinnedBlock] = []  # for recency over the whole request, see below
        num_chunks = 0
        try:
            while i < n:
                got = self.pin_items(keys[i : i + chunk_keys], namespace_id, cut=True)
                num_chunks += 1
                cut = len(got)
                for j in range(1, len(got)):
                    if isinstance(got[j], NoCapacity):
                        cut = j
                        break
                hits.extend(b for b in got[:cut] if isinstance(b, PinnedBlock))
                try:
                    yield i, got[:cut]
                finally:
                    self.unpin_all(got)
                i += cut
        finally:
            if num_chunks > 1 and hits:
                # Each pin_many touched its own chunk tail-first, so a later chunk ended up
                # more recent than an earlier one; touch once more in whole-request order so
                # keys[0] is the most recent and eviction takes the request's tail first.
                self.touch_hits(hits, namespace_id)

    def touch_hits(self, hits: Sequence[PinnedBlock], namespace_id: bytes = b"") -> None:
        """Make ``hits`` (one request's hits, in request order) the most recent, head last.

        Never pins, promotes or counts; blocks evicted meanwhile are skipped.
        """
        self.store.touch_many(
            [b.key for b in hits], namespace_id=namespace_id,
            ssd_keys={b.key for b in hits if b.tier == Tier.SSD},
        )

    def unpin_all(self, blocks: Sequence[object]) -> None:
        """Unpin every PinnedBlock among ``blocks`` (one store call); a stale pin is logged,
        never raised."""
        pins = [b for b in blocks if isinstance(b, PinnedBlock)]
        if not pins:
            return
        try:
            stale = self.store.unpin_many(pins)
        except KvstoredError as exc:  # the store is closed
            log.debug("unpin_skipped", num_blocks=len(pins), error=str(exc))
            return
        for b in stale:  # already released
            log.debug("unpin_skipped", key=format_hash(b.key), error="not pinned")

    def pin_blocks(
        self,
        keys: Sequence[bytes],
        namespace_id: bytes,
        *,
        lease_ms: int = 0,
        epoch: int = 0,
        session_id: int = NO_SESSION,
        may_block: bool = True,
        request_id: int = 0,
    ) -> tuple[int, list[PinnedBlock | None | KvstoredError]]:
        """Pin blocks for the shared-memory get path, under a lease and a session.

        Returns:
            ``(pin_id, per key: PinnedBlock | None (miss) | error)``; ``pin_id`` is 0 when
            nothing was pinned. Release with :meth:`release_pins`; a pin whose lease lapses
            stays pinned (quarantined) until released or its session ends. With
            ``may_block=False`` (the event loop's fast path) a block that needs disk I/O makes
            every item ``NEEDS_IO`` and nothing is pinned (see ``TieredStore.pin_many``).

        Raises:
            Draining (the node is shutting down), Unavailable (epoch mismatch; session not
            open), BatchTooLarge, InvalidArgument, NoCapacity (the session's quarantine is over
            its bound).
        """
        self._check_reads_allowed()
        self.check_epoch(epoch)
        self.check_batch(len(keys))
        self.check_namespace_id(namespace_id)
        self.leases.check_session(session_id)
        # cut: the shm client reads again from the first NoCapacity after the first key
        got = self.pin_items(keys, namespace_id, may_block=may_block, cut=True)
        pinned = [b for b in got if isinstance(b, PinnedBlock)]
        if not pinned:
            return 0, got
        num_bytes = sum(b.size_bytes for b in pinned)
        pin_id = self._record_lease("pin", session_id, list(pinned), num_bytes, lease_ms, request_id)
        self.count_transfer("shm", "out", len(pinned), num_bytes)
        return pin_id, got

    def release_pins(self, pin_ids: Sequence[int]) -> int:
        """Release pins of :meth:`pin_blocks`; unknown ids are ignored.

        Returns:
            How many of ``pin_ids`` were held in time and are released now (lapsed ones are
            released too: see :meth:`release_pins_report`).
        """
        return self.release_pins_report(pin_ids)[0]

    def release_pins_report(self, pin_ids: Sequence[int]) -> tuple[int, list[int]]:
        """Release pins of :meth:`pin_blocks` (the reader's ack); unknown ids are ignored.

        Returns:
            ``(number released now that were in time, ids whose lease had lapsed)``: a copy
            out of a lapsed pin must be reported as LeaseExpired by the reader. Lapsed pins
            were kept pinned (quarantined) until now, so their bytes never changed.
        """
        released: list[Lease] = []
        expired: list[int] = []
        num_in_time = 0
        for pin_id in pin_ids:
            state, lease = self.leases.take("pin", pin_id)
            if lease is not None:
                released.append(lease)
            if state is LeaseState.HELD:
                num_in_time += 1
            elif state is not LeaseState.UNKNOWN:
                expired.append(pin_id)
        if len(released) == 1:
            self.unpin_all(released[0].items)
        elif released:
            self.unpin_all([b for lease in released for b in lease.items])
        return num_in_time, expired

    def release_orphans(self, session_id: int, request_ids: Sequence[int]) -> int:
        """The client never received these ReservePut/PinBlocks answers: free their grants.

        The client's acknowledgement for a granting call that failed without a response
        (deadline, dropped connection): it never learnt the offsets, so it cannot be copying
        into or out of the space, active or quarantined. Idempotent; see
        :meth:`LeaseBook.release_orphans`.

        Returns:
            Number of grants freed now.
        """
        leases = self.leases.release_orphans(session_id, list(request_ids))
        for lease in leases:
            self._release(lease.kind, lease.items)
        if leases:
            log.info(
                "orphan_grants_released", session_id=session_id, num_leases=len(leases),
                num_bytes=sum(x.num_bytes for x in leases),
            )
        return len(leases)

    def get_inline(
        self, keys: Sequence[bytes], namespace_id: bytes, *, budget_bytes: int
    ) -> list[GetOutcome]:
        """Copy blocks out for the inline gRPC Get.

        At most ``budget_bytes`` of values are returned (but always the first found block);
        items past the budget get a :class:`BatchTooLarge` status so the client fetches them
        in another call.
        """
        self.check_batch(len(keys))
        self.check_namespace_id(namespace_id)
        out: list[GetOutcome] = []
        used = num = 0
        full = False
        unserved: list[PinnedBlock] = []
        with contextlib.closing(self.pinned_chunks(keys, namespace_id)) as chunks:
            for start, got in chunks:
                for j, b in enumerate(got):
                    if isinstance(b, PinnedBlock):
                        if full or (num and used + b.size_bytes > budget_bytes):
                            full = True
                            unserved.append(b)  # asked for again in the client's next call
                            out.append(GetOutcome(False, error=BatchTooLarge(
                                f"inline response budget of {budget_bytes} bytes reached at key "
                                f"#{start + j}; fetch the remaining keys in another call or use "
                                "the data plane"
                            )))
                            continue
                        out.append(GetOutcome(True, bytes(b.view), b.meta, b.tier))
                        used += b.size_bytes
                        num += 1
                    elif b is None:
                        out.append(GetOutcome(False))
                    else:
                        out.append(GetOutcome(False, error=b))
                if full:  # the rest goes in the client's next call: do not pin it now
                    for i in range(len(out), len(keys)):
                        out.append(GetOutcome(False, error=BatchTooLarge(
                            f"inline response budget of {budget_bytes} bytes reached before key #{i}"
                        )))
                    break
        if unserved:
            self.store.uncount_reads(unserved)
        self.count_transfer("grpc", "out", num, used)
        return out

    # ---- probes and admin ------------------------------------------------------------------
    def lookup_prefix(self, keys: Sequence[bytes], namespace_id: bytes) -> list[Tier]:
        """Tiers of the leading present blocks (stops at the first miss); never pins."""
        self.check_keys(keys)
        self.check_namespace_id(namespace_id)
        tiers = self.store.lookup_prefix(keys, namespace_id=namespace_id)
        if self.metrics is not None:
            self.metrics.count_lookup(len(keys), len(tiers))
        return tiers

    def exists(
        self, keys: Sequence[bytes], namespace_id: bytes = b"", *, with_tiers: bool = False
    ) -> tuple[list[bool], list[Tier | None]]:
        """Per key: present; with ``with_tiers`` also the tier (DRAM preferred), else []."""
        self.check_keys(keys)
        self.check_namespace_id(namespace_id)
        present = self.store.exists(keys, namespace_id=namespace_id)
        if not with_tiers:
            return present, []
        tiers: list[Tier | None] = []
        for key, p in zip(keys, present, strict=True):
            found = self.store.lookup_prefix([key], namespace_id=namespace_id) if p else []
            tiers.append(found[0] if found else None)
        return present, tiers

    def remove(self, keys: Sequence[bytes], namespace_id: bytes = b"") -> list[bool]:
        """Per key: removed (False = absent in this namespace, or pinned and kept)."""
        self.check_keys(keys)
        self.check_namespace_id(namespace_id)
        return self.store.remove(keys, namespace_id=namespace_id)

    def stats(self) -> StoreStats:
        """The store's counters and usage."""
        return self.store.stats()

    def list_blocks(self, namespace_id: bytes, limit: int) -> tuple[list, bool]:  # type: ignore[type-arg]
        """Admin listing; ``limit`` 0 = 10000. Never pins or touches recency."""
        self.check_namespace_id(namespace_id)
        if limit <= 0:
            limit = DEFAULT_LIST_LIMIT
        return self.store.list_blocks(namespace_id=namespace_id, limit=min(limit, MAX_LIST_LIMIT))

    # ---- leases --------------------------------------------------------------------------
    def reap_expired(self) -> int:
        """Quarantine pins and reservations whose lease ran out (stalled or dead clients).

        Nothing is freed here: the holder may still be copying (fencing rule,
        kvstored/node/sessions.py). Its ack or the end of its session frees the space.

        Returns:
            Number of leases quarantined now.
        """
        moved = self.leases.quarantine_lapsed()
        for lease in moved:
            log.info(
                "lease_expired", kind=lease.kind, lease_id=lease.lease_id,
                session_id=lease.session_id, num_blocks=len(lease.items),
                quarantined_bytes=lease.num_bytes,
            )
            if self.metrics is not None:
                self.metrics.count_lease_expired(lease.kind)
        return len(moved)

    def open_session(self, peer: str = "") -> int:
        """Open a client session (OpenSession); its id fences what it pins and reserves."""
        sid = self.leases.open_session(peer)
        log.debug("session_opened", session_id=sid, peer=peer)
        return sid

    def close_session(self, session_id: int) -> None:
        """The client's session ended (stream gone): release everything it held, at once."""
        leases = self.leases.close_session(session_id)
        for lease in leases:
            self._release(lease.kind, lease.items)
        if leases:
            log.info("session_closed_with_leases", session_id=session_id, num_leases=len(leases))

    def quarantined_bytes(self) -> int:
        """Bytes in quarantine over all sessions."""
        return self.leases.quarantined_bytes()

    def release_all(self) -> None:
        """Drop every lease (shutdown): unpin pins, abort reservations, quarantine included."""
        for lease in self.leases.release_all():
            self._release(lease.kind, lease.items)

    # ---- metrics helper --------------------------------------------------------------------
    def count_transfer(
        self, transport: str, direction: str, num_blocks: int, num_bytes: int
    ) -> None:
        """Count payload moved by a transport (shm, tcp, grpc) in a direction (in, out)."""
        if self.metrics is not None:
            self.metrics.count_transfer(transport, direction, num_blocks, num_bytes)

