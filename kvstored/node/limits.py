"""The node's request limits and its drain gate, apart from what a request does.

:class:`RequestLimits` answers "is this request (or this item of it) within bounds?" from
the node's config: batch size, key and block sizes, metadata and namespace id lengths, the
epoch, the lease a client may ask for, and the data plane's frame bounds. Validation
happens per item where the wire has a per-item status (put, reserve, pin, get): a bad item
gets its own error (counted once in metrics) and the good ones proceed. Calls without
per-item status (exists, lookup_prefix, remove) raise for the whole call, naming the bad
index.

:class:`DrainGate` is the shutdown gate every new put and pinning read passes: once the
node drains, new work is refused with :class:`~kvstored.errors.Draining` and the puts in
flight are counted so the drain can wait for them.

Thread-safe: the gate's ``_lock`` guards the in-flight counter only and is never held while
calling the store.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from kvstored.errors import (
    BatchTooLarge,
    BlockTooLarge,
    Draining,
    InvalidArgument,
    KeyInvalid,
    KvstoredError,
    Unavailable,
)
from kvstored.keys import format_hash
from kvstored.tenancy import (
    MAX_NAMESPACE_ID_BYTES,
    MAX_STORED_NAMESPACE_BYTES,
    check_namespace_length,
)
from kvstored.transport.framing import FrameLimits

if TYPE_CHECKING:
    from kvstored.config import NodeConfig
    from kvstored.node.metrics import NodeMetrics

# MAX_NAMESPACE_ID_BYTES (64, from kvstored/tenancy.py): the longest namespace id a client may
# send (Namespace.id is 16); the store sees it scoped by its tenant, up to
# MAX_STORED_NAMESPACE_BYTES (130)
MAX_LEASE_S = 600.0
"""Longest lease a client may ask for, seconds."""
MAX_META_BYTES = 4096
"""Largest per-block metadata accepted, bytes."""
DEFAULT_LIST_LIMIT = 10000
"""Blocks an admin listing returns when the caller asks for 0."""
MAX_LIST_LIMIT = 1_000_000
"""Most blocks one admin listing returns."""


def keys_valid(keys: Sequence[bytes], min_key_bytes: int, max_key_bytes: int) -> bool:
    """True when every key is ``bytes`` of ``min_key_bytes..max_key_bytes`` (C-level checks
    only; False for an empty batch)."""
    if not keys or not set(map(type, keys)) <= {bytes}:
        return False
    lens = set(map(len, keys))
    return min(lens) >= max(min_key_bytes, 1) and max(lens) <= max_key_bytes


class RequestLimits:
    """The bounds of one request under a node's config, and the count of item errors.

    Args:
        cfg: the node's settings (``max_batch_keys``, ``min_key_bytes``, ``max_key_bytes``,
            ``max_block_bytes``, ``pin_lease_s``, ``dataplane_*``).
        epoch: this daemon start's epoch (a client's request names the epoch it mapped).
        metrics: where item errors are counted; None = nowhere.
    """

    def __init__(self, cfg: NodeConfig, *, epoch: int, metrics: NodeMetrics | None) -> None:
        self.cfg = cfg
        self.epoch = epoch
        self.metrics = metrics

    def check_batch(self, num_keys: int) -> None:
        """Raise :class:`BatchTooLarge` if a call carries more than ``max_batch_keys`` keys."""
        if num_keys > self.cfg.max_batch_keys:
            raise BatchTooLarge(
                f"{num_keys} keys in one call; at most {self.cfg.max_batch_keys} are accepted "
                "(node.max_batch_keys); split the batch"
            )

    def check_namespace_id(self, namespace_id: bytes) -> None:
        """Raise :class:`InvalidArgument` for a (stored) namespace id whose client id is
        longer than 64 bytes (kvstored.tenancy.check_namespace_length)."""
        if len(namespace_id) > MAX_NAMESPACE_ID_BYTES:
            check_namespace_length(namespace_id)

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
        """Raise for the whole call on the first bad key (calls without per-item status).

        Raises:
            BatchTooLarge: more than ``max_batch_keys`` keys.
            KeyInvalid: the first key out of ``min_key_bytes..max_key_bytes``.
        """
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
                f"block #{index} (key {format_hash(key)}) is {size_bytes} bytes; the limit is "
                f"{self.cfg.max_block_bytes} bytes (node.max_block_bytes)"
            )
        if len(meta) > MAX_META_BYTES:
            return InvalidArgument(
                f"meta of block #{index} (key {format_hash(key)}) is {len(meta)} bytes; at most "
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
            max_namespace_bytes=MAX_STORED_NAMESPACE_BYTES,  # stored ids travel
            max_item_bytes=cfg.max_block_bytes,
            max_request_payload_bytes=max(cfg.dataplane_max_request_bytes, cfg.max_block_bytes),
            max_body_bytes=cfg.dataplane_max_header_bytes,
        )

    def lease_s(self, lease_ms: int) -> float:
        """The lease to grant for a client's ``lease_ms`` request (0 = node default), seconds."""
        if lease_ms <= 0:
            return self.cfg.pin_lease_s
        return min(lease_ms / 1000.0, MAX_LEASE_S)

    def count_item_error(self, err: KvstoredError) -> KvstoredError:
        """Count one item's error in metrics; returns ``err`` (for use in expressions)."""
        if self.metrics is not None:
            self.metrics.count_item_error(err.code.name)
        return err


class DrainGate:
    """Refuses new puts and pinning reads once the node drains; counts puts in flight.

    Args:
        node_id: named in the Draining errors.
    """

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.draining = False
        """True once shutdown began (read on every request: a plain attribute)."""
        self._lock = threading.Lock()
        self._inflight_puts = 0

    def start_draining(self) -> None:
        """Refuse new work from now on (see :meth:`check_reads_allowed`, :meth:`put_in_flight`)."""
        self.draining = True

    def check_reads_allowed(self) -> None:
        """Raise :class:`Draining` for a new pinning read once the node drains."""
        if self.draining:
            raise Draining(
                f"node {self.node_id} is draining for shutdown and refuses new reads; "
                "retry on another node or after it restarted"
            )

    def num_puts_in_flight(self) -> int:
        """Data-plane and inline puts running now."""
        with self._lock:
            return self._inflight_puts

    @contextmanager
    def put_in_flight(self) -> Iterator[None]:
        """Count a put for the drain; refuse it with :class:`Draining` once draining."""
        if self.draining:
            raise Draining(
                f"node {self.node_id} is draining for shutdown and refuses new puts; "
                "retry on another node or after it restarted"
            )
        with self._lock:
            self._inflight_puts += 1
        try:
            yield
        finally:
            with self._lock:
                self._inflight_puts -= 1
