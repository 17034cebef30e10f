"""Small helpers every test directory shares: block keys, an O_DIRECT probe.

Importable from every test directory: pytest puts tests/ on ``sys.path`` (the suite's root
conftest lives there). Polling and thread helpers are in tests/thread_helpers.py; the clock
tests advance by hand is :class:`kvstored.clock.FakeClock`.
"""

from __future__ import annotations

import os
import pathlib


def key(i: int) -> bytes:
    """Block ``i``'s 16-byte key (``i`` big-endian): distinct for distinct ``i`` in 0..2**128-1.

    Raises:
        OverflowError: ``i`` is negative or does not fit in 16 bytes.
    """
    return i.to_bytes(16, "big")


def odirect_supported(d: pathlib.Path) -> bool:
    """Whether the filesystem of directory ``d`` accepts ``O_DIRECT`` at open (tmpfs before
    Linux 6.6 and FUSE refuse it). Creates the empty file ``d/probe``."""
    try:
        os.close(os.open(d / "probe", os.O_CREAT | os.O_WRONLY | os.O_DIRECT))
    except OSError:
        return False
    return True
