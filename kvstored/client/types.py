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
        replicas_written: replicas of the block committed when put returned, on distinct
            nodes, the engine's own node included (1 for a put that asked for one; for a
            put(replicas=N) at least 1 when ``ok``: the count the node could confirm; 0 when
            ``error`` is set, since a refused put wrote nothing).
        replicas_wanted: the replicas the put asked for (``replicas=``, else the client's,
            else the node's default for the namespace).
        replica_error: why ``replicas_written`` is below ``replicas_wanted`` (NoCapacity:
            too few nodes with room; Unavailable: no master; TransferFailed...), else None.
    """

    stored: bool
    error: KvstoredError | None = None
    replicas_written: int = 1
    replicas_wanted: int = 1
    replica_error: KvstoredError | None = None

    def __post_init__(self) -> None:
        if self.error is not None and self.replicas_written:
            object.__setattr__(self, "replicas_written", 0)  # a refused put wrote no replica

    @property
    def ok(self) -> bool:
        """True when the block is stored now (by this call or earlier)."""
        return self.error is None

    @property
    def short(self) -> bool:
        """True when the block is stored with fewer replicas than the put asked for (never
        silently: ``replica_error`` says why)."""
        return self.ok and self.replicas_written < self.replicas_wanted


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
    default_replicas: int = 1
    transports: tuple[str, ...] = ("tcp",)
    """What the node's data plane speaks (``"rdma"`` too with an RDMA device)."""

    def to_dict(self) -> dict[str, object]:
        """Plain dict (JSON-ready)."""
        d = asdict(self)
        d["listen_addresses"] = list(self.listen_addresses)
        d["transports"] = list(self.transports)
        return d
