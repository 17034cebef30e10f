"""The ports between the transports and the node: what a transport offers, what it may ask.

A transport moves block payloads between a caller's memory and a node's arena, batched,
under a deadline; it holds no policy (validation, placement and recency live in the node).
kvstored/transport/ imports nothing from kvstored.node or kvstored.tiers: the node's
behaviour comes in through :class:`BlockServer`, and the values crossing the port are those
of kvstored/types.py. Three shapes::

    two-sided (TCP now)   Transport.get / put: the node's CPU serves each request
                          (server side: a BlockServer)
    one-sided, granted    grant -> copy -> release: the node grants arena space
    (RDMA later)          (GrantingServer), the caller's NIC copies straight into or out of
                          it (OneSidedTransport), the caller releases or commits
    one-sided, versioned  locate -> copy -> check: no grant at all; the caller copies from
                          where the node said the block was (VersionedBlockSource), then
                          asks whether that replica is still the same generation, and
                          drops the copy if not

The same interfaces serve engine -> node (clients without the shared-memory arena) and
node -> node transfers.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from kvstored.types import ExportedBlock, PinnedBlock, PutOutcome, Reservation, Tier

if TYPE_CHECKING:
    from kvstored.config import NodeConfig
    from kvstored.errors import KvstoredError
    from kvstored.transport.framing import FrameLimits


@dataclass(frozen=True, slots=True)
class GetItem:
    """One item of a GET response (payload already delivered to the sink).

    Attributes:
        code: the item's ErrorCode (0 = OK).
        message: the item's error message ("" when OK).
        found: a hit whose payload was delivered.
        tier: the tier it was served from (1 DRAM, 2 SSD, 0 unknown).
        size_bytes: the payload size.
        meta: the block's metadata.
        generation: the master's generation of the replica the node pinned and sent, when
            the node knows it; 0 = unknown (the reader then asks the master).
    """

    code: int
    message: str
    found: bool
    tier: int
    size_bytes: int
    meta: bytes
    generation: int = 0


@dataclass(frozen=True, slots=True)
class PutItem:
    """One item of a PUT response: ``stored`` False with ``code`` 0 = already present."""

    code: int
    message: str
    stored: bool


Sink = Callable[[int, int, bytes], memoryview | None]
"""``sink(index, size_bytes, meta)`` -> where to receive a found block's payload: a writable
byte view of exactly ``size_bytes``, or None to discard it. Called only after the transport
checked ``size_bytes`` against its limit."""


COMPLETED_ATTR = "completed"
"""The attribute of an error raised by :meth:`Transport.get` that lists what arrived whole."""


def completed_items(exc: BaseException, num_keys: int) -> list[GetItem | None]:
    """What a failed :meth:`Transport.get` of ``num_keys`` keys had completely received.

    Per key, in order: the :class:`GetItem` whose header and (when found) whole payload
    arrived before the failure, or None (not received, or its payload only in part: its
    sink view holds torn bytes and must be discarded). A transport that attached nothing,
    or a list of another length, reads as all None (nothing kept).
    """
    got = getattr(exc, COMPLETED_ATTR, None)
    if not isinstance(got, list) or len(got) != num_keys:
        return [None] * num_keys
    return got


def attach_completed(exc: BaseException, items: list[GetItem | None]) -> None:
    """Attach to ``exc`` the items a failed GET received whole (see :func:`completed_items`)."""
    setattr(exc, COMPLETED_ATTR, items)


class Transport(Protocol):
    """A batched, deadline-bounded bulk transfer to one node.

    Implementations are thread-safe. ``deadline`` is an absolute ``time.monotonic()`` value.
    Errors: Unavailable (cannot connect), DeadlineExceeded (the deadline passed),
    TransferFailed (the connection broke or the peer sent a malformed or over-limit frame),
    or the whole-request KvstoredError the node answered.
    """

    def get(self, keys: Sequence[bytes], namespace_id: bytes, sink: Sink, *, deadline: float) -> list[GetItem]:
        """Fetch blocks; each found payload goes straight into ``sink(...)``'s view.

        A GET that fails after some items arrived whole raises its error with those items
        attached (:func:`attach_completed`; the caller reads them with
        :func:`completed_items`), so a caller may keep them: a broken connection or a
        passed deadline loses only what had not arrived. An item whose payload arrived only
        in part is never among them. Nothing writes into a sink view once ``get`` returned
        or raised.
        """
        ...

    def put(
        self, items: Sequence[tuple[bytes, memoryview, bytes]], namespace_id: bytes, *, deadline: float,
        replicas: int = 0, handoff_age_s: float | None = None, spare_only: bool = False,
    ) -> list[PutItem]:
        """Store ``(key, value, meta)`` items; per item, in order, a :class:`PutItem`.
        ``replicas``: the blocks' replication factor for the receiver's inventory (0 = none).
        ``handoff_age_s``: a pool-LRU hand-off of blocks that old (seconds since their last
        use here): the receiver takes each only by evicting an older original of its own,
        else answers it NO_CAPACITY (kvstored/node/spill.py). ``spare_only``: a spill or
        replica PUT (PUT_FLAG_SPARE): the receiver takes an item only into room that drops
        no sole copy there (free space, copies, blocks also on its SSD, redundant
        replicas), else answers it NO_CAPACITY; a receiver older than the flag stores it
        as any put (the flag is dropped for it)."""
        ...

    def close(self) -> None:
        """Release connections; idempotent."""
        ...


# ---- the server side of the two-sided transport ----------------------------------------------


@runtime_checkable
class BlockServer(Protocol):
    """What a data-plane server may ask of the node it serves (NodeCore implements it).

    A server decodes a request, asks these calls for the blocks or the space, moves the
    bytes itself and releases what it took once its own send/recv returned (a data-plane
    connection is self-fenced: nothing here is leased). Every call is thread-safe (one
    connection thread per request).
    """

    @property
    def cfg(self) -> NodeConfig:
        """The node's settings (the server reads its ``dataplane_*`` fields)."""
        ...

    def frame_limits(self) -> FrameLimits:
        """The bounds of one request, checked before anything is allocated for it."""
        ...

    def check_batch(self, num_keys: int) -> None:
        """Raise ``BatchTooLarge`` for a request of more keys than the node accepts."""
        ...

    def check_namespace_id(self, namespace_id: bytes) -> None:
        """Raise ``InvalidArgument`` for a namespace id longer than the node accepts."""
        ...

    def pinned_chunks(
        self, keys: Sequence[bytes], namespace_id: bytes, *, chunk_keys: int
    ) -> Generator[
        tuple[int, list[PinnedBlock | ExportedBlock | None | KvstoredError]], None, None
    ]:
        """An engine's read, a chunk at a time: ``(start index, per key a pinned block, an
        SSD block served from its file without promotion (an ExportedBlock: its promotion
        would have dropped a block), None for a miss, or the key's error)``; a chunk's pins
        and buffers are released when the next chunk is asked for or the generator is
        closed. Raises ``Draining`` on the first ``next()`` when the node is shutting down."""
        ...

    def export_chunks(
        self, keys: Sequence[bytes], namespace_id: bytes, *, chunk_keys: int
    ) -> Generator[tuple[int, list[ExportedBlock | None | KvstoredError]], None, None]:
        """A peer's copy read, as :meth:`pinned_chunks` but never promoting, touching
        recency or counting a get (``GET_FLAG_PEER_EXPORT``)."""
        ...

    def put_in_flight(self) -> AbstractContextManager[None]:
        """Hold for the whole put: counted for the drain; raises ``Draining`` when entered
        while the node is shutting down."""
        ...

    def put_item_error(
        self, index: int, key: bytes, size_bytes: int, meta: bytes
    ) -> KvstoredError | None:
        """The error of put item ``index`` (key, size or meta out of bounds), or None."""
        ...

    def reserve_one(
        self, index: int, key: bytes, size_bytes: int, meta: bytes, namespace_id: bytes,
        *, seen: set[bytes] | None = None, handoff_age_s: float | None = None,
        spare_or_redundant: bool = False,
    ) -> Reservation | PutOutcome:
        """Reserve put item ``index`` (no lease): a Reservation the server receives into
        and then commits or aborts, or the item's outcome (already stored, repeated in
        ``seen``, or its own error). ``handoff_age_s``: a pool-LRU hand-off of a block that
        old (PUT_FLAG_HANDOFF; ``TieredStore.reserve``): NoCapacity when refused.
        ``spare_or_redundant``: a peer's spill or replica PUT (PUT_FLAG_SPARE): room only
        that drops no sole copy, else NoCapacity."""
        ...

    def commit_reserved(self, items: Sequence[Reservation | PutOutcome]) -> list[PutOutcome]:
        """Commit every Reservation among ``items``; per item its outcome, in order."""
        ...

    def abort_reserved(self, items: Sequence[object]) -> None:
        """Abort every Reservation among ``items`` (idempotent)."""
        ...

    def count_transfer(self, transport: str, direction: str, num_blocks: int, num_bytes: int) -> None:
        """Count payload moved (``transport`` ``"tcp"``, ``direction`` ``"in"``/``"out"``)."""
        ...

    def count_dataplane_request(self, op: str, code: str) -> None:
        """Count one finished request by op (``"get"``, ``"put"``) and ErrorCode name."""
        ...

    def exists(
        self, keys: Sequence[bytes], namespace_id: bytes = b"", *, with_tiers: bool = False
    ) -> tuple[list[bool], list[Tier | None]]:
        """Per key: held here (never pins or touches recency); with ``with_tiers`` also its
        tier, else []. Raises InvalidArgument for a bad key or namespace id."""
        ...

    def count_dataplane_connection(self, delta: int) -> None:
        """Move the open-connections gauge by ``delta`` (+1 accepted, -1 closed)."""
        ...


# ---- one-sided transfers (the shape an RDMA transport needs; none implemented yet) -------------


@dataclass(frozen=True, slots=True)
class RemoteRegion:
    """Where one block lies in a node's registered memory, as a one-sided copy addresses it.

    Attributes:
        offset: byte offset in the node's arena (the region a NIC registered).
        size_bytes: the block's size.
        generation: the replica's generation when the region was handed out (0 = unknown);
            a versioned read compares it again after its copy.
    """

    offset: int
    size_bytes: int
    generation: int = 0


@runtime_checkable
class GrantingServer(Protocol):
    """The node's side of a granted one-sided transfer: grant -> (peer's NIC copies) -> release.

    The node's CPU never touches the bytes: it only grants space under a lease and a
    session (a grant needs one), and frees it on the holder's ack or when the holder's
    session ends, never on a timer (fencing rule, kvstored/node/sessions.py). NodeCore
    implements it with these names.
    """

    def pin_blocks(
        self, keys: Sequence[bytes], namespace_id: bytes, *, session_id: int,
        lease_ms: int = 0, epoch: int = 0, request_id: int = 0,
    ) -> tuple[int, list[PinnedBlock | None | KvstoredError]]:
        """Grant reads: pin the blocks under a lease of the session; ``(pin id, per key a
        PinnedBlock whose offset the reader copies from, None, or the key's error)``.
        Raises ``InvalidArgument`` without a session."""
        ...

    def release_pins_report(self, pin_ids: Sequence[int]) -> tuple[int, list[int]]:
        """The reader's ack: release pins; ``(number in time, ids whose lease had lapsed)``
        (a copy out of a lapsed pin is reported as LeaseExpired by the reader)."""
        ...

    def reserve_put(
        self, items: Sequence[tuple[bytes, int, bytes]], namespace_id: bytes, *,
        session_id: int, lease_ms: int = 0, epoch: int = 0, request_id: int = 0,
    ) -> tuple[int, Sequence[object]]:
        """Grant writes: reserve space for ``(key, size_bytes, meta)`` items under a lease of
        the session; ``(reservation id, per item where to write, or its outcome)``. Raises
        ``InvalidArgument`` without a session."""
        ...

    def commit_put(self, reservation_id: int, *, abort: bool = False) -> list[PutOutcome]:
        """The writer's ack: commit (or abort) what it wrote; per item its outcome. Raises
        ``LeaseExpired`` when the lease lapsed first (nothing stored)."""
        ...


class VersionedBlockSource(Protocol):
    """The node's side of a one-sided read with no grant: locate -> (copy) -> check.

    Nothing is pinned, so the block may be evicted or replaced while the reader copies; the
    reader keeps its copy only when :meth:`check_generations` says every region still holds
    the replica it was told about (the generation did not change), else it drops the copy
    and counts a miss (or retries through a granted read). Sound only because a generation
    names one write (unique per epoch; kvstored/tiers/feed.py): a block evicted and written
    again, or another block written over the region, never shows the located generation at
    that offset. The check must run after the copy completed.
    """

    def locate_blocks(
        self, keys: Sequence[bytes], namespace_id: bytes
    ) -> list[RemoteRegion | None]:
        """Per key where its DRAM replica lies now, with its generation; None = not in DRAM.
        Never pins, promotes, touches recency or counts a get."""
        ...

    def check_generations(
        self, keys: Sequence[bytes], namespace_id: bytes, regions: Sequence[RemoteRegion]
    ) -> list[bool]:
        """Per key: True when the replica at ``regions[i]`` is still the one located (same
        offset and generation), so the bytes copied from it are that replica's."""
        ...


class OneSidedTransport(Protocol):
    """A transport whose NIC copies into or out of a node's registered memory itself.

    The caller first obtains regions (a grant of :class:`GrantingServer`, or the locations
    of :class:`VersionedBlockSource`) over the node's control path, then moves the bytes
    here, then acks (releases, commits, or checks generations). Thread-safe; ``deadline``
    is an absolute ``time.monotonic()`` value. Errors: Unavailable (cannot connect),
    DeadlineExceeded, TransferFailed (the copy failed: release or abort what was granted).
    """

    def read_regions(self, regions: Sequence[RemoteRegion], sink: Sink, *, deadline: float) -> None:
        """Copy each region into ``sink(index, size_bytes, b"")``'s view (None = skip it)."""
        ...

    def write_regions(
        self, regions: Sequence[RemoteRegion], values: Sequence[memoryview], *, deadline: float
    ) -> None:
        """Copy ``values[i]`` (exactly ``regions[i].size_bytes``) into each region."""
        ...

    def close(self) -> None:
        """Release connections and memory registrations; idempotent."""
        ...
