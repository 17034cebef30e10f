"""The SSD tier's I/O pool: a batch's block reads and writes, several at once.

A mixin of :class:`~kvstored.tiers.ssd.SsdTier` (state: ``_io_threads``, ``_pool``,
``_pool_lock``; per block it calls the tier's :meth:`read_file` / :meth:`write_file`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from kvstored.tiers.ssd import SsdEntry, SsdWrite

log = structlog.get_logger(__name__)


class SsdBatchIo:
    """:meth:`read_files` / :meth:`write_files` on a lazily made pool ("kvstored-ssd-io")."""

    _io_threads: int
    _pool: ThreadPoolExecutor | None
    _pool_lock: threading.Lock

    read_file: Callable[[bytes, SsdEntry, memoryview], str]
    write_file: Callable[[SsdWrite, memoryview], bool]

    def _io_pool(self) -> ThreadPoolExecutor:
        pool = self._pool
        if pool is None:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        max_workers=self._io_threads, thread_name_prefix="kvstored-ssd-io"
                    )
                pool = self._pool
        return pool

    def read_files(self, reads: Sequence[tuple[bytes, SsdEntry, memoryview]]) -> list[str]:
        """:meth:`read_file` of several blocks, up to ``io_threads`` at once (no lock held).

        Args:
            reads: ``(store key, entry, dest)`` per block, as for :meth:`read_file`.

        Returns:
            Per block, in order: "" or the reason it failed (an unexpected exception in one
            read is that block's ``"read_error: ..."``; the others still complete).
        """
        def one(item: tuple[bytes, SsdEntry, memoryview]) -> str:
            try:
                return self.read_file(*item)
            except Exception as exc:  # never lose the other reads' results
                return f"read_error: {exc}"

        if len(reads) <= 1 or self._io_threads == 1:
            return [one(r) for r in reads]
        return list(self._io_pool().map(one, reads))

    def write_files(self, writes: Sequence[tuple[SsdWrite, memoryview]]) -> list[bool]:
        """:meth:`write_file` of several blocks, up to ``io_threads`` at once (no lock held).

        Returns:
            Per block, in order: True if written (an unexpected exception counts as False).
        """
        def one(item: tuple[SsdWrite, memoryview]) -> bool:
            try:
                return self.write_file(*item)
            except Exception as exc:
                log.warning("ssd_write_failed", stage="unexpected", error=str(exc))
                return False

        if len(writes) <= 1 or self._io_threads == 1:
            return [one(w) for w in writes]
        return list(self._io_pool().map(one, writes))

