"""kvstored: a tiered, content-addressed store of LLM KV-cache blocks.

``from kvstored import Client, AsyncClient, Namespace, block_hashes``. Importing this package
never imports torch (the torch helpers live in ``kvstored.client.torch``).
"""

from kvstored.client import AsyncClient, Block, Client, NodeInfo, PutResult
from kvstored.errors import (
    BatchTooLarge,
    BlockTooLarge,
    ChecksumMismatch,
    ConfigInvalid,
    DeadlineExceeded,
    Draining,
    DtypeMismatch,
    ErrorCode,
    InternalError,
    InvalidArgument,
    KeyInvalid,
    KvstoredError,
    LeaseExpired,
    NamespaceMismatch,
    NoCapacity,
    NotFound,
    ReplicaNotReady,
    StorageIOError,
    TransferFailed,
    Unavailable,
)
from kvstored.keys import Namespace, block_hashes, hash_block
from kvstored.types import Tier

__version__ = "0.1.0"

__all__ = [
    "AsyncClient", "BatchTooLarge", "Block", "BlockTooLarge", "ChecksumMismatch", "Client",
    "ConfigInvalid", "DeadlineExceeded", "Draining", "DtypeMismatch", "ErrorCode",
    "InternalError", "InvalidArgument", "KeyInvalid", "KvstoredError", "LeaseExpired",
    "Namespace", "NamespaceMismatch", "NoCapacity", "NodeInfo", "NotFound", "PutResult",
    "ReplicaNotReady", "StorageIOError", "Tier", "TransferFailed", "Unavailable",
    "__version__", "block_hashes", "hash_block",
]
