"""Client sessions, leases and quarantine: the node's fencing rule.

The rule (docs/architecture.md#fencing-and-sessions): space that a writer or reader may
still touch is never handed to anyone else. Time alone never makes a copy safe; only one of
these does:

1. the holder said it is done: CommitPut / CommitPut(abort) / ReleasePins (an *ack*);
2. the holder's **session** is gone: the writer can no longer touch the space.

Who the "writer" is, per path:

- A local client writing into / reading out of the mapped arena (shared-memory path) opens a
  session with the ``OpenSession`` server stream at connect and takes its pins and
  reservations under that session id. The session ends when the client says so
  (``CloseSession``, sent by ``close()`` once none of its operations runs), or when the
  stream ends *and* the client's process is gone: the node holds a pidfd of the pid the
  client named, so a stream dropped while the process still lives (e.g. a stopped process
  that missed keepalives) keeps the session until the process exits. A killed process's
  socket closes only after all its threads are gone, so no copy of it can still run. Then
  the node releases everything the session held, quarantined space included. (A client in
  another pid namespace names a pid the node cannot see or that is another process: the
  first falls back to the stream's end, the second only delays the release.)
- The node's own TCP data-plane threads (kvstored/transport/tcp_server.py) receive into and send
  out of reservations and pins they took themselves, without a lease, and abort/unpin them
  only after their own recv/send returned: a data-plane connection is its own session and
  is self-fenced (tested in tests/integration/test_fencing.py).
- A future writer that the node does not run itself (an RDMA NIC writing a reservation for
  a peer, a node-to-node push) must take the reservation under the session of the peer that
  drives it, and the node frees it only on that peer's ack or when that peer's session (its
  connection, or its membership epoch at the master) is gone. Never on a timer.

A lease (``lease_ms`` of ReservePut/PinBlocks) is only a *deadline for the holder*: when it
lapses, the space moves to **quarantine**, not to the free pool. A quarantined reservation is
never committed (CommitPut answers LeaseExpired, and that call is the ack that frees it); a
quarantined pin keeps its block pinned, so its bytes cannot change under a late reader
(ReleasePins reports it in ``expired_pin_ids`` and the client reports LeaseExpired).
Quarantined bytes are counted per session and bounded by
``node.max_quarantine_bytes_per_session``: a session over the bound gets NoCapacity for new
pins and reservations, so a stuck client costs capacity, never correctness. A grant needs a
session: kvstored/node/grants.py refuses session id 0 for every caller. The book still keeps
a pseudo-session ``NO_SESSION`` that never ends (a lease recorded under it would stay
quarantined until its ack), so that id 0 never names a real session.

::

    take (ReservePut/PinBlocks) --> ACTIVE --ack--> released
                                      |  lease lapses (reap_expired)
                                      v
                                  QUARANTINED --ack (LeaseExpired) / session ends--> released
    session ends: ACTIVE and QUARANTINED leases of the session are released at once
    orphan ack (the client never got the grant's answer): ACTIVE or QUARANTINED -> released

Orphaned grants: a ReservePut/PinBlocks whose answer never reached the client (its deadline
passed, the connection dropped, the client was stopped) granted space the client does not
know about, so it can neither ack nor copy into it. Each granting request carries a
client-chosen ``request_id`` (unique per session); the lease records it, and the client's
acknowledgement "I never received request R" (``ReleasePins.orphan_request_ids``,
:meth:`LeaseBook.release_orphans`) frees that grant, active or quarantined. A request acked
before it arrived leaves a tombstone, so its grant is refused when it does arrive. Every
grant is under a real session (kvstored/node/grants.py refuses id 0), so request ids are
tracked per session; a lease the book records under ``NO_SESSION`` is not tracked by request
id (that pseudo-session is no one client's, so its request ids could collide).

Locking: ``LeaseBook._lock`` guards every table here and is never held while calling the
store: methods return the leases whose items the caller must unpin/abort.

Thread-safe.
"""

from __future__ import annotations

import collections
import os
import secrets
import threading
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from kvstored.errors import NoCapacity, Unavailable

NO_SESSION = 0
"""The id that names no session (grants refuse it; the book's pseudo-session never ends)."""
_EXPIRED_MEMORY = 4096  # ids of leases released by a session end, to answer LeaseExpired
_ORPHAN_TOMBSTONES = 4096  # per session: orphan-acked request ids whose request had not arrived
_IDS_PER_DRAW = 512  # lease ids drawn from the OS's random source at once (one read per draw)


class _RandomIds:
    """Random 63-bit ids, never 0, drawn from ``os.urandom`` in batches (caller holds a lock).

    As unpredictable as one ``secrets.randbits(63)`` per id (the same source), without a
    system call per lease: a lease id is also what lets a holder release a pin, so ids stay
    unguessable rather than sequential.
    """

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: list[int] = []

    def next(self) -> int:
        ids = self._ids
        while not ids:
            ids.extend(x >> 1 for x in array("Q", os.urandom(8 * _IDS_PER_DRAW)) if x >> 1)
        return ids.pop()


class LeaseState(Enum):
    """What :meth:`LeaseBook.take` found under an id."""

    HELD = "held"  # active: the holder is in time
    QUARANTINED = "quarantined"  # lapsed; the take is the holder's ack
    EXPIRED = "expired"  # released earlier because its session ended
    UNKNOWN = "unknown"  # never existed here, or already acked


@dataclass(slots=True)
class Lease:
    """Pins or reservations granted by one call, and the session that holds them.

    Attributes:
        kind: ``"pin"`` or ``"reservation"``.
        lease_id: the id handed to the client.
        session_id: the holder's session (``NO_SESSION`` = none).
        expires_at: monotonic seconds at which the lease lapses into quarantine.
        items: what the caller releases (PinnedBlock / Reservation / per-item outcomes).
        num_bytes: arena bytes held (counted while quarantined).
        request_id: the granting request's client-chosen id (0 = none).
    """

    kind: str
    lease_id: int
    session_id: int
    expires_at: float
    items: list[object]
    num_bytes: int
    request_id: int = 0


@dataclass(slots=True)
class _Session:
    session_id: int
    peer: str
    active: set[int] = field(default_factory=set)
    quarantine: dict[int, Lease] = field(default_factory=dict)
    quarantined_bytes: int = 0
    # request id -> lease id, or the lease ids of a grant of several (reserve-ahead slots)
    by_request: dict[int, int | tuple[int, ...]] = field(default_factory=dict)
    orphaned: collections.OrderedDict[int, None] = field(default_factory=collections.OrderedDict)


class LeaseBook:
    """Sessions, active leases and quarantine of one node.

    Args:
        max_quarantine_bytes_per_session: a session holding more than this many quarantined
            bytes gets :class:`NoCapacity` for new pins and reservations.
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, max_quarantine_bytes_per_session: int, clock: Callable[[], float]) -> None:
        self.max_quarantine_bytes = max_quarantine_bytes_per_session
        self.clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[int, _Session] = {NO_SESSION: _Session(NO_SESSION, "no session")}
        self._leases: dict[int, Lease] = {}  # active, by lease id (pins and reservations)
        self._num_active: dict[str, int] = {"pin": 0, "reservation": 0}  # len(_leases) by kind
        self._quarantined: dict[int, Lease] = {}  # by lease id
        self._expired: collections.OrderedDict[int, str] = collections.OrderedDict()
        self._ids = _RandomIds()

    # ---- sessions --------------------------------------------------------------------------
    def open_session(self, peer: str = "") -> int:
        """A new session id (random 63-bit, never 0)."""
        with self._lock:
            while True:
                sid = secrets.randbits(63)
                if sid and sid not in self._sessions:
                    break
            self._sessions[sid] = _Session(sid, peer)
        return sid

    def close_session(self, session_id: int) -> list[Lease]:
        """End a session: returns every lease it held (active and quarantined) to release.

        Idempotent; the pseudo-session ``NO_SESSION`` never ends.
        """
        if session_id == NO_SESSION:
            return []
        with self._lock:
            sess = self._sessions.pop(session_id, None)
            if sess is None:
                return []
            out = [self._leases.pop(i) for i in sess.active]
            for lease in out:
                self._num_active[lease.kind] -= 1
            for lease_id, lease in sess.quarantine.items():
                self._quarantined.pop(lease_id, None)
                out.append(lease)
            for lease in out:
                self._remember_expired(lease)
        return out

    def is_open(self, session_id: int) -> bool:
        """True while the session exists (not closed)."""
        with self._lock:
            return session_id in self._sessions

    def check_session(self, session_id: int) -> None:
        """Raise if the session cannot take new pins/reservations.

        Raises:
            Unavailable: unknown or closed session (retriable: open a new one).
            NoCapacity: the session's quarantine is over its bound.
        """
        with self._lock:
            sess = self._sessions.get(session_id)
            if sess is None:
                raise Unavailable(
                    f"session {session_id} is not open on this node (its stream ended, or the "
                    "node restarted); open a new session"
                )
            if sess.quarantined_bytes > self.max_quarantine_bytes:
                raise NoCapacity(
                    f"session {session_id} holds {sess.quarantined_bytes} quarantined bytes "
                    f"(pins/reservations whose lease lapsed and were not acknowledged), more "
                    f"than node.max_quarantine_bytes_per_session={self.max_quarantine_bytes}; "
                    "finish or abort the stalled copies, or close the client"
                )

    # ---- leases ----------------------------------------------------------------------------
    def add(
        self,
        kind: str,
        session_id: int,
        items: list[object],
        num_bytes: int,
        lease_s: float,
        request_id: int = 0,
    ) -> int | None:
        """Record a lease; its id, or None if nobody will ack it (release the items).

        None when the session ended meanwhile, or when the client already acknowledged that it
        never received request ``request_id`` (:meth:`release_orphans` came first).
        """
        with self._lock:
            sess = self._sessions.get(session_id)
            if sess is None:
                return None
            if session_id == NO_SESSION:  # no one client's session: request ids could collide
                request_id = 0
            if request_id and request_id in sess.orphaned:
                del sess.orphaned[request_id]
                return None
            while True:
                lease_id = self._ids.next()
                if lease_id not in self._leases and lease_id not in self._quarantined:
                    break
            self._leases[lease_id] = Lease(
                kind, lease_id, session_id, self.clock() + lease_s, items, num_bytes, request_id
            )
            self._num_active[kind] = self._num_active.get(kind, 0) + 1
            sess.active.add(lease_id)
            if request_id:
                sess.by_request[request_id] = lease_id
        return lease_id

    def add_group(
        self, kind: str, session_id: int, items: list[list[object]], num_bytes: list[int],
        lease_s: float, request_id: int = 0,
    ) -> list[int] | None:
        """Record one lease per entry of ``items`` (a grant of several slots by one request):
        their ids, or None if nobody will ack them (as :meth:`add`). An orphan ack of
        ``request_id`` releases every lease of the group still held."""
        with self._lock:
            sess = self._sessions.get(session_id)
            if sess is None:
                return None
            if session_id == NO_SESSION:
                request_id = 0
            if request_id and request_id in sess.orphaned:
                del sess.orphaned[request_id]
                return None
            expires = self.clock() + lease_s
            ids: list[int] = []
            leases, quarantined, draw = self._leases, self._quarantined, self._ids.next
            for its, nb in zip(items, num_bytes, strict=True):
                lease_id = draw()
                while lease_id in leases or lease_id in quarantined:
                    lease_id = draw()
                leases[lease_id] = Lease(kind, lease_id, session_id, expires, its, nb, request_id)
                ids.append(lease_id)
            sess.active.update(ids)
            self._num_active[kind] = self._num_active.get(kind, 0) + len(ids)
            if request_id and ids:
                sess.by_request[request_id] = tuple(ids)
        return ids

    def held_bytes(self, session_id: int, kind: str) -> int:
        """Bytes of ``kind`` leases the session holds, active and quarantined (O(its leases))."""
        with self._lock:
            sess = self._sessions.get(session_id)
            if sess is None:
                return 0
            n = sum(self._leases[i].num_bytes for i in sess.active
                    if self._leases[i].kind == kind)
            return n + sum(x.num_bytes for x in sess.quarantine.values() if x.kind == kind)

    def held_sizes(self, session_id: int, kind: str) -> dict[int, int]:
        """Active leases of ``kind`` the session holds, counted by their ``num_bytes``."""
        out: dict[int, int] = {}
        with self._lock:
            sess = self._sessions.get(session_id)
            if sess is None:
                return out
            for i in sess.active:
                lease = self._leases[i]
                if lease.kind == kind:
                    out[lease.num_bytes] = out.get(lease.num_bytes, 0) + 1
        return out

    def held_of(self, session_id: int, kind: str) -> tuple[int, dict[int, int]]:
        """``(held_bytes, held_sizes)`` of the session's ``kind`` leases in one pass under
        one lock (what :meth:`held_bytes` and :meth:`held_sizes` answer)."""
        sizes: dict[int, int] = {}
        with self._lock:
            sess = self._sessions.get(session_id)
            if sess is None:
                return 0, sizes
            total = 0
            leases = self._leases
            for i in sess.active:
                lease = leases[i]
                if lease.kind == kind:
                    n = lease.num_bytes
                    total += n
                    sizes[n] = sizes.get(n, 0) + 1
            total += sum(x.num_bytes for x in sess.quarantine.values() if x.kind == kind)
        return total, sizes

    def release_orphans(self, session_id: int, request_ids: list[int]) -> list[Lease]:
        """The client never received the answers to these requests: free what they granted.

        Idempotent. Only for real sessions: the pseudo-session ``NO_SESSION`` (grants refuse
        it) is no one client's, so its leases are not tracked by request id (they are freed
        by their lease id's ack only). A request id with no lease (never arrived yet,
        already released, or 0) releases nothing; one that has not arrived yet is remembered
        (bounded per session) so that its grant is refused when it does (:meth:`add` returns
        None).

        Args:
            session_id: the session the requests were sent under.
            request_ids: ``request_id`` values of ReservePut/PinBlocks requests.

        Returns:
            The leases to release (active or quarantined).
        """
        out: list[Lease] = []
        if session_id == NO_SESSION:  # the pseudo-session's leases have no request ids
            return out
        with self._lock:
            sess = self._sessions.get(session_id)
            if sess is None:  # ended: everything it held was released already
                return out
            for request_id in request_ids:
                if not request_id:
                    continue
                found = sess.by_request.pop(request_id, None)
                if found is None:
                    sess.orphaned[request_id] = None
                    while len(sess.orphaned) > _ORPHAN_TOMBSTONES:
                        sess.orphaned.popitem(last=False)
                    continue
                for lease_id in (found,) if isinstance(found, int) else found:
                    lease = self._leases.pop(lease_id, None)
                    if lease is not None:
                        sess.active.discard(lease_id)
                        self._num_active[lease.kind] -= 1
                    else:
                        lease = self._quarantined.pop(lease_id, None)
                        if lease is None:  # one slot of a group, acked already
                            continue
                        del sess.quarantine[lease_id]
                        sess.quarantined_bytes -= lease.num_bytes
                    out.append(lease)
        return out

    def take(self, kind: str, lease_id: int, session_id: int | None = None
             ) -> tuple[LeaseState, Lease | None]:
        """Remove a lease for its holder's ack: ``(state, lease to release or None)``.

        ``session_id``: only a lease of that session is taken (another's is UNKNOWN)."""
        with self._lock:
            return self._take_locked(kind, lease_id, session_id)

    def take_many(self, kind: str, lease_ids: Sequence[int], session_id: int | None = None
                  ) -> list[tuple[LeaseState, Lease | None]]:
        """:meth:`take` of each lease id, in order, under one lock (a batch of acks)."""
        out: list[tuple[LeaseState, Lease | None]] = []
        with self._lock:
            leases, sessions, active = self._leases, self._sessions, self._num_active
            for lease_id in lease_ids:
                lease = leases.get(lease_id)
                if (lease is None or lease.kind != kind
                        or (session_id is not None and lease.session_id != session_id)):
                    out.append(self._take_locked(kind, lease_id, session_id))  # the general path
                    continue
                del leases[lease_id]  # an active lease of the holder: _take_locked's HELD case
                active[kind] -= 1
                sess = sessions[lease.session_id]
                sess.active.discard(lease_id)
                sess.by_request.pop(lease.request_id, None)
                out.append((LeaseState.HELD, lease))
        return out

    def _take_locked(self, kind: str, lease_id: int, session_id: int | None
                     ) -> tuple[LeaseState, Lease | None]:
        """The body of :meth:`take` (lock held)."""
        lease = self._leases.get(lease_id) or self._quarantined.get(lease_id)
        if session_id is not None and lease is not None and lease.session_id != session_id:
            return LeaseState.UNKNOWN, None
        lease = self._leases.get(lease_id)
        if lease is not None and lease.kind == kind:
            del self._leases[lease_id]
            self._num_active[kind] -= 1
            sess = self._sessions[lease.session_id]
            sess.active.discard(lease_id)
            sess.by_request.pop(lease.request_id, None)
            return LeaseState.HELD, lease
        lease = self._quarantined.get(lease_id)
        if lease is not None and lease.kind == kind:
            del self._quarantined[lease_id]
            sess = self._sessions[lease.session_id]
            del sess.quarantine[lease_id]
            sess.quarantined_bytes -= lease.num_bytes
            sess.by_request.pop(lease.request_id, None)
            self._remember_expired(lease)
            return LeaseState.QUARANTINED, lease
        if self._expired.get(lease_id) == kind:
            return LeaseState.EXPIRED, None
        return LeaseState.UNKNOWN, None

    def quarantine_lapsed(self) -> list[Lease]:
        """Move every active lease whose time ran out into quarantine; returns them."""
        now = self.clock()
        moved: list[Lease] = []
        with self._lock:
            for lease_id in [i for i, x in self._leases.items() if x.expires_at <= now]:
                lease = self._leases.pop(lease_id)
                self._num_active[lease.kind] -= 1
                sess = self._sessions[lease.session_id]
                sess.active.discard(lease_id)
                sess.quarantine[lease_id] = lease
                sess.quarantined_bytes += lease.num_bytes
                self._quarantined[lease_id] = lease
                moved.append(lease)
        return moved

    def release_all(self) -> list[Lease]:
        """Forget everything (shutdown): every active and quarantined lease, to release."""
        with self._lock:
            out = list(self._leases.values()) + list(self._quarantined.values())
            self._leases.clear()
            self._num_active = dict.fromkeys(self._num_active, 0)
            self._quarantined.clear()
            for sess in self._sessions.values():
                sess.active.clear()
                sess.quarantine.clear()
                sess.quarantined_bytes = 0
                sess.by_request.clear()
        return out

    def _remember_expired(self, lease: Lease) -> None:
        self._expired[lease.lease_id] = lease.kind
        while len(self._expired) > _EXPIRED_MEMORY:
            self._expired.popitem(last=False)

    # ---- counts ----------------------------------------------------------------------------
    def num_active(self, kind: str) -> int:
        """Active (not quarantined) leases of a kind; O(1) (a count kept by every change, read
        by the drain and at each metrics scrape)."""
        return self._num_active.get(kind, 0)  # one dict read: atomic, no lock needed

    def quarantined_bytes(self, session_id: int | None = None) -> int:
        """Quarantined bytes of one session, or of all (None)."""
        with self._lock:
            if session_id is not None:
                sess = self._sessions.get(session_id)
                return sess.quarantined_bytes if sess is not None else 0
            return sum(s.quarantined_bytes for s in self._sessions.values())

    def num_sessions(self) -> int:
        """Open client sessions (the pseudo-session ``NO_SESSION`` not counted)."""
        with self._lock:
            return len(self._sessions) - 1
