"""Result types of the client library."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kvstored.errors import KvstoredError
from kvstored.types import Tier


@dataclass(frozen=True, slots=True)
class PutResult:
    """Result of putting one block.

    Attributes:
        stored: True if this call stored the block; False if it already existed (an
            idempotent success) or on error.
        error: this item's error (KeyInvalid, BlockTooLarge, NoCapacity, ...), or None.
    """

    stored: bool
    error: KvstoredError | None = None

    @property
    def ok(self) -> bool:
        """True when the block is stored now (by this call or earlier)."""
        return self.error is None


@dataclass(frozen=True, slots=True)
class Block:
    """A block read with its metadata.

    Attributes:
        value: the block's bytes.
        meta: opaque metadata stored with it (torch helpers: dtype and shape).
        tier: the tier it was found in (SSD hits are promoted to DRAM first).
    """

    value: bytes = field(repr=False)
    meta: bytes
    tier: Tier | None


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What a node says about itself (Describe), plus the transport this client chose.

    Sizes are bytes; ``pin_lease_s`` seconds. ``control_path``: the node's control channel
    socket ("" = none; kvstored/node/control.py).
    """

    node_id: str
    version: str
    epoch: int
    arena_path: str
    arena_size_bytes: int
    data_address: str
    max_block_bytes: int
    max_batch_keys: int
    max_inline_bytes: int
    draining: bool
    listen_addresses: tuple[str, ...]
    metrics_address: str
    arena_dev: int
    arena_ino: int
    max_meta_bytes: int
    min_key_bytes: int
    max_key_bytes: int
    pin_lease_s: float
    transport: str = ""
    control_path: str = ""

    def to_dict(self) -> dict[str, object]:
        """Plain dict (JSON-ready)."""
        d = asdict(self)
        d["listen_addresses"] = list(self.listen_addresses)
        return d
