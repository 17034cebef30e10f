"""Content addressing: namespaces and chained block hashes.

A block hash is ``H(parent_hash, token ids of the block, extra keys)`` truncated to
``HASH_BYTES`` (16 bytes = 128 bits). The first block's parent is a fixed root derived from
the :class:`Namespace`, so the same tokens under another model, dtype, layout, TP rank or tenant
give different hashes from the very first block.

Canonical encoding (hash scheme version 1, pinned by golden vectors in tests/unit/test_keys.py)::

    namespace id = blake3(b"kvstored/ns/v1" + u32le(1) + field_1 + ... + field_8)[:16]
                   u32le(1) is HASH_SCHEME_VERSION; each field = u32le(len(utf8)) + utf8 of
                   str(value) (ints in decimal), in the order of Namespace's fields: model_id,
                   revision, kv_dtype, kv_layout, block_size, tp_size, tp_rank, tenant_salt
    root         = blake3(b"kvstored/root/v1" + namespace id)[:16]
    block hash   = blake3(b"kvstored/block/v1" + parent(16) + u32le(num_tokens)
                          + token ids as u32le + u32le(num_extra) + extra_1 + ... )[:16]
                   each extra = tag byte + u32le(len(payload)) + payload: b"s" + utf8 of a str,
                   b"b" + the bytes, b"i" + the int in decimal ASCII
                   block_hashes(lora=NAME) puts the str extra "lora:" + NAME first in every block

Never Python's ``hash()`` or pickle: keys must match across processes, hosts and
PYTHONHASHSEED values.

Source: the chaining follows vLLM's prefix-caching block hash and Mooncake's chained prefix
keys (see shared/REFERENCES.md); the encoding itself is ours.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, fields

import blake3
import numpy as np

from kvstored.errors import InvalidArgument

HASH_SCHEME_VERSION = 1
HASH_BYTES = 16
MAX_TOKEN_ID = 2**32 - 1

ExtraKey = str | bytes | int

_KV_DTYPES = frozenset(
    {"float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8", "uint8"}
)
_NAME_RE = re.compile(r"^[\x21-\x7e]{1,256}$")  # printable ASCII, no spaces


def _u32(n: int) -> bytes:
    return struct.pack("<I", n)


@dataclass(frozen=True, slots=True)
class Namespace:
    """Everything that changes the bytes of a block.

    Attributes:
        model_id: model name, e.g. ``"HuggingFaceTB/SmolLM2-135M-Instruct"``.
        revision: weights revision (commit, file digest or version tag).
        kv_dtype: element type of the stored KV, one of float32, float16, bfloat16,
            float8_e4m3fn, float8_e5m2, int8, uint8.
        kv_layout: layout tag of a block's bytes, e.g. ``"layers,kv,heads,tokens,dim"``.
        block_size: tokens per block (> 0); the store only keeps full blocks.
        tp_size: tensor-parallel world size (>= 1).
        tp_rank: this shard's tensor-parallel rank, ``0 <= tp_rank < tp_size``.
        tenant_salt: isolates tenants that must never share KV ("" = shared).

    Raises:
        InvalidArgument: on construction, when a field is out of range or malformed.
    """

    model_id: str
    revision: str = "main"
    kv_dtype: str = "bfloat16"
    kv_layout: str = "layers,kv,heads,tokens,dim"
    block_size: int = 256
    tp_size: int = 1
    tp_rank: int = 0
    tenant_salt: str = ""

    def __post_init__(self) -> None:
        for name in ("model_id", "revision", "kv_layout"):
            value = getattr(self, name)
            if not isinstance(value, str) or not _NAME_RE.match(value):
                raise InvalidArgument(
                    f"Namespace.{name} must be 1-256 printable ASCII characters without spaces; "
                    f"got {value!r}"
                )
        if self.kv_dtype not in _KV_DTYPES:
            raise InvalidArgument(
                f"Namespace.kv_dtype must be one of {sorted(_KV_DTYPES)}; got {self.kv_dtype!r}"
            )
        for name in ("block_size", "tp_size", "tp_rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidArgument(f"Namespace.{name} must be an int; got {value!r}")
        if not 1 <= self.block_size <= 1 << 20:
            raise InvalidArgument(
                f"Namespace.block_size must be in [1, 1048576] tokens; got {self.block_size}"
            )
        if self.tp_size < 1:
            raise InvalidArgument(f"Namespace.tp_size must be >= 1; got {self.tp_size}")
        if not 0 <= self.tp_rank < self.tp_size:
            raise InvalidArgument(
                f"Namespace.tp_rank must be in [0, tp_size={self.tp_size}); got {self.tp_rank}"
            )
        if not isinstance(self.tenant_salt, str) or len(self.tenant_salt) > 256:
            raise InvalidArgument(
                f"Namespace.tenant_salt must be a str of at most 256 characters; "
                f"got {self.tenant_salt!r}"
            )

    def canonical_bytes(self) -> bytes:
        """The canonical encoding of this namespace (see the module docstring)."""
        parts = [b"kvstored/ns/v1", _u32(HASH_SCHEME_VERSION)]
        for f in fields(self):
            raw = str(getattr(self, f.name)).encode("utf-8")
            parts.append(_u32(len(raw)) + raw)
        return b"".join(parts)

    @property
    def id(self) -> bytes:
        """16-byte namespace fingerprint; stored with every block and checked on get."""
        return blake3.blake3(self.canonical_bytes()).digest()[:HASH_BYTES]

    @property
    def id_hex(self) -> str:
        """The namespace fingerprint as 32 hex characters (what kvstorectl shows)."""
        return self.id.hex()

    @property
    def root_hash(self) -> bytes:
        """The parent hash of a prefix's first block (16 bytes)."""
        return blake3.blake3(b"kvstored/root/v1" + self.id).digest()[:HASH_BYTES]

    def to_dict(self) -> dict[str, str | int]:
        """Plain dict of the fields (for JSON/TOML files)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Namespace:
        """Build from a dict (e.g. a TOML table); unknown keys raise InvalidArgument."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise InvalidArgument(
                f"unknown Namespace field(s) {sorted(unknown)}; known fields: {sorted(known)}"
            )
        if "model_id" not in data:
            raise InvalidArgument("Namespace needs model_id")
        return cls(**data)  # type: ignore[arg-type]  # the field values are checked by the dataclass at run time


def _encode_extra(extra: ExtraKey) -> bytes:
    if isinstance(extra, bool):
        raise InvalidArgument(f"extra key must be str, bytes or int; got bool {extra!r}")
    if isinstance(extra, str):
        raw = extra.encode("utf-8")
        return b"s" + _u32(len(raw)) + raw
    if isinstance(extra, (bytes, bytearray, memoryview)):
        raw = bytes(extra)
        return b"b" + _u32(len(raw)) + raw
    if isinstance(extra, int):
        raw = str(extra).encode("ascii")
        return b"i" + _u32(len(raw)) + raw
    raise InvalidArgument(
        f"extra key must be str, bytes or int; got {type(extra).__name__} {extra!r}"
    )


def hash_block(
    parent: bytes, token_ids: Sequence[int] | np.ndarray, extra_keys: Sequence[ExtraKey] = ()
) -> bytes:
    """Hash one block given its parent hash.

    Args:
        parent: the previous block's hash, or ``Namespace.root_hash`` (``HASH_BYTES`` bytes).
        token_ids: the block's token ids, each in ``[0, 2**32)``.
        extra_keys: LoRA name, multimodal item hashes, ... in a fixed order.

    Returns:
        The block hash, ``HASH_BYTES`` bytes.

    Raises:
        InvalidArgument: wrong parent width, token id out of range, bad extra key type.
    """
    if len(parent) != HASH_BYTES:
        raise InvalidArgument(f"parent hash must be {HASH_BYTES} bytes; got {len(parent)}")
    arr = _as_token_array(token_ids)
    h = blake3.blake3(b"kvstored/block/v1")
    h.update(parent)
    h.update(_u32(arr.size))
    h.update(arr.tobytes())
    h.update(_u32(len(extra_keys)))
    for extra in extra_keys:
        h.update(_encode_extra(extra))
    return h.digest()[:HASH_BYTES]


def _as_token_array(token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    try:
        arr = np.asarray(token_ids)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"token_ids must be a sequence of ints; {exc}") from None
    if arr.ndim != 1:
        raise InvalidArgument(f"token_ids must be one-dimensional; got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype="<u4")
    if arr.dtype.kind not in "iu":
        raise InvalidArgument(f"token_ids must be integers; got dtype {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi > MAX_TOKEN_ID:
        raise InvalidArgument(
            f"token ids must be in [0, {MAX_TOKEN_ID}]; got a value {lo if lo < 0 else hi}"
        )
    return arr.astype("<u4", copy=False)


def block_hashes(
    namespace: Namespace,
    token_ids: Sequence[int] | np.ndarray,
    *,
    extra_keys: Sequence[Sequence[ExtraKey] | None] | None = None,
    lora: str | None = None,
) -> list[bytes]:
    """Chained block hashes of all *full* blocks of a token sequence.

    A trailing partial block (``len(token_ids) % block_size`` tokens) gets no hash.

    Args:
        namespace: the namespace; its ``block_size`` sets tokens per block.
        token_ids: the prompt's token ids (any length, ints in ``[0, 2**32)``).
        extra_keys: optional per-block extra keys (multimodal hashes, ...); item ``i`` applies
            to block ``i``; ``None`` or a shorter list means no extra keys for the rest.
        lora: optional LoRA adapter name, mixed into every block.

    Returns:
        ``len(token_ids) // block_size`` hashes of ``HASH_BYTES`` bytes each.

    Raises:
        InvalidArgument: bad token ids or extra keys.
    """
    arr = _as_token_array(token_ids)
    bs = namespace.block_size
    num_blocks = arr.size // bs
    if extra_keys is not None and len(extra_keys) > num_blocks:
        raise InvalidArgument(
            f"extra_keys has {len(extra_keys)} entries but there are only {num_blocks} full blocks"
        )
    out: list[bytes] = []
    parent = namespace.root_hash
    for i in range(num_blocks):
        extras: list[ExtraKey] = []
        if lora is not None:
            extras.append("lora:" + lora)
        if extra_keys is not None and i < len(extra_keys) and extra_keys[i]:
            extras.extend(extra_keys[i])  # type: ignore[arg-type]  # extra_keys[i] is not None here: checked in the condition above
        parent = hash_block(parent, arr[i * bs : (i + 1) * bs], extras)
        out.append(parent)
    return out


def format_hash(key: bytes) -> str:
    """A block hash as logs and tables show it: the first 16 hex characters."""
    return key[:8].hex()
