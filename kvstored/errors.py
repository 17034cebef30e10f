"""The KvstoredError hierarchy and the ErrorCode table (a leaf: no gRPC, no I/O).

Each subclass has a class-level ``code`` (an :class:`ErrorCode`, mirrored from
``protos/kvstored/v1/common.proto``) and ``retriable``. The gRPC status each code travels as,
and the way back from a failed call, live in :mod:`kvstored.rpc_status`; the wire code alone
maps back through :func:`error_from_code`. A miss is never an error.
"""

from __future__ import annotations

from enum import IntEnum


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
    TENANT_QUOTA_EXCEEDED = 201
    NOT_FOUND = 300
    REPLICA_NOT_READY = 301
    LEASE_EXPIRED = 302
    ALREADY_EXISTS = 303
    TRANSFER_FAILED = 400
    UNAVAILABLE = 500
    DEADLINE_EXCEEDED = 501
    DRAINING = 502
    INTERNAL = 503
    NOT_LEADER = 504
    STALE_TERM = 505
    STORAGE_IO = 600
    CHECKSUM_MISMATCH = 601
    CONFIG_INVALID = 700
    UNAUTHENTICATED = 800
    PERMISSION_DENIED = 801


class KvstoredError(Exception):
    """Root of every error kvstored raises on purpose."""

    code: ErrorCode = ErrorCode.INTERNAL
    retriable: bool = False


class InvalidArgument(KvstoredError, ValueError):
    """Bad input: the message says what was wrong, what was received, and what fixes it."""

    code = ErrorCode.INVALID_ARGUMENT


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


class NotFound(KvstoredError):
    """A referenced reservation or pin does not exist (not a block miss)."""

    code = ErrorCode.NOT_FOUND


class ReplicaNotReady(KvstoredError):
    """The replica is still being written (the master refuses a second put of a block being written)."""

    code = ErrorCode.REPLICA_NOT_READY
    retriable = True


class LeaseExpired(KvstoredError):
    """A pin or reservation outlived its lease and was reclaimed."""

    code = ErrorCode.LEASE_EXPIRED


class AlreadyExists(KvstoredError):
    """The name is taken, e.g. a node id a live daemon of another address registered."""

    code = ErrorCode.ALREADY_EXISTS


class TransferFailed(KvstoredError):
    """A data-plane transfer failed; the engine should treat the blocks as misses."""

    code = ErrorCode.TRANSFER_FAILED
    retriable = True


class Unavailable(KvstoredError):
    """The daemon could not be reached within the deadline; retriable."""

    code = ErrorCode.UNAVAILABLE
    retriable = True


class DeadlineExceeded(KvstoredError):
    """The call did not finish within its deadline; retriable."""

    code = ErrorCode.DEADLINE_EXCEEDED
    retriable = True


class Draining(KvstoredError):
    """The daemon is shutting down and refuses new puts; retriable elsewhere or later."""

    code = ErrorCode.DRAINING
    retriable = True


class InternalError(KvstoredError):
    """A bug or an unexpected server-side failure."""

    code = ErrorCode.INTERNAL


class StorageIOError(KvstoredError):
    """A tier's device failed (ENOSPC, EIO); the block was not stored."""

    code = ErrorCode.STORAGE_IO
    retriable = True


class ChecksumMismatch(KvstoredError):
    """Stored bytes failed their checksum; the block was dropped (a miss)."""

    code = ErrorCode.CHECKSUM_MISMATCH


class ConfigInvalid(KvstoredError):
    """A configuration file, env var or flag is invalid; the message names the key."""

    code = ErrorCode.CONFIG_INVALID


class TenantQuotaExceeded(NoCapacity):
    """A put would take a tenant past its DRAM or SSD quota; nothing of another tenant is evicted for it."""

    code = ErrorCode.TENANT_QUOTA_EXCEEDED


class NotLeader(Unavailable):
    """This master is not the leader (a follower, or a leader that lost etcd); retriable at the leader."""

    code = ErrorCode.NOT_LEADER


class StaleTerm(KvstoredError):
    """An answer or command from a master term older than the newest one the receiver has seen."""

    code = ErrorCode.STALE_TERM


class Unauthenticated(KvstoredError):
    """The caller presented no valid credential (no client certificate, wrong CA, expired)."""

    code = ErrorCode.UNAUTHENTICATED


class PermissionDenied(KvstoredError):
    """The caller's role or tenant does not allow this operation; the message names both."""

    code = ErrorCode.PERMISSION_DENIED


_BY_CODE: dict[ErrorCode, type[KvstoredError]] = {}
for _cls in (
    InvalidArgument, KeyInvalid, BlockTooLarge, NamespaceMismatch, BatchTooLarge, DtypeMismatch,
    NoCapacity, NotFound, ReplicaNotReady, LeaseExpired, AlreadyExists, TransferFailed, Unavailable,
    DeadlineExceeded, Draining, InternalError, StorageIOError, ChecksumMismatch, ConfigInvalid,
    TenantQuotaExceeded, NotLeader, StaleTerm, Unauthenticated, PermissionDenied,
):
    _BY_CODE[_cls.code] = _cls


def error_class(code: int) -> type[KvstoredError]:
    """The exception class for a wire error code (unknown codes map to InternalError)."""
    try:
        return _BY_CODE[ErrorCode(code)]
    except ValueError:
        return InternalError


def error_from_code(code: int, message: str) -> KvstoredError:
    """Build the exception for a wire error code and message."""
    return error_class(code)(message)

