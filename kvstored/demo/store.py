"""An in-process dict store with the client's shape: the demo's reference for the daemon.

``InProcessStore`` keeps each block as a private ``bytes`` copy in a dict and implements the
subset of :class:`kvstored.Client` the demo and the torch helpers use (``put``, ``get``,
``get_blocks``, ``get_into``, ``lookup_prefix``, ``lookup_prefix_tiers``, ``exists``,
``remove``, ``stats``, ``close``). ``get_into`` performs the same one copy into the caller's
buffer as the daemon's shared-memory path, so "daemon hit TTFT / in-process hit TTFT"
isolates what the daemon adds (RPCs, pins, transport).

Not a cache: no capacity, no eviction, no namespace checks. Thread-safe for the demo's use
(one dict operation per key).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kvstored.client.types import Block, PutResult
from kvstored.errors import InvalidArgument, KeyInvalid
from kvstored.types import Tier


def _check_keys(keys: Sequence[bytes]) -> None:
    for i, key in enumerate(keys):
        if not isinstance(key, (bytes, bytearray)) or not key:
            raise KeyInvalid(f"key {i} must be non-empty bytes; got {key!r}")


class InProcessStore:
    """A dict of ``key -> (value bytes, meta bytes)`` behind the client's method names."""

    def __init__(self) -> None:
        self._blocks: dict[bytes, tuple[bytes, bytes]] = {}
        self.num_gets = 0
        self.num_hits = 0

    def put(
        self, keys: Sequence[bytes], values: Sequence[Any], *, metas: Sequence[bytes] | None = None
    ) -> list[PutResult]:
        """Store blocks (a copy of each value); an existing key is a no-op success."""
        _check_keys(keys)
        if len(values) != len(keys) or (metas is not None and len(metas) != len(keys)):
            raise InvalidArgument(
                f"keys, values and metas must have the same length; got {len(keys)}, "
                f"{len(values)}, {None if metas is None else len(metas)}"
            )
        out = []
        for i, key in enumerate(keys):
            if key in self._blocks:
                out.append(PutResult(False))
                continue
            meta = bytes(metas[i]) if metas is not None else b""
            self._blocks[bytes(key)] = (memoryview(values[i]).cast("B").tobytes(), meta)
            out.append(PutResult(True))
        return out

    def get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Per key its bytes or None."""
        return [b.value if b is not None else None for b in self.get_blocks(keys)]

    def get_blocks(self, keys: Sequence[bytes]) -> list[Block | None]:
        """Per key a :class:`Block` (tier DRAM) or None."""
        _check_keys(keys)
        out: list[Block | None] = []
        for key in keys:
            item = self._blocks.get(bytes(key))
            self.num_gets += 1
            if item is not None:
                self.num_hits += 1
            out.append(None if item is None else Block(item[0], item[1], Tier.DRAM))
        return out

    def get_into(
        self, keys: Sequence[bytes], buffers: Sequence[Any], *, return_meta: bool = False
    ) -> list[Any]:
        """Copy each block into its buffer (one copy); per key bytes written or None.

        Raises:
            InvalidArgument: lengths differ, or a buffer is smaller than its block.
        """
        _check_keys(keys)
        if len(buffers) != len(keys):
            raise InvalidArgument(
                f"keys and buffers must have the same length; got {len(keys)} and {len(buffers)}"
            )
        out: list[Any] = []
        for i, key in enumerate(keys):
            item = self._blocks.get(bytes(key))
            self.num_gets += 1
            if item is None:
                out.append(None)
                continue
            self.num_hits += 1
            value, meta = item
            dst = np.frombuffer(buffers[i], dtype=np.uint8)
            if dst.size < len(value):
                raise InvalidArgument(
                    f"buffer {i} has {dst.size} bytes but block {i} needs {len(value)}"
                )
            np.copyto(dst[: len(value)], np.frombuffer(value, dtype=np.uint8))
            out.append((len(value), meta) if return_meta else len(value))
        return out

    def lookup_prefix_tiers(self, keys: Sequence[bytes]) -> list[Tier]:
        """Tier of each leading present block (always DRAM here)."""
        _check_keys(keys)
        out = []
        for key in keys:
            if bytes(key) not in self._blocks:
                break
            out.append(Tier.DRAM)
        return out

    def lookup_prefix(self, keys: Sequence[bytes]) -> int:
        """Number of leading blocks present."""
        return len(self.lookup_prefix_tiers(keys))

    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        """Per key: present."""
        _check_keys(keys)
        return [bytes(k) in self._blocks for k in keys]

    def remove(self, keys: Sequence[bytes]) -> list[bool]:
        """Per key: removed."""
        _check_keys(keys)
        return [self._blocks.pop(bytes(k), None) is not None for k in keys]

    def stats(self) -> dict[str, Any]:
        """Counters and usage in the shape of ``Client.stats()`` (one "DRAM" tier, no cap)."""
        used = sum(len(v) for v, _ in self._blocks.values())
        return {
            "gets": self.num_gets,
            "hits": self.num_hits,
            "misses": self.num_gets - self.num_hits,
            "tiers": [
                {"tier": "DRAM", "capacity_bytes": 0, "used_bytes": used,
                 "num_blocks": len(self._blocks), "hits": self.num_hits, "evictions": 0}
            ],
        }

    def close(self) -> None:
        """Drop every block."""
        self._blocks.clear()

    def __enter__(self) -> InProcessStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
