"""What the store core answers besides value objects (those live in :mod:`kvstored.types`).

The store core (``TieredStore`` in tiered.py) is thread-safe behind one lock; callers copy
bytes into/out of arena views *outside* that lock while they hold a reservation (put) or a
pin (get). A reservation is invisible to readers until committed.
"""

from __future__ import annotations


NEEDS_IO: object = type("NeedsIo", (), {"__repr__": lambda self: "NEEDS_IO"})()
"""Result of ``TieredStore.pin_many(..., may_block=False)`` for every key when one of them
would need disk I/O (an SSD-only or promoting block): nothing was pinned or counted; call
again with ``may_block=True`` from a thread that may block."""
