"""The SSD tier's I/O pool: a batch's block reads and writes, several at once.

:class:`IoPool` is the named, bounded pool ("kvstored-ssd-io") an
:class:`~kvstored.tiers.ssd.SsdTier` is built with; :func:`read_files` and
:func:`write_files` run the tier's one-block :meth:`~kvstored.tiers.ssd.SsdTier.read_file`
/ :meth:`~kvstored.tiers.ssd.SsdTier.write_file` over a batch on it, so that one block's
failure never loses the others' results. No lock is held by any of them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

import structlog

if TYPE_CHECKING:
    from kvstored.tiers.ssd_format import SsdEntry, SsdWrite

log = structlog.get_logger(__name__)

T = TypeVar("T")
R = TypeVar("R")

ReadItem = tuple[bytes, "SsdEntry", memoryview]
"""``(store key, entry, dest)``: one block read, as ``SsdTier.read_file`` takes it."""
WriteItem = tuple["SsdWrite", memoryview]
"""``(write, data)``: one block write, as ``SsdTier.write_file`` takes it."""


class IoPool:
    """Runs a function over a batch, up to ``num_threads`` items at once, on a thread pool
    made on first use (thread-safe).

    Args:
        num_threads: threads of the pool = the queue depth of a batch (>= 1).
    """

    def __init__(self, num_threads: int) -> None:
        self.num_threads = int(num_threads)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``[fn(item) for item in items]``, in order; inline when there is at most one item
        or one thread. An exception of ``fn`` propagates (wrap ``fn`` to keep the others)."""
        if len(items) <= 1 or self.num_threads == 1:
            return [fn(item) for item in items]
        pool = self._pool
        if pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        max_workers=self.num_threads, thread_name_prefix="kvstored-ssd-io"
                    )
                pool = self._pool
        return list(pool.map(fn, items))

    def shutdown(self) -> None:
        """Wait for the batches in flight and stop the threads (if any were made)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def read_files(
    pool: IoPool, read_file: Callable[[bytes, SsdEntry, memoryview], str],
    reads: Sequence[ReadItem],
) -> list[str]:
    """``read_file`` of several blocks, up to the pool's threads at once (no lock held).

    Returns:
        Per block, in order: "" or the reason it failed (an unexpected exception in one
        read is that block's ``"read_error: ..."``; the others still complete).
    """
    def one(item: ReadItem) -> str:
        try:
            return read_file(*item)
        except Exception as exc:  # never lose the other reads' results
            return f"read_error: {exc}"

    return pool.map(one, reads)


def write_files(
    pool: IoPool, write_file: Callable[[SsdWrite, memoryview], bool],
    writes: Sequence[WriteItem],
) -> list[bool]:
    """``write_file`` of several blocks, up to the pool's threads at once (no lock held).

    Returns:
        Per block, in order: True if written (an unexpected exception counts as False,
        logged as the warning ``ssd_write_failed``).
    """
    def one(item: WriteItem) -> bool:
        try:
            return write_file(*item)
        except Exception as exc:
            log.warning("ssd_write_failed", stage="unexpected", error=str(exc))
            return False

    return pool.map(one, writes)
