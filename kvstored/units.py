"""Human sizes and durations: ``parse_size("64GiB") -> 68719476736``."""

from __future__ import annotations

import re
from fractions import Fraction

from kvstored.errors import InvalidArgument

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?i?b?)?\s*$", re.IGNORECASE)
_MULT = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "ki": 1024, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mi": 1024**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gi": 1024**3, "gib": 1024**3,
    "t": 1000**4, "tb": 1000**4, "ti": 1024**4, "tib": 1024**4,
    "p": 1000**5, "pb": 1000**5, "pi": 1024**5, "pib": 1024**5,
}


def parse_size(value: str | int) -> int:
    """Parse a byte size: an int, or a string like ``"1GiB"``, ``"512 MB"``, ``"4096"``.

    The number is parsed exactly (no float): ``"9007199254740993"`` stays that integer and
    ``"1.5KiB"`` is 1536. A fractional byte count is truncated (``"1.5"`` -> 1).

    Returns:
        The size in bytes (int >= 0).

    Raises:
        InvalidArgument: unparsable or negative.
    """
    if isinstance(value, bool):
        raise InvalidArgument(f"size must be an int or a string like '1GiB'; got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise InvalidArgument(f"size must be >= 0 bytes; got {value}")
        return value
    if not isinstance(value, str):
        raise InvalidArgument(f"size must be an int or a string like '1GiB'; got {value!r}")
    m = _SIZE_RE.match(value)
    if not m or m.group(2).lower() not in _MULT:
        raise InvalidArgument(
            f"cannot parse size {value!r}; use bytes or a unit like 512MiB, 1GiB, 4GB"
        )
    return int(Fraction(m.group(1)) * _MULT[m.group(2).lower()])


def format_size(num_bytes: float) -> str:
    """Format bytes with binary units, e.g. ``format_size(1536) == "1.5 KiB"``."""
    n = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
