"""Several TCP streams for one large GET: the split policy and the abort registry.

One TCP connection over loopback tops out where the *receiving* side's kernel copy
(``copy_to_user`` of every segment into the caller's memory) saturates one core: on a 2-core
VM (measured) the receiver spends ~0.25 CPU-s per GB, the sender ~0.14, so one stream cannot
pass ~4 GB/s however idle the other core is. A large batch therefore goes out as a few
requests on separate pooled connections, each for a contiguous run of the keys (2 runs per
stream; a stream takes the next run when it is done with one, so a stream whose thread is
held up delays one run, not a fixed share), each received by its own thread straight into
the caller's buffers (``recv_into`` releases the GIL), so the receive copies run on several
cores at once. The node serves each connection
on its own thread; every request pins and sends its own blocks and carries each replica's
generation, exactly as a single request would. A GET of one large block is split the same
way into byte ranges (GET_FLAG_RANGES, :func:`plan_ranges`), one request each, all landing
in the one view the sink gave (:class:`SharedBlock`); the block counts as found only if
every range came from the same replica (same size, meta and non-zero generation), else it
is a miss (it was evicted or replaced between the pins).

Rules that make it safe:

- **One batch, one outcome.** A request that fails (torn connection, deadline, malformed
  frame, the node's error) fails the whole ``get``: the other streams are shut down at once
  (``shutdown(SHUT_RDWR)`` makes their blocking ``recv_into`` return), their connections are
  closed, and no item of the batch is reported found, so a half-received block is never
  reported as data.
- **No write after return.** ``get`` returns or raises only after every stream's thread has
  left its last ``recv_into``: when the caller regains control (and e.g. aborts the arena
  reservations its sink handed out, as node/remote.py does), nothing writes its memory any
  more.
- **The sink is called by one thread at a time** (a lock around it), in each stream's key
  order; different streams' items interleave. A sink keeps no order assumption across
  indices.

Source: the split mirrors what Mooncake's transfer engine does for a batch (slices spread over
several connections/workers) and what iperf's ``-P`` measures; the unit is a whole block
(a key) for a batch, a byte range for a lone large block.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
from collections.abc import Sequence

from kvstored.transport.base import Sink

DEFAULT_MAX_STREAMS = max(1, min(4, os.cpu_count() or 1))
"""Connections one GET may use at once: one per core, at most 4 (on 2 cores, 4 streams
measured slower than 2: the extra threads only add switches)."""

DEFAULT_STREAM_MIN_BYTES = 8 << 20
"""Expected payload per stream below which a batch is not split further: a stream costs one
more request and a thread hand-off (~0.1 ms), 8 MiB takes ~2-3 ms to move."""


def plan_streams(size_hints: Sequence[int], max_streams: int, stream_min_bytes: int) -> list[tuple[int, int]]:
    """Split ``len(size_hints)`` keys into contiguous ``(start, end)`` runs of similar bytes.

    Args:
        size_hints: the expected payload bytes of each key, in order (a caller's buffer
            capacity, or a running average); 0 or negative counts as 0.
        max_streams: most runs (>= 1).
        stream_min_bytes: each run should expect at least this many bytes (> 0).

    Returns:
        Between 1 and ``min(max_streams, len(size_hints))`` runs that cover every index once,
        in order; ``[(0, n)]`` when the batch is too small to split (or empty).
    """
    n = len(size_hints)
    sizes = [max(0, int(s)) for s in size_hints]
    total = sum(sizes)
    k = min(max_streams, n, total // max(1, stream_min_bytes))
    if k <= 1:
        return [(0, n)]
    prefix = [0]
    for x in sizes:
        prefix.append(prefix[-1] + x)
    cuts = [0]
    for j in range(1, k):  # cut j: the prefix closest to j/k of the bytes, >= 1 key per run
        target = total * j / k
        lo, hi = cuts[-1] + 1, n - (k - j)
        cuts.append(min(range(lo, hi + 1), key=lambda p: (abs(prefix[p] - target), p)))
    cuts.append(n)
    return list(itertools.pairwise(cuts))


class StreamSet:
    """The connections of one multi-stream GET, so a failure in one can stop the others.

    Thread-safe. A stream ``enter``s its socket before its first byte goes out and ``leave``s
    it before handing the socket back to the pool (or closing it); ``abort`` shuts down every
    socket still entered, which makes a blocking ``recv_into``/``sendmsg`` on it return.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self.failed = False
        """True once a stream failed: the others stop (and never retry)."""

    def enter(self, sock: socket.socket) -> bool:
        """Register ``sock``; False = the set has failed already (do not start)."""
        with self._lock:
            if self.failed:
                return False
            self._socks.add(sock)
            return True

    def leave(self, sock: socket.socket) -> None:
        """Unregister ``sock`` (its stream is done with it)."""
        with self._lock:
            self._socks.discard(sock)

    def abort(self, origin: socket.socket | None = None) -> None:
        """Mark the set failed and shut down every registered socket but ``origin``."""
        with self._lock:
            self.failed = True
            socks = [s for s in self._socks if s is not origin]
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed or broken: its stream fails on its own


RANGE_ALIGN_BYTES = 64 << 10
"""Range boundaries of a split block are multiples of this (whole pages, whole segments)."""


def plan_ranges(size_hint: int, max_streams: int, stream_min_bytes: int, to_end: int) -> list[tuple[int, int]]:
    """Split one block of about ``size_hint`` bytes into ``(offset, length)`` byte ranges.

    Args:
        size_hint: the block's expected size (e.g. the caller's buffer).
        max_streams: most ranges (>= 1).
        stream_min_bytes: each range should be at least this long.
        to_end: the length meaning "to the end of the block" (the last range gets it, so a
            block longer than the hint is still covered whole).

    Returns:
        ``[(0, to_end)]`` when the block is too small to split; else 2..max_streams ranges,
        back to back from offset 0.
    """
    k = min(max_streams, max(0, size_hint) // max(1, stream_min_bytes))
    if k <= 1:
        return [(0, to_end)]
    step = -(-size_hint // k)
    step = -(-step // RANGE_ALIGN_BYTES) * RANGE_ALIGN_BYTES
    out = [(i * step, step) for i in range(k - 1) if i * step < size_hint]
    out.append((len(out) * step, to_end))
    return out


class SharedBlock:
    """One block read as byte ranges over several streams: one sink call, one view for all.

    The first range whose header arrives asks the sink for the view; every other range must
    announce the same size, meta and (non-zero) generation, i.e. the very replica the first
    one pinned, else the parts may come from two replicas and the block is reported a miss.
    """

    def __init__(self, sink: Sink) -> None:
        self._sink = sink
        self._lock = threading.Lock()
        self._first: tuple[int, bytes, int] | None = None
        self._view: memoryview | None = None
        self.mismatch = False

    def view_for(self, size: int, meta: bytes, generation: int) -> memoryview | None:
        """The view for the range just announced, or None: skip it (a mismatch, or the
        sink declined the block)."""
        with self._lock:
            if self._first is None:
                self._first = (size, meta, generation)
                self._view = self._sink(0, size, meta)
                if not generation:
                    self.mismatch = True  # no generation: the parts cannot be matched
            elif self._first != (size, meta, generation):
                self.mismatch = True
                return None
            return self._view
