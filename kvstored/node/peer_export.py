"""A peer's data-plane GET: blocks sent for a copy, never promoted, touched or counted.

A node that copies a peer's blocks into its own store (:mod:`kvstored.node.remote`) asks
with ``GET_FLAG_PEER_EXPORT``. The reader keeps its own copy in DRAM, so the source must
only send the bytes: an engine-style pin (``pin_many``) would promote an SSD-only block into
the source's DRAM (demoting others: tier churn for the sake of a block it does not serve),
make it the most recent and count an engine get/hit. Here every chunk goes through
:meth:`~kvstored.tiers.export.ExportMixin.read_for_export` instead::

    DRAM block     pinned in place for the send (the pin held until the kernel has the
                   bytes, as an engine GET's); its LRU position untouched
    SSD-only block read from its file into a private buffer, checksum-verified (a bad file
                   is dropped and answered as a miss, never wrong bytes); stays SSD-only
    either         sent with its replica's generation; counted as a transfer out only
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING

from kvstored.errors import KvstoredError

if TYPE_CHECKING:
    from kvstored.node.core import NodeCore
    from kvstored.tiers.export import ExportedBlock


def export_chunks(
    core: NodeCore, keys: Sequence[bytes], namespace_id: bytes, *, chunk_keys: int = 64
) -> Generator[tuple[int, list[ExportedBlock | None | KvstoredError]], None, None]:
    """Read ``keys`` for a peer a chunk at a time: yields ``(start index, per-key results)``.

    The counterpart of :meth:`~kvstored.node.core.NodeCore.pinned_chunks` for a peer's
    export read: a chunk's DRAM pins are released when the consumer asks for the next chunk
    or closes the generator (use ``contextlib.closing``), so they are held for the whole
    send of that chunk. Nothing is promoted, so a chunk never runs out of DRAM and is never
    cut. At most ``chunk_keys`` SSD-only blocks are buffered at once.

    Args:
        core: the node.
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
    core._check_reads_allowed()  # the same gate as pinned_chunks
    store = core.store
    step = max(1, chunk_keys)
    for i in range(0, len(keys), step):
        chunk = keys[i : i + step]
        errors = [core.key_error(i + j, k) for j, k in enumerate(chunk)]
        good = [k for k, e in zip(chunk, errors, strict=True) if e is None]
        read = iter(store.read_for_export(good, namespace_id=namespace_id) if good else ())
        got: list[ExportedBlock | None | KvstoredError] = [
            next(read) if e is None else core._count_item_error(e) for e in errors
        ]
        try:
            yield i, got
        finally:
            store.release_export([b for b in got if not isinstance(b, KvstoredError)])
