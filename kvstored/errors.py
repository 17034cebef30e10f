"""The KvstoredError hierarchy and its wire mapping.

Each subclass has a class-level ``code`` (an :class:`ErrorCode`, mirrored from
``protos/kvstored/v1/common.proto``), ``retriable`` and ``grpc_status``. The servicer turns a
KvstoredError into a gRPC status whose trailing metadata carries ``kvstored-error-code``; the
client maps it back with :func:`error_from_code`. A miss is never an error.
"""

from __future__ import annotations

from enum import IntEnum

import grpc


class ErrorCode(IntEnum):
    """Mirror of ``kvstored.v1.ErrorCode``; values grouped by area."""

    OK = 0
    INVALID_ARGUMENT = 100
    KEY_INVALID = 101
    BLOCK_TOO_LARGE = 102
    NAMESPACE_MISMATCH = 103
    BATCH_TOO_LARGE = 104
    DTYPE_MISMATCH = 105
    NO_CAPACITY = 200
    NOT_FOUND = 300
    REPLICA_NOT_READY = 301
    LEASE_EXPIRED = 302
    ALREADY_EXISTS = 303
    TRANSFER_FAILED = 400
    UNAVAILABLE = 500
    DEADLINE_EXCEEDED = 501
    DRAINING = 502
    INTERNAL = 503
    STORAGE_IO = 600
    CHECKSUM_MISMATCH = 601
    CONFIG_INVALID = 700


class KvstoredError(Exception):
    """Root of every error kvstored raises on purpose."""

    code: ErrorCode = ErrorCode.INTERNAL
    retriable: bool = False
    grpc_status: grpc.StatusCode = grpc.StatusCode.INTERNAL


class InvalidArgument(KvstoredError, ValueError):
    """Bad input: the message says what was wrong, what was received, and what fixes it."""

    code = ErrorCode.INVALID_ARGUMENT
    grpc_status = grpc.StatusCode.INVALID_ARGUMENT


class KeyInvalid(InvalidArgument):
    """A block key is empty, too short or too long."""

    code = ErrorCode.KEY_INVALID


class BlockTooLarge(InvalidArgument):
    """A block is larger than ``max_block_bytes``."""

    code = ErrorCode.BLOCK_TOO_LARGE


class NamespaceMismatch(InvalidArgument):
    """The block was stored under another namespace than the reader's."""

    code = ErrorCode.NAMESPACE_MISMATCH


class BatchTooLarge(InvalidArgument):
    """More keys in one call than ``max_batch_keys``."""

    code = ErrorCode.BATCH_TOO_LARGE


class DtypeMismatch(InvalidArgument):
    """A tensor get found another dtype or shape than the caller expects."""

    code = ErrorCode.DTYPE_MISMATCH


class NoCapacity(KvstoredError):
    """No tier could make room (everything is pinned or the block exceeds the tier)."""

    code = ErrorCode.NO_CAPACITY
    retriable = True
    grpc_status = grpc.StatusCode.RESOURCE_EXHAUSTED


class NotFound(KvstoredError):
    """A referenced reservation or pin does not exist (not a block miss)."""

    code = ErrorCode.NOT_FOUND
    grpc_status = grpc.StatusCode.NOT_FOUND


class ReplicaNotReady(KvstoredError):
    """The replica is still being written (the master refuses a second put of a block being written)."""

    code = ErrorCode.REPLICA_NOT_READY
    retriable = True
    grpc_status = grpc.StatusCode.UNAVAILABLE


class LeaseExpired(KvstoredError):
    """A pin or reservation outlived its lease and was reclaimed."""

    code = ErrorCode.LEASE_EXPIRED
    grpc_status = grpc.StatusCode.FAILED_PRECONDITION


class AlreadyExists(KvstoredError):
    """The name is taken, e.g. a node id a live daemon of another address registered."""

    code = ErrorCode.ALREADY_EXISTS
    grpc_status = grpc.StatusCode.ALREADY_EXISTS


class TransferFailed(KvstoredError):
    """A data-plane transfer failed; the engine should treat the blocks as misses."""

    code = ErrorCode.TRANSFER_FAILED
    retriable = True
    grpc_status = grpc.StatusCode.UNAVAILABLE


class Unavailable(KvstoredError):
    """The daemon could not be reached within the deadline; retriable."""

    code = ErrorCode.UNAVAILABLE
    retriable = True
    grpc_status = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(KvstoredError):
    """The call did not finish within its deadline; retriable."""

    code = ErrorCode.DEADLINE_EXCEEDED
    retriable = True
    grpc_status = grpc.StatusCode.DEADLINE_EXCEEDED


class Draining(KvstoredError):
    """The daemon is shutting down and refuses new puts; retriable elsewhere or later."""

    code = ErrorCode.DRAINING
    retriable = True
    grpc_status = grpc.StatusCode.UNAVAILABLE


class InternalError(KvstoredError):
    """A bug or an unexpected server-side failure."""

    code = ErrorCode.INTERNAL


class StorageIOError(KvstoredError):
    """A tier's device failed (ENOSPC, EIO); the block was not stored."""

    code = ErrorCode.STORAGE_IO
    retriable = True
    grpc_status = grpc.StatusCode.UNAVAILABLE


class ChecksumMismatch(KvstoredError):
    """Stored bytes failed their checksum; the block was dropped (a miss)."""

    code = ErrorCode.CHECKSUM_MISMATCH
    grpc_status = grpc.StatusCode.DATA_LOSS


class ConfigInvalid(KvstoredError):
    """A configuration file, env var or flag is invalid; the message names the key."""

    code = ErrorCode.CONFIG_INVALID
    grpc_status = grpc.StatusCode.INVALID_ARGUMENT


_BY_CODE: dict[ErrorCode, type[KvstoredError]] = {}
for _cls in (
    InvalidArgument, KeyInvalid, BlockTooLarge, NamespaceMismatch, BatchTooLarge, DtypeMismatch,
    NoCapacity, NotFound, ReplicaNotReady, LeaseExpired, AlreadyExists, TransferFailed, Unavailable,
    DeadlineExceeded, Draining, InternalError, StorageIOError, ChecksumMismatch, ConfigInvalid,
):
    _BY_CODE[_cls.code] = _cls

ERROR_CODE_METADATA_KEY = "kvstored-error-code"


def error_class(code: int) -> type[KvstoredError]:
    """The exception class for a wire error code (unknown codes map to InternalError)."""
    try:
        return _BY_CODE[ErrorCode(code)]
    except ValueError:
        return InternalError


def error_from_code(code: int, message: str) -> KvstoredError:
    """Build the exception for a wire error code and message."""
    return error_class(code)(message)


_GRPC_FALLBACK: dict[grpc.StatusCode, type[KvstoredError]] = {
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.RESOURCE_EXHAUSTED: NoCapacity,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.DATA_LOSS: ChecksumMismatch,
}


def error_from_rpc(exc: grpc.RpcError) -> KvstoredError:
    """Map a failed gRPC call to a KvstoredError (trailing metadata first, status second)."""
    code_fn = getattr(exc, "code", None)
    status = code_fn() if callable(code_fn) else grpc.StatusCode.UNKNOWN
    details_fn = getattr(exc, "details", None)
    details = (details_fn() if callable(details_fn) else None) or str(status)
    trailing_fn = getattr(exc, "trailing_metadata", None)
    trailing = trailing_fn() if callable(trailing_fn) else None
    for key, value in trailing or ():
        if key == ERROR_CODE_METADATA_KEY:
            try:
                return error_from_code(int(value), details)
            except ValueError:
                break
    if status == grpc.StatusCode.UNIMPLEMENTED:
        # the address answers gRPC but is another kind of server (e.g. a master asked for a
        # node's method, or the reverse)
        return InvalidArgument(  # not retriable: the address is wrong, not busy
            f"UNIMPLEMENTED: {details}: the server at this address does not offer this call; "
            "is it the other kind of kvstored process (a master where a node is expected, or "
            "a node where a master is expected)?"
        )
    return _GRPC_FALLBACK.get(status, InternalError)(f"{status.name}: {details}")
