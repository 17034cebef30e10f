"""Reserve-ahead puts: keyless arena slots granted in advance under a client's session.

A shared-memory put through ReservePut costs two round trips (reserve, then commit) because
the node chooses the offsets. Here the node grants a client a small pool of *slots* ahead of
time; a put copies its blocks into slots it already holds and sends one CommitSlots, whose
answer also grants the next slots, so a put costs one round trip at any size::

    CommitSlots(want=[(size, n)])             --> slots [(id, offset, size) ...]   (first put)
    copy blocks into held slots
    CommitSlots(writes=[(slot, key, size, meta) ...], return_slot_ids, want)
                                              --> per write: stored / existed / its error,
                                                  and the next slots

On the control channel a CommitSlots may ask for its refill *after* its answer
(``grant_after_answer``): the node commits, sends the writes' answer (``grant_follows``),
then grants (:meth:`SlotGrants.grant`) and sends the slots as the next frame on that
connection, so a put's answer never waits for the next put's slots (the client holds two
puts' worth and reads that frame with its next request, kvstored/client/_control.py). The
grant is the same grant under the same request id, only later: the fencing below applies.

Fencing is exactly that of a reservation (kvstored/node/sessions.py): each slot is a lease of
kind ``"slot"`` of the client's session. A slot whose lease lapses (a stopped writer) is
quarantined, never freed by time: a late write naming it answers LeaseExpired and that ack
frees it; a returned slot (``return_slot_ids``) is freed at once (the client's copy into it
is over, or never started); the end of the session frees every slot it still holds. A slot
is committed only under the session that holds it (another session's id is unknown) and in
the namespace it was granted for.

What a slot costs the pool: it is a pending reservation of the store
(``TieredStore.reserve_slots``): counted in the DRAM's reserved bytes (never evicted, so
eviction frees room around it), charged to the tenant of its namespace like a reservation (a
tenant quota grants only what fits in it), and bounded per session by the slot budget
(:attr:`SlotGrants.budget_bytes`: ``node.max_slot_bytes_per_session`` and half of
``node.max_quarantine_bytes_per_session``, so an idle client whose whole pool lapses into
quarantine stays within the quarantine bound). On the event loop a refill is granted only
from one free extent; one that needs an eviction runs in the store executor (the servicer).

Thread-safe (the lease book and the store are).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from kvstored.errors import InvalidArgument, KvstoredError, LeaseExpired, NotFound
from kvstored.node.grants import require_session
from kvstored.node.limits import MAX_META_BYTES
from kvstored.node.local_put import EXISTED, STORED
from kvstored.node.sessions import LeaseState
from kvstored.tiers.base import NEEDS_IO
from kvstored.types import PutOutcome, Reservation

if TYPE_CHECKING:
    from kvstored.node.limits import DrainGate, RequestLimits
    from kvstored.node.metrics import NodeMetrics
    from kvstored.node.sessions import LeaseBook
    from kvstored.tiers.tiered import TieredStore

SLOT = "slot"
"""The lease kind of a reserve-ahead slot."""
MAX_WANTS = 8
"""Most slot sizes one request may ask for."""


class GrantedSlot(NamedTuple):
    """A slot handed to a client: write at ``offset``, at most ``size_bytes`` bytes (a named
    tuple: a CommitSlots grants one per block of the next put)."""

    slot_id: int
    offset: int
    size_bytes: int


class SlotGrants:
    """Slots of reserve-ahead puts over the node's lease book (see the module docstring).

    Args:
        store: the block store.
        leases: the node's lease book (sessions, quarantine), shared with the other grants.
        limits: the request limits (batch, namespace, epoch, lease, item checks).
        gate: the drain gate (a draining node refuses new puts).
        budget_bytes: most slot bytes one session holds at once (active and quarantined).
        metrics: where to count transfers; None = nowhere.

    Attributes:
        test_hook: None, or ``fn(event)`` called at ``"commit_slots_checked"`` once the writes'
            slots are taken from the lease book and before they are committed (a test holds
            a commit there while the reaper runs), and at ``"grant_after_answer"`` when a
            refill granted after its answer starts (:meth:`grant`); costs one attribute test
            when unset.
    """

    def __init__(
        self, *, store: TieredStore, leases: LeaseBook, limits: RequestLimits, gate: DrainGate,
        budget_bytes: int, metrics: NodeMetrics | None,
    ) -> None:
        self._store = store
        self._leases = leases
        self._limits = limits
        self._gate = gate
        self.budget_bytes = max(0, int(budget_bytes))
        self._metrics = metrics
        self.test_hook: Callable[[str], None] | None = None

    def commit_slots(
        self,
        namespace_id: bytes,
        writes: Sequence[tuple[int, bytes, int, bytes]],
        *,
        session_id: int,
        return_slot_ids: Sequence[int] = (),
        want: Sequence[tuple[int, int]] = (),
        lease_ms: int = 0,
        epoch: int = 0,
        request_id: int = 0,
        may_block: bool = True,
    ) -> tuple[list[PutOutcome], list[GrantedSlot]] | object:
        """Commit writes into slots, free returned slots, and grant the next ones.

        Args:
            namespace_id: the stored namespace id of the writes and of the slots granted.
            writes: ``(slot_id, key, size_bytes, meta)`` per block the client wrote into one
                of its slots (the order of a prefix: committed last first, so the head ends
                most recent).
            session_id: the client's session (required; the slots are its leases).
            return_slot_ids: slots the client will not write (the ack that frees them,
                quarantined or not); unknown ids are ignored.
            want: ``(size_bytes, num_slots)``: the pool the client wants to hold per slot size;
                the node grants what it lacks, within :attr:`budget_bytes`, the tenant's
                quota and the room it can make.
            lease_ms: the lease of the slots granted now (0 = the node's default).
            may_block: False (the event loop): answer NEEDS_IO, having changed nothing,
                when a refill needs an eviction (the caller runs the call again with True).

        Returns:
            ``(per write its outcome, the slots granted now)``, or NEEDS_IO. A write whose
            slot lapsed (quarantined) or whose session ended is ``LeaseExpired`` (nothing
            stored; the slot is freed now); an unknown slot is ``NotFound``; a write of
            another namespace, larger than its slot, or with a bad key or meta, is its own
            error (its slot is freed).

        Raises:
            InvalidArgument: no session; a bad ``want``; a namespace id too long.
            Draining, Unavailable (epoch mismatch; session not open), BatchTooLarge,
            NoCapacity (the session's quarantine is over its bound: only after the returns
            and writes, which are acks, were handled).
        """
        require_session("CommitSlots", session_id)
        limits = self._limits
        limits.check_epoch(epoch)
        limits.check_batch(len(writes))
        limits.check_namespace_id(namespace_id)
        max_block = self.check_want(want)
        if not may_block and want and self._refill_needs_io(session_id, want):
            return NEEDS_IO
        leases = self._leases
        for sid in return_slot_ids:  # acks first: they free space even for a refused session
            _, lease = leases.take(SLOT, sid, session_id)
            if lease is not None:
                self._store.abort(lease.items[0])  # type: ignore[arg-type]  # a slot lease holds its Reservation first
        out: list[PutOutcome] = [EXISTED] * len(writes)
        todo: list[tuple[int, tuple[Reservation, bytes, int, bytes]]] = []
        cfg = limits.cfg
        key_lo, key_hi = max(cfg.min_key_bytes, 1), cfg.max_key_bytes
        taken = leases.take_many(SLOT, [w[0] for w in writes], session_id)  # one lock
        for i, ((sid, key, size, meta), (state, lease)) in enumerate(zip(writes, taken, strict=True)):
            if state is LeaseState.UNKNOWN:
                out[i] = PutOutcome(False, limits.count_item_error(NotFound(
                    f"write #{i}: slot {sid} is unknown to session {session_id} (already "
                    "committed or returned, another session's, or from before a restart)")))
                continue
            if lease is None or state is LeaseState.QUARANTINED:
                if lease is not None:  # the late write is the ack: the copy is over
                    self._store.abort(lease.items[0])  # type: ignore[arg-type]  # a slot lease holds its Reservation first
                out[i] = PutOutcome(False, LeaseExpired(
                    f"write #{i}: slot {sid} outlived its lease (or its session ended) before "
                    "the commit; nothing was stored, retry the put"))
                continue
            slot, slot_ns = lease.items
            assert isinstance(slot, Reservation)
            err: KvstoredError | None = None
            if not (key_lo <= len(key) <= key_hi and size <= max_block and len(meta) <= MAX_META_BYTES):
                err = limits.put_item_error(i, key, size, meta)  # names what is wrong
            if err is None and slot_ns != namespace_id:
                err = InvalidArgument(f"write #{i}: slot {sid} was granted for another namespace")
            if err is None and size > slot.size_bytes:
                err = InvalidArgument(
                    f"write #{i} is {size} bytes; its slot {sid} holds {slot.size_bytes}")
            if err is not None:
                self._store.abort(slot)
                out[i] = PutOutcome(False, limits.count_item_error(err))
                continue
            todo.append((i, (slot, key, size, meta)))
        if self.test_hook is not None:
            self.test_hook("commit_slots_checked")
        if todo:
            flags = self._store.commit_slots([w for _, w in todo], namespace_id=namespace_id)
            num_bytes = 0
            for (i, (_, _, size, _)), stored in zip(todo, flags, strict=True):
                out[i] = STORED if stored else EXISTED
                num_bytes += size
            if self._metrics is not None:
                self._metrics.count_transfer("shm", "in", sum(flags), num_bytes)
        leases.check_session(session_id)  # a refill needs an open session within its bound
        granted = (self._grant(namespace_id, session_id, want, lease_ms, request_id, may_block,
                               ahead=bool(writes))  # (a refill; a grant alone is for a put at hand)
                   if want else [])
        return out, granted

    def grant(
        self,
        namespace_id: bytes,
        want: Sequence[tuple[int, int]],
        *,
        session_id: int,
        lease_ms: int = 0,
        request_id: int = 0,
        may_block: bool = True,
    ) -> list[GrantedSlot] | object:
        """The refill of a CommitSlots that asked for it after its answer
        (``grant_after_answer``, control channel): what :meth:`commit_slots` grants after
        its writes, run once the writes' answer was sent.

        The fencing is that of any grant: the slots are leases of kind ``slot`` of the
        session, granted under ``request_id`` (an orphan ack of that request frees them,
        and one that came first refuses them), none once the session ended.

        Args:
            namespace_id: the stored namespace id the slots are granted for.
            want: as in :meth:`commit_slots`.
            session_id: the client's session.
            lease_ms: the lease of the slots (0 = the node's default).
            request_id: the CommitSlots request whose refill this is.
            may_block: False (the event loop): NEEDS_IO when the refill needs an eviction.

        Returns:
            The slots granted (maybe fewer than wanted, or none), or NEEDS_IO.

        Raises:
            InvalidArgument: no session, a bad ``want``. Unavailable (session not open),
            NoCapacity (the session's quarantine is over its bound), Draining.
        """
        require_session("CommitSlots", session_id)
        self.check_want(want)
        if not may_block and want and self._refill_needs_io(session_id, want):
            return NEEDS_IO
        if self.test_hook is not None:  # (the pass that grants: after a NEEDS_IO answer)
            self.test_hook("grant_after_answer")
        self._leases.check_session(session_id)
        return (self._grant(namespace_id, session_id, want, lease_ms, request_id, may_block,
                            ahead=True) if want else [])

    def check_want(self, want: Sequence[tuple[int, int]]) -> int:
        """Check a refill's ``want``; returns the largest block the node stores.

        Raises:
            InvalidArgument: too many sizes, a size out of range or a negative count.
        """
        if len(want) > MAX_WANTS:
            raise InvalidArgument(f"CommitSlots asks for {len(want)} slot sizes; at most {MAX_WANTS}")
        max_block = min(self._limits.cfg.max_block_bytes, self._store.max_block_bytes)
        for size, num in want:
            if not 0 < size <= max_block or num < 0:
                raise InvalidArgument(
                    f"CommitSlots want ({size} bytes, {num} slots): a slot size must be in "
                    f"1..{max_block} bytes (node.max_block_bytes) and a count >= 0"
                )
        return max_block

    def _refill_needs_io(self, session_id: int, want: Sequence[tuple[int, int]]) -> bool:
        """Whether the refill cannot come from free space alone (a cheap, lock-free guess:
        the executor pass decides for real)."""
        lack = self._lacking(session_id, want)
        need = sum(self._store.dram_round_up(size) * n for size, n in lack)
        return need > 0 and need > self._store.dram_largest_free_bytes()

    def _lacking(self, session_id: int, want: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        held_bytes, held = self._leases.held_of(session_id, SLOT)  # one pass, one lock
        room = self.budget_bytes - held_bytes
        out: list[tuple[int, int]] = []
        for size, num in want:
            size = self._store.dram_round_up(size)
            n = max(0, min(num - held.get(size, 0), room // size if size else 0))
            if n:
                out.append((size, n))
                room -= n * size
        return out

    def _grant(
        self, namespace_id: bytes, session_id: int, want: Sequence[tuple[int, int]],
        lease_ms: int, request_id: int, may_block: bool, *, ahead: bool,
    ) -> list[GrantedSlot]:
        """Reserve what ``want`` lacks and lease it to the session. ``ahead``: a refill
        granted before a put asks for it, which on a node in a pool never evicts an original
        (TieredStore.reserve_slots ``ahead``)."""
        got: list[Reservation] = []
        with self._gate.put_in_flight():
            for size, n in self._lacking(session_id, want):
                r = self._store.reserve_slots(size, n, namespace_id=namespace_id,
                                              may_block=may_block, ahead=ahead)
                if isinstance(r, list):  # NEEDS_IO (the free extent went): fewer slots
                    got += r
        if not got:
            return []
        ids = self._leases.add_group(
            SLOT, session_id, [[r, namespace_id] for r in got], [r.size_bytes for r in got],
            self._limits.lease_s(lease_ms), request_id,
        )
        if ids is None:  # the session ended meanwhile, or the client gave up on the request
            for r in got:
                self._store.abort(r)
            return []
        return [GrantedSlot(i, r.offset, r.size_bytes) for i, r in zip(ids, got, strict=True)]


__all__ = ["MAX_WANTS", "SLOT", "GrantedSlot", "SlotGrants"]
