"""The node's read paths: pinning a read's keys, chunked reads, a peer's export read, the
inline gRPC Get, and the probes and admin reads that never pin.

Nothing here takes a lease: the pins returned are the caller's to release (the data plane
and the inline Get release their own; kvstored/node/grants.py puts a read's pins under a
lease for the shared-memory path).

A batch whose keys are all well-formed (the common case: an engine's block hashes) goes to
the store in one call with no per-key Python here (a 16-key PinBlocks costs ~40 us of node
CPU in all); a batch with bad keys gives each bad key its own error and pins the good ones.
Counting is the same either way: item errors are counted once, and a key cut at NoCapacity
(the reader asks for it again) is neither pinned nor counted.

A peer's data-plane GET (``GET_FLAG_PEER_EXPORT``, :meth:`Reads.export_chunks`): a node
that copies a peer's blocks into its own store (:mod:`kvstored.node.remote`) keeps its own
copy in DRAM, so the source only sends the bytes: an engine-style pin (``pin_many``) would
promote an SSD-only block into the source's DRAM (tier churn for a block it does not serve),
make it the most recent and count an engine get/hit. Every chunk goes through
``TieredStore.read_for_export`` instead::

    DRAM block     pinned in place for the send (the pin held until the kernel has the
                   bytes, as an engine GET's); its LRU position untouched
    SSD-only block read from its file into a private buffer, checksum-verified (a bad file
                   is dropped and answered as a miss, never wrong bytes); stays SSD-only
    either         sent with its replica's generation; counted as a transfer out only

Thread-safe (the store is); called from the event loop, the store executor and the
data-plane connection threads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from kvstored.errors import BatchTooLarge, KvstoredError, NoCapacity
from kvstored.keys import format_hash
from kvstored.node.limits import DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT, keys_valid
from kvstored.types import BlockInfo, ExportedBlock, PinnedBlock, Tier

if TYPE_CHECKING:
    from kvstored.node.limits import DrainGate, RequestLimits
    from kvstored.node.metrics import NodeMetrics
    from kvstored.tiers.tiered import TieredStore

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class GetOutcome:
    """One block copied out inline: found or a miss, or an error for this item."""

    found: bool
    value: bytes = b""
    meta: bytes = b""
    tier: Tier | None = None
    error: KvstoredError | None = None


def own_pins_full(index: int) -> NoCapacity:
    """The error of the keys from ``index`` on, cut because this read's pins fill DRAM."""
    return NoCapacity(
        f"DRAM is full of this read's own pins at key #{index}; read again from there "
        "once they are released"
    )


class Reads:
    """Pins, chunked reads, export reads, the inline Get and the probes of one node.

    Args:
        store: the block store (thread-safe).
        limits: the request limits (key checks, item error counts).
        gate: the drain gate (a draining node refuses new pinning reads).
        metrics: where to count transfers and lookups; None = nowhere.
    """

    def __init__(
        self, store: TieredStore, limits: RequestLimits, gate: DrainGate,
        metrics: NodeMetrics | None,
    ) -> None:
        self._store = store
        self._limits = limits
        self._gate = gate
        self._metrics = metrics
        self.num_served_from_ssd = 0
        """SSD hits served straight from their files: their promotion would have dropped a
        block the pool holds nowhere else (:meth:`pinned_chunks`)."""

    def pin_items(
        self, keys: Sequence[bytes], namespace_id: bytes, *, may_block: bool = True,
        cut: bool = False,
    ) -> list[PinnedBlock | None | KvstoredError]:
        """Validate keys and pin the good ones (no lease); bad keys get their own error.

        The caller must ``store.unpin`` every returned PinnedBlock. With ``cut`` (a chunked
        read that reads again from the first NoCapacity after its first key), the store
        stops at that key: it and every key after it get NoCapacity and are neither pinned
        nor counted (gets, misses, item errors), so a key is counted once per request
        whatever the chunking.
        """
        limits, store = self._limits, self._store
        cfg = limits.cfg
        if keys_valid(keys, cfg.min_key_bytes, cfg.max_key_bytes):  # one store call, no lists
            got = store.pin_many(
                keys, namespace_id=namespace_id, may_block=may_block, cut_from=1 if cut else None
            )
            for x in got:
                if isinstance(x, KvstoredError):
                    limits.count_item_error(x)
            if len(got) < len(keys):
                got.extend([own_pins_full(len(got))] * (len(keys) - len(got)))
            return got
        errors = [limits.key_error(i, k) for i, k in enumerate(keys)]
        good = [k for k, e in zip(keys, errors, strict=True) if e is None]
        cut_from = None if not cut else (1 if errors and errors[0] is None else 0)
        got_good = (
            store.pin_many(good, namespace_id=namespace_id, may_block=may_block, cut_from=cut_from)
            if good else []
        )
        end = len(keys)
        if len(got_good) < len(good):  # cut at the first good key the store did not return
            end = [i for i, e in enumerate(errors) if e is None][len(got_good)]
        pinned = iter(got_good)
        out: list[PinnedBlock | None | KvstoredError] = []
        for err in errors[:end]:
            item = next(pinned) if err is None else limits.count_item_error(err)
            if isinstance(item, KvstoredError) and err is None:
                limits.count_item_error(item)
            out.append(item)
        if end < len(keys):
            out.extend([own_pins_full(end)] * (len(keys) - end))
        return out

    def pinned_chunks(
        self, keys: Sequence[bytes], namespace_id: bytes, *, chunk_keys: int = 64
    ) -> Generator[
        tuple[int, list[PinnedBlock | ExportedBlock | None | KvstoredError]], None, None
    ]:
        """Pin ``keys`` a chunk at a time: yields ``(start index, per-key results)``.

        A chunk's pins are released when the consumer asks for the next chunk or closes the
        generator (use ``contextlib.closing``). When an SSD hit cannot be promoted because the
        chunk's own pins fill DRAM (NoCapacity after the chunk's first key), the chunk is cut
        there and the next one restarts at that key, so a read larger than DRAM still
        completes. An SSD hit that cannot be promoted even as a chunk's first key (DRAM
        holds only blocks the pool has nowhere else, or pinned ones: the store skips the
        promotion rather than drop one, tiers/transit.py) is served from SSD: read from its
        file into a private buffer (``TieredStore.read_for_export``: checksum-verified, not
        promoted, not touched) and yielded as an :class:`ExportedBlock`, released with the
        chunk. Only a block the store cannot read either way reports NoCapacity.

        Raises:
            Draining: on the first ``next()``, when the node is draining (a read already
                past its first chunk finishes).
        """
        self._gate.check_reads_allowed()
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
                out: list[PinnedBlock | ExportedBlock | None | KvstoredError] = list(got[:cut])
                served = self._maybe_serve_from_ssd(keys[i], namespace_id, out)
                try:
                    yield i, out
                finally:
                    self.unpin_all(got)
                    if served is not None:
                        self._store.release_export([served])
                i += cut
        finally:
            if num_chunks > 1 and hits:
                # Each pin_many touched its own chunk tail-first, so a later chunk ended up
                # more recent than an earlier one; touch once more in whole-request order so
                # keys[0] is the most recent and eviction takes the request's tail first.
                self.touch_hits(hits, namespace_id)

    def _maybe_serve_from_ssd(
        self, key: bytes, namespace_id: bytes,
        out: list[PinnedBlock | ExportedBlock | None | KvstoredError],
    ) -> ExportedBlock | None:
        """Serve a chunk's first key from SSD when the store skipped its promotion
        (NoCapacity there): replace ``out[0]`` with the block read for export, and return it
        (the caller releases it), or None when there is nothing to serve that way."""
        if not out or not isinstance(out[0], NoCapacity):
            return None
        try:
            got = self._store.read_for_export([key], namespace_id=namespace_id)[0]
        except KvstoredError:  # the store closed meanwhile: the NoCapacity stands
            return None
        if got is None:
            return None
        out[0] = got
        self.num_served_from_ssd += 1
        return got

    def export_chunks(
        self, keys: Sequence[bytes], namespace_id: bytes, *, chunk_keys: int = 64
    ) -> Generator[tuple[int, list[ExportedBlock | None | KvstoredError]], None, None]:
        """Read ``keys`` for a peer a chunk at a time: yields ``(start index, per-key results)``.

        The counterpart of :meth:`pinned_chunks` for a peer's export read (module
        docstring): a chunk's DRAM pins are released when the consumer asks for the next
        chunk or closes the generator (use ``contextlib.closing``), so they are held for the
        whole send of that chunk. Nothing is promoted, so a chunk never runs out of DRAM and
        is never cut. At most ``chunk_keys`` SSD-only blocks are buffered at once.

        Args:
            keys: block keys (each checked: a bad key gets its own :class:`KeyInvalid`).
            namespace_id: their namespace.
            chunk_keys: keys per chunk (>= 1).

        Yields:
            ``(start, got)``: per key of ``keys[start:start + len(got)]`` the block (DRAM:
            ``pinned`` set; SSD: a private verified copy), None (a miss) or its key error.

        Raises:
            Draining: on the first ``next()``, when the node is draining (as an engine's read).
            Unavailable: the store is closed.
        """
        self._gate.check_reads_allowed()  # the same gate as pinned_chunks
        store, limits = self._store, self._limits
        step = max(1, chunk_keys)
        for i in range(0, len(keys), step):
            chunk = keys[i : i + step]
            errors = [limits.key_error(i + j, k) for j, k in enumerate(chunk)]
            good = [k for k, e in zip(chunk, errors, strict=True) if e is None]
            read = iter(store.read_for_export(good, namespace_id=namespace_id) if good else ())
            got: list[ExportedBlock | None | KvstoredError] = [
                next(read) if e is None else limits.count_item_error(e) for e in errors
            ]
            try:
                yield i, got
            finally:
                store.release_export([b for b in got if not isinstance(b, KvstoredError)])

    def touch_hits(self, hits: Sequence[PinnedBlock], namespace_id: bytes = b"") -> None:
        """Make ``hits`` (one request's hits, in request order) the most recent, head last.

        Never pins, promotes or counts; blocks evicted meanwhile are skipped.
        """
        self._store.touch_many(
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
            stale = self._store.unpin_many(pins)
        except KvstoredError as exc:  # the store is closed
            log.debug("unpin_skipped", num_blocks=len(pins), error=str(exc))
            return
        for b in stale:  # already released
            log.debug("unpin_skipped", key=format_hash(b.key), error="not pinned")

    def get_inline(
        self, keys: Sequence[bytes], namespace_id: bytes, *, budget_bytes: int
    ) -> list[GetOutcome]:
        """Copy blocks out for the inline gRPC Get.

        At most ``budget_bytes`` of values are returned (but always the first found block);
        items past the budget get a :class:`BatchTooLarge` status so the client fetches them
        in another call.

        Raises:
            BatchTooLarge, InvalidArgument: for the whole call.
            Draining: the node is shutting down.
        """
        self._limits.check_batch(len(keys))
        self._limits.check_namespace_id(namespace_id)
        out: list[GetOutcome] = []
        used = num = 0
        full = False
        unserved: list[PinnedBlock] = []
        with contextlib.closing(self.pinned_chunks(keys, namespace_id)) as chunks:
            for start, got in chunks:
                for j, b in enumerate(got):
                    if isinstance(b, (PinnedBlock, ExportedBlock)):
                        if full or (num and used + b.size_bytes > budget_bytes):
                            full = True
                            if isinstance(b, PinnedBlock):
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
            self._store.uncount_reads(unserved)
        if self._metrics is not None:
            self._metrics.count_transfer("grpc", "out", num, used)
        return out

    # ---- probes and admin reads: never pin, touch recency or count as hits ---------------
    def lookup_prefix(self, keys: Sequence[bytes], namespace_id: bytes) -> list[Tier]:
        """Tiers of the leading present blocks (stops at the first miss); never pins."""
        self._limits.check_keys(keys)
        self._limits.check_namespace_id(namespace_id)
        tiers = self._store.lookup_prefix(keys, namespace_id=namespace_id)
        if self._metrics is not None:
            self._metrics.count_lookup(len(keys), len(tiers))
        return tiers

    def exists(
        self, keys: Sequence[bytes], namespace_id: bytes = b"", *, with_tiers: bool = False
    ) -> tuple[list[bool], list[Tier | None]]:
        """Per key: present; with ``with_tiers`` also the tier (DRAM preferred), else []."""
        self._limits.check_keys(keys)
        self._limits.check_namespace_id(namespace_id)
        store = self._store
        present = store.exists(keys, namespace_id=namespace_id)
        if not with_tiers:
            return present, []
        tiers: list[Tier | None] = []
        for key, p in zip(keys, present, strict=True):
            found = store.lookup_prefix([key], namespace_id=namespace_id) if p else []
            tiers.append(found[0] if found else None)
        return present, tiers

    def list_blocks(self, namespace_id: bytes, limit: int) -> tuple[list[BlockInfo], bool]:
        """Admin listing; ``limit`` 0 = 10000. Never pins or touches recency."""
        self._limits.check_namespace_id(namespace_id)
        if limit <= 0:
            limit = DEFAULT_LIST_LIMIT
        return self._store.list_blocks(namespace_id=namespace_id, limit=min(limit, MAX_LIST_LIMIT))
