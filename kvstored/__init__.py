"""kvstored: a tiered, content-addressed store of LLM KV-cache blocks.

``from kvstored import Client, AsyncClient, Namespace, block_hashes``. The names are loaded
on first use (PEP 562 ``__getattr__``), so ``import kvstored.errors`` or a daemon does not
load the client, gRPC or the TCP transport; importing this package never imports torch (the
torch helpers live in ``kvstored.client.torch``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it (loaded on first attribute access)
_LAZY: dict[str, str] = {
    **dict.fromkeys(("AsyncClient", "Block", "Client", "NodeInfo", "PutResult"), "kvstored.client"),
    **dict.fromkeys(
        (
            "BatchTooLarge", "BlockTooLarge", "ChecksumMismatch", "ConfigInvalid", "DeadlineExceeded",
            "Draining", "DtypeMismatch", "ErrorCode", "InternalError", "InvalidArgument", "KeyInvalid",
            "KvstoredError", "LeaseExpired", "NamespaceMismatch", "NoCapacity", "NotFound",
            "ReplicaNotReady", "StorageIOError", "TransferFailed", "Unavailable",
        ),
        "kvstored.errors",
    ),
    **dict.fromkeys(("Namespace", "block_hashes", "hash_block"), "kvstored.keys"),
    "Tier": "kvstored.types",
}

__all__ = [  # a literal list for linters and star-imports; equals sorted([*_LAZY, "__version__"])
    "AsyncClient", "BatchTooLarge", "Block", "BlockTooLarge", "ChecksumMismatch", "Client",
    "ConfigInvalid", "DeadlineExceeded", "Draining", "DtypeMismatch", "ErrorCode",
    "InternalError", "InvalidArgument", "KeyInvalid", "KvstoredError", "LeaseExpired",
    "Namespace", "NamespaceMismatch", "NoCapacity", "NodeInfo", "NotFound", "PutResult",
    "ReplicaNotReady", "StorageIOError", "Tier", "TransferFailed", "Unavailable",
    "__version__", "block_hashes", "hash_block",
]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ loads these
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


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first access (then cache it here).

    Raises:
        AttributeError: ``name`` is not a public name of the package (``from kvstored import
            native`` then imports the submodule, as usual).
    """
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvstored' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's globals plus the lazily loaded public names."""
    return sorted({*globals(), *_LAZY})
