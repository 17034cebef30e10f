"""Type stub of the optional C extension built from native/copy.c (see kvstored/native.py)."""

from collections.abc import Sequence
from typing import Any

def copy_many(pairs: Sequence[tuple[Any, Any]], threads: int = 0) -> int:
    """memcpy each ``(dst, src)`` buffer pair with the GIL released; returns the bytes copied.

    Raises:
        TypeError: a pair is not a ``(dst, src)`` tuple, or ``src`` has no C-contiguous buffer.
        ValueError: ``dst`` is not a writable C-contiguous buffer, the lengths differ, or
            ``threads`` < 0.
    """
