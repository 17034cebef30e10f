"""The bulk-transfer interface every data-plane transport implements (TCP now; RDMA later).

A transport moves block payloads between a caller's memory and a node's arena, batched,
under a deadline; it holds no policy (validation, placement and recency live in the node).
The same interface serves engine -> node (clients without the shared-memory arena) and
node -> node transfers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


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


class Transport(Protocol):
    """A batched, deadline-bounded bulk transfer to one node.

    Implementations are thread-safe. ``deadline`` is an absolute ``time.monotonic()`` value.
    Errors: Unavailable (cannot connect), DeadlineExceeded (the deadline passed),
    TransferFailed (the connection broke or the peer sent a malformed or over-limit frame),
    or the whole-request KvstoredError the node answered.
    """

    def get(self, keys: Sequence[bytes], namespace_id: bytes, sink: Sink, *, deadline: float) -> list[GetItem]:
        """Fetch blocks; each found payload goes straight into ``sink(...)``'s view."""
        ...

    def put(
        self, items: Sequence[tuple[bytes, memoryview, bytes]], namespace_id: bytes, *, deadline: float
    ) -> list[PutItem]:
        """Store ``(key, value, meta)`` items; per item, in order, a :class:`PutItem`."""
        ...

    def close(self) -> None:
        """Release connections; idempotent."""
        ...
