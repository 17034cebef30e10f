"""torch helpers: put and get tensors of any dtype (bfloat16, float8_e4m3fn, ...) as blocks.

A tensor is stored as its raw bytes (viewed as ``uint8``, never converted through numpy's
dtypes, so bfloat16 and float8 survive bit for bit) plus a small tensor header in the block's
``meta``. On get the header is checked against what the caller expects; a mismatch raises
:class:`~kvstored.errors.DtypeMismatch` naming the key index, the expected and the found
dtype/shape. Bytes of the wrong kind are never handed back silently.

Tensor header (``meta``), version 1, little-endian, ``8 + 8 * ndim`` bytes::

    offset  size  field
    0       3     magic b"kvT"
    3       1     version (1)
    4       1     dtype code (see DTYPE_CODES; codes are never reused)
    5       1     ndim (0..32)
    6       2     reserved, 0
    8       8*n   shape, one u64 per dimension

Copies: :func:`put_tensors` hands a contiguous CPU tensor's own memory to the client
(no copy on this side); :func:`get_tensors_into` has the client write straight into the
caller's contiguous CPU tensors. Non-contiguous or non-CPU tensors go through one staging
copy (pinned host memory for CUDA tensors).

Only this module imports torch; ``import kvstored`` never does.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvstored.client.types import PutResult
from kvstored.errors import DtypeMismatch, InvalidArgument

__all__ = [
    "DTYPE_CODES",
    "TENSOR_META_VERSION",
    "TensorMeta",
    "decode_tensor_meta",
    "encode_tensor_meta",
    "get_tensors",
    "get_tensors_async",
    "get_tensors_into",
    "get_tensors_into_async",
    "put_tensors",
    "put_tensors_async",
    "tensor_bytes",
]

TENSOR_META_VERSION = 1
_MAGIC = b"kvT"
_HEADER = struct.Struct("<3sBBBH")
_MAX_NDIM = 32

DTYPE_CODES: dict[str, int] = {
    "float32": 1,
    "float16": 2,
    "bfloat16": 3,
    "float64": 4,
    "float8_e4m3fn": 5,
    "float8_e5m2": 6,
    "float8_e4m3fnuz": 7,
    "float8_e5m2fnuz": 8,
    "int8": 9,
    "uint8": 10,
    "int16": 11,
    "int32": 12,
    "int64": 13,
    "bool": 14,
    "uint16": 15,
    "uint32": 16,
    "uint64": 17,
    "complex64": 18,
    "complex128": 19,
    "float8_e8m0fnu": 20,
}
"""Wire code of each dtype name. Append only: a code is never reused or renumbered."""

_NAME_BY_CODE = {code: name for name, code in DTYPE_CODES.items()}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _torch_dtype(name: str) -> torch.dtype | None:
    dt = getattr(torch, name, None)
    return dt if isinstance(dt, torch.dtype) else None


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """The dtype and shape a block's tensor header describes.

    Attributes:
        dtype: element type name as torch spells it without ``torch.`` (``"bfloat16"``).
        shape: the tensor's shape.
    """

    dtype: str
    shape: tuple[int, ...]

    @property
    def num_bytes(self) -> int:
        """Size in bytes of a tensor with this dtype and shape."""
        dt = _torch_dtype(self.dtype)
        itemsize = torch.empty(0, dtype=dt).element_size() if dt is not None else 0
        return itemsize * int(np.prod(self.shape, dtype=np.int64))

    def __str__(self) -> str:
        return f"dtype={self.dtype} shape={tuple(self.shape)}"


def encode_tensor_meta(dtype: torch.dtype, shape: Sequence[int]) -> bytes:
    """Encode a tensor header (see the module docstring for the layout).

    Args:
        dtype: the tensor's dtype; must have a code in :data:`DTYPE_CODES`.
        shape: the tensor's shape, at most 32 non-negative dimensions.

    Returns:
        ``8 + 8 * len(shape)`` bytes.

    Raises:
        InvalidArgument: unsupported dtype, or a bad shape.
    """
    name = _dtype_name(dtype)
    code = DTYPE_CODES.get(name)
    if code is None:
        raise InvalidArgument(
            f"dtype {name} has no tensor-header code; supported: {sorted(DTYPE_CODES)}"
        )
    dims = tuple(int(d) for d in shape)
    if len(dims) > _MAX_NDIM or any(d < 0 for d in dims):
        raise InvalidArgument(
            f"shape must have at most {_MAX_NDIM} non-negative dimensions; got {dims}"
        )
    return _HEADER.pack(_MAGIC, TENSOR_META_VERSION, code, len(dims), 0) + struct.pack(
        f"<{len(dims)}Q", *dims
    )


def decode_tensor_meta(meta: bytes, *, index: int = 0) -> TensorMeta:
    """Decode a tensor header written by :func:`encode_tensor_meta`.

    Args:
        meta: the block's metadata bytes.
        index: the key index, for error messages.

    Returns:
        The dtype name and shape.

    Raises:
        DtypeMismatch: the metadata is not a tensor header this version understands (missing,
        wrong magic, newer version, unknown dtype code, truncated).
    """
    raw = bytes(meta)
    if len(raw) < _HEADER.size:
        what = "no tensor metadata" if not raw else f"{len(raw)} bytes of metadata"
        raise DtypeMismatch(
            f"key {index}: the block carries {what}, not a tensor header; it was not stored "
            "with put_tensors"
        )
    magic, version, code, ndim, _reserved = _HEADER.unpack_from(raw)
    if magic != _MAGIC:
        raise DtypeMismatch(
            f"key {index}: the block's metadata is not a tensor header (magic {magic!r}); it "
            "was not stored with put_tensors"
        )
    if version != TENSOR_META_VERSION:
        raise DtypeMismatch(
            f"key {index}: tensor header version {version} is not understood by this client "
            f"(version {TENSOR_META_VERSION}); upgrade kvstored"
        )
    name = _NAME_BY_CODE.get(code)
    if name is None:
        raise DtypeMismatch(f"key {index}: unknown dtype code {code} in the tensor header")
    if len(raw) != _HEADER.size + 8 * ndim:
        raise DtypeMismatch(
            f"key {index}: truncated tensor header ({len(raw)} bytes for ndim={ndim})"
        )
    shape = struct.unpack_from(f"<{ndim}Q", raw, _HEADER.size)
    return TensorMeta(name, tuple(int(d) for d in shape))


def tensor_bytes(tensor: torch.Tensor) -> np.ndarray:
    """A flat ``uint8`` numpy view of a contiguous CPU tensor's memory (no copy).

    Works for every dtype, including bfloat16 and float8 (the bytes are reinterpreted,
    never converted). Writes through the view change the tensor.

    Raises:
        InvalidArgument: the tensor is not a contiguous CPU tensor.
    """
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise InvalidArgument(
            f"tensor_bytes needs a contiguous CPU tensor; got device={tensor.device} "
            f"contiguous={tensor.is_contiguous()}"
        )
    return tensor.detach().reshape(-1).view(torch.uint8).numpy()


def _as_sendable(tensor: object, index: int) -> tuple[torch.Tensor, bytes]:
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgument(
            f"tensors[{index}] must be a torch.Tensor; got {type(tensor).__name__}"
        )
    meta = encode_tensor_meta(tensor.dtype, tensor.shape)
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")  # the one copy a device tensor needs
    if not t.is_contiguous():
        t = t.contiguous()
    return t, meta


def _prepare_put(
    keys: Sequence[bytes], tensors: Sequence[torch.Tensor]
) -> tuple[list[Any], list[bytes], list[torch.Tensor]]:
    if len(keys) != len(tensors):
        raise InvalidArgument(
            f"keys and tensors must have the same length; got {len(keys)} keys and "
            f"{len(tensors)} tensors"
        )
    values: list[Any] = []
    metas: list[bytes] = []
    keep: list[torch.Tensor] = []  # keeps staged copies alive during the call
    for i, tensor in enumerate(tensors):
        t, meta = _as_sendable(tensor, i)
        keep.append(t)
        values.append(tensor_bytes(t))
        metas.append(meta)
    return values, metas, keep


def put_tensors(
    client: Any, keys: Sequence[bytes], tensors: Sequence[torch.Tensor], *,
    replicas: int | None = None,
) -> list[PutResult]:
    """Store one tensor per key, with its dtype and shape in the block's metadata.

    A contiguous CPU tensor's memory is handed to the client as is (no copy here); other
    tensors are staged through one contiguous CPU copy.

    Args:
        client: a :class:`~kvstored.Client` (or anything with its ``put`` signature).
        keys: block hashes, one per tensor.
        tensors: tensors of any supported dtype (see :data:`DTYPE_CODES`) and shape.
        replicas: replicas wanted per block (``Client.put``'s ``replicas``; None = the
            client's or the node's default).

    Returns:
        One :class:`~kvstored.client.types.PutResult` per key (idempotent: a key already
        stored is a success with ``stored=False``; ``replicas_written`` / ``short``).

    Raises:
        InvalidArgument: lengths differ, a non-tensor, or an unsupported dtype. Client errors
        (Unavailable, DeadlineExceeded, Draining) as raised by ``client.put``.
    """
    values, metas, keep = _prepare_put(keys, tensors)
    results: list[PutResult] = (client.put(keys, values, metas=metas) if replicas is None
                                else client.put(keys, values, metas=metas, replicas=replicas))
    del keep
    return results


def _check(
    found: TensorMeta, index: int, dtype: torch.dtype | None, shape: Sequence[int] | None
) -> None:
    want_dtype = _dtype_name(dtype) if dtype is not None else found.dtype
    want_shape = tuple(int(d) for d in shape) if shape is not None else found.shape
    if found.dtype != want_dtype or found.shape != want_shape:
        raise DtypeMismatch(
            f"key {index}: expected dtype={want_dtype} shape={want_shape}; found {found}"
        )


def _tensor_from_block(
    block: Any, index: int, dtype: torch.dtype | None, shape: Sequence[int] | None
) -> torch.Tensor | None:
    if block is None:
        return None
    found = decode_tensor_meta(block.meta, index=index)
    _check(found, index, dtype, shape)
    tdtype = _torch_dtype(found.dtype)
    if tdtype is None:
        raise DtypeMismatch(f"key {index}: dtype {found.dtype} is not available in this torch")
    if len(block.value) != found.num_bytes:
        raise DtypeMismatch(
            f"key {index}: the block holds {len(block.value)} bytes but {found} needs "
            f"{found.num_bytes}"
        )
    out = torch.empty(found.shape, dtype=tdtype)
    if out.numel():
        np.copyto(tensor_bytes(out), np.frombuffer(block.value, dtype=np.uint8))
    return out


def get_tensors(
    client: Any,
    keys: Sequence[bytes],
    *,
    dtype: torch.dtype | None = None,
    shape: Sequence[int] | None = None,
) -> list[torch.Tensor | None]:
    """Read tensors stored with :func:`put_tensors` into new CPU tensors.

    Args:
        client: a :class:`~kvstored.Client` (anything with ``get_blocks``).
        keys: block hashes.
        dtype: when given, every block must hold this dtype.
        shape: when given, every block must hold this shape.

    Returns:
        Per key a new contiguous CPU tensor with the stored dtype and shape, or None on a miss.

    Raises:
        DtypeMismatch: a block's dtype or shape differs from ``dtype``/``shape`` (the message
        names the key index, expected and found), or it carries no valid tensor header.
        Client errors as raised by ``client.get_blocks``.
    """
    blocks = client.get_blocks(keys)
    return [_tensor_from_block(b, i, dtype, shape) for i, b in enumerate(blocks)]


def _prepare_into(
    keys: Sequence[bytes], out_tensors: Sequence[torch.Tensor]
) -> tuple[list[torch.Tensor], list[Any]]:
    if len(keys) != len(out_tensors):
        raise InvalidArgument(
            f"keys and out_tensors must have the same length; got {len(keys)} keys and "
            f"{len(out_tensors)} tensors"
        )
    targets: list[torch.Tensor] = []
    buffers: list[Any] = []
    for i, t in enumerate(out_tensors):
        if not isinstance(t, torch.Tensor):
            raise InvalidArgument(
                f"out_tensors[{i}] must be a torch.Tensor; got {type(t).__name__}"
            )
        _ = encode_tensor_meta(t.dtype, t.shape)  # validates the dtype early
        if t.device.type == "cpu" and t.is_contiguous():
            target = t
        else:  # one staging copy; pinned so the device copy can run asynchronously
            target = torch.empty(
                t.shape, dtype=t.dtype, pin_memory=t.device.type == "cuda"
            )
        targets.append(target)
        buffers.append(tensor_bytes(target))
    return targets, buffers


def _finish_into(
    results: Sequence[Any],
    keys: Sequence[bytes],
    targets: Sequence[torch.Tensor],
    out_tensors: Sequence[torch.Tensor],
) -> list[bool]:
    hits: list[bool] = []
    mismatches: list[str] = []
    for i, res in enumerate(results):
        if res is None:
            hits.append(False)
            continue
        num_bytes, meta = res
        t = out_tensors[i]
        try:
            found = decode_tensor_meta(meta, index=i)
            _check(found, i, t.dtype, t.shape)
        except DtypeMismatch as exc:
            mismatches.append(str(exc))
            hits.append(False)
            continue
        if num_bytes != t.numel() * t.element_size():
            mismatches.append(
                f"key {i}: the block holds {num_bytes} bytes but expected "
                f"{t.numel() * t.element_size()} for dtype={_dtype_name(t.dtype)} "
                f"shape={tuple(t.shape)}"
            )
            hits.append(False)
            continue
        hits.append(True)
    if mismatches:
        raise DtypeMismatch(
            "; ".join(mismatches)
            + " (the contents of those out_tensors are unspecified and must not be used)"
        )
    for i, (target, t) in enumerate(zip(targets, out_tensors, strict=True)):
        if hits[i] and target is not t:
            t.copy_(target, non_blocking=t.device.type == "cuda")
    return hits


def _mismatches(blocks: Sequence[Any], out_tensors: Sequence[torch.Tensor]) -> list[str]:
    """Describe each block whose tensor header does not match its out tensor."""
    problems = []
    for i, (block, t) in enumerate(zip(blocks, out_tensors, strict=True)):
        if block is None:
            continue
        try:
            _check(decode_tensor_meta(block.meta, index=i), i, t.dtype, t.shape)
        except DtypeMismatch as exc:
            problems.append(str(exc))
    return problems


def get_tensors_into(
    client: Any, keys: Sequence[bytes], out_tensors: Sequence[torch.Tensor]
) -> list[bool]:
    """Read tensors straight into preallocated tensors (no intermediate copy for CPU tensors).

    The client writes each block directly into the memory of ``out_tensors[i]`` when that
    tensor is contiguous and on the CPU; other tensors (CUDA, non-contiguous) receive it
    through one staging copy (pinned host memory for CUDA, copied with ``non_blocking``).

    Args:
        client: a :class:`~kvstored.Client` (anything with ``get_into(..., return_meta=True)``).
        keys: block hashes.
        out_tensors: one tensor per key; its dtype and shape are what the block must hold.

    Returns:
        Per key True on a hit (the tensor now holds the block), False on a miss (untouched
        for CPU-contiguous tensors).

    Raises:
        DtypeMismatch: a block's dtype, shape or size differs from its out tensor (every such
            key index is named with expected and found). The contents of those out tensors
            are unspecified then, and the other out tensors may or may not hold their blocks.
        InvalidArgument: lengths differ or a non-tensor/unsupported dtype.
        Client errors as raised by ``client.get_into``.
    """
    targets, buffers = _prepare_into(keys, out_tensors)
    try:
        results = client.get_into(keys, buffers, return_meta=True)
    except DtypeMismatch:
        raise
    except InvalidArgument as exc:
        if type(exc) is not InvalidArgument:  # KeyInvalid, NamespaceMismatch, ...
            raise
        # The client refused a buffer (smaller than its block): name the mismatching tensors.
        try:
            problems = _mismatches(client.get_blocks(keys), out_tensors)
        except Exception:  # the original error is the better report
            problems = []
        if problems:
            raise DtypeMismatch("; ".join(problems) + f" ({exc})") from None
        raise
    return _finish_into(results, keys, targets, out_tensors)


async def put_tensors_async(
    client: Any, keys: Sequence[bytes], tensors: Sequence[torch.Tensor], *,
    replicas: int | None = None,
) -> list[PutResult]:
    """:func:`put_tensors` for an :class:`~kvstored.AsyncClient` (``replicas`` as there)."""
    values, metas, keep = _prepare_put(keys, tensors)
    results: list[PutResult] = (await client.put(keys, values, metas=metas) if replicas is None
                                else await client.put(keys, values, metas=metas,
                                                      replicas=replicas))
    del keep
    return results


async def get_tensors_async(
    client: Any,
    keys: Sequence[bytes],
    *,
    dtype: torch.dtype | None = None,
    shape: Sequence[int] | None = None,
) -> list[torch.Tensor | None]:
    """:func:`get_tensors` for an :class:`~kvstored.AsyncClient`."""
    blocks = await client.get_blocks(keys)
    return [_tensor_from_block(b, i, dtype, shape) for i, b in enumerate(blocks)]


async def get_tensors_into_async(
    client: Any, keys: Sequence[bytes], out_tensors: Sequence[torch.Tensor]
) -> list[bool]:
    """:func:`get_tensors_into` for an :class:`~kvstored.AsyncClient`."""
    targets, buffers = _prepare_into(keys, out_tensors)
    try:
        results = await client.get_into(keys, buffers, return_meta=True)
    except DtypeMismatch:
        raise
    except InvalidArgument as exc:
        if type(exc) is not InvalidArgument:
            raise
        try:
            problems = _mismatches(await client.get_blocks(keys), out_tensors)
        except Exception:
            problems = []
        if problems:
            raise DtypeMismatch("; ".join(problems) + f" ({exc})") from None
        raise
    return _finish_into(results, keys, targets, out_tensors)
