"""The gRPC side of the error model: ErrorCode <-> gRPC status, in one table.

A servicer turns a :class:`~kvstored.errors.KvstoredError` into the gRPC status
:func:`grpc_status` names, with the error's code in the trailing metadata under
:data:`ERROR_CODE_METADATA_KEY` (:func:`grpc_trailing_metadata`). A client maps a failed call
back with :func:`error_from_rpc`: the code in the metadata first; without one (a proxy, a
server that is not kvstored, a transport failure) the gRPC status alone picks the class
(:data:`_ERROR_BY_STATUS`). Kept apart from :mod:`kvstored.errors` so the error hierarchy, a
leaf every layer imports, does not load gRPC.
"""

from __future__ import annotations

import grpc

from kvstored.errors import (
    AlreadyExists,
    ChecksumMismatch,
    DeadlineExceeded,
    ErrorCode,
    InternalError,
    InvalidArgument,
    KvstoredError,
    NoCapacity,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    error_from_code,
)

ERROR_CODE_METADATA_KEY = "kvstored-error-code"

_S = grpc.StatusCode
GRPC_STATUS_BY_CODE: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.INVALID_ARGUMENT: _S.INVALID_ARGUMENT,
    ErrorCode.KEY_INVALID: _S.INVALID_ARGUMENT,
    ErrorCode.BLOCK_TOO_LARGE: _S.INVALID_ARGUMENT,
    ErrorCode.NAMESPACE_MISMATCH: _S.INVALID_ARGUMENT,
    ErrorCode.BATCH_TOO_LARGE: _S.INVALID_ARGUMENT,
    ErrorCode.DTYPE_MISMATCH: _S.INVALID_ARGUMENT,
    ErrorCode.NO_CAPACITY: _S.RESOURCE_EXHAUSTED,
    ErrorCode.NOT_FOUND: _S.NOT_FOUND,
    ErrorCode.REPLICA_NOT_READY: _S.UNAVAILABLE,
    ErrorCode.LEASE_EXPIRED: _S.FAILED_PRECONDITION,
    ErrorCode.ALREADY_EXISTS: _S.ALREADY_EXISTS,
    ErrorCode.TRANSFER_FAILED: _S.UNAVAILABLE,
    ErrorCode.UNAVAILABLE: _S.UNAVAILABLE,
    ErrorCode.DEADLINE_EXCEEDED: _S.DEADLINE_EXCEEDED,
    ErrorCode.DRAINING: _S.UNAVAILABLE,
    ErrorCode.INTERNAL: _S.INTERNAL,
    ErrorCode.STORAGE_IO: _S.UNAVAILABLE,
    ErrorCode.CHECKSUM_MISMATCH: _S.DATA_LOSS,
    ErrorCode.CONFIG_INVALID: _S.INVALID_ARGUMENT,
    ErrorCode.TENANT_QUOTA_EXCEEDED: _S.RESOURCE_EXHAUSTED,
    ErrorCode.NOT_LEADER: _S.UNAVAILABLE,
    ErrorCode.STALE_TERM: _S.FAILED_PRECONDITION,
    ErrorCode.UNAUTHENTICATED: _S.UNAUTHENTICATED,
    ErrorCode.PERMISSION_DENIED: _S.PERMISSION_DENIED,
}
"""The gRPC status a servicer answers for each ErrorCode (codes missing here: INTERNAL)."""

# the way back for a status that came without kvstored's metadata (anything else: InternalError)
_ERROR_BY_STATUS: dict[grpc.StatusCode, type[KvstoredError]] = {
    _S.UNAVAILABLE: Unavailable,
    _S.DEADLINE_EXCEEDED: DeadlineExceeded,
    _S.INVALID_ARGUMENT: InvalidArgument,
    _S.RESOURCE_EXHAUSTED: NoCapacity,
    _S.NOT_FOUND: NotFound,
    _S.ALREADY_EXISTS: AlreadyExists,
    _S.DATA_LOSS: ChecksumMismatch,
    _S.UNAUTHENTICATED: Unauthenticated,
    _S.PERMISSION_DENIED: PermissionDenied,
}


def grpc_status(err: KvstoredError) -> grpc.StatusCode:
    """The gRPC status a servicer answers ``err`` with (by its ``code``; INTERNAL if unlisted)."""
    return GRPC_STATUS_BY_CODE.get(err.code, _S.INTERNAL)


def grpc_trailing_metadata(err: KvstoredError) -> tuple[tuple[str, str], ...]:
    """Trailing metadata carrying a KvstoredError's code (``((key, "<int code>"),)``)."""
    return ((ERROR_CODE_METADATA_KEY, str(int(err.code))),)


def error_from_rpc(exc: grpc.RpcError) -> KvstoredError:
    """Map a failed gRPC call to a KvstoredError (trailing metadata first, status second).

    Never raises: an unknown code or status becomes :class:`~kvstored.errors.InternalError`;
    UNIMPLEMENTED (the address serves another kind of kvstored process) becomes a
    non-retriable :class:`~kvstored.errors.InvalidArgument` saying so.
    """
    code_fn = getattr(exc, "code", None)
    status = code_fn() if callable(code_fn) else _S.UNKNOWN
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
    if status == _S.UNIMPLEMENTED:
        # the address answers gRPC but is another kind of server (e.g. a master asked for a
        # node's method, or the reverse)
        return InvalidArgument(  # not retriable: the address is wrong, not busy
            f"UNIMPLEMENTED: {details}: the server at this address does not offer this call; "
            "is it the other kind of kvstored process (a master where a node is expected, or "
            "a node where a master is expected)?"
        )
    return _ERROR_BY_STATUS.get(status, InternalError)(f"{status.name}: {details}")


def no_answer_error(exc: grpc.RpcError, server: str, method: str,
                    timeout_s: float | None) -> Unavailable | None:
    """A call the server never answered, as the retryable :class:`Unavailable` it is.

    gRPC reports a call whose deadline passed with no answer at all (the server SIGSTOPped,
    wedged, overloaded, or cut off behind a firewall that drops packets) as
    DEADLINE_EXCEEDED, with no kvstored error code; to the caller that is "nobody
    answered": retry, or try another server. A DeadlineExceeded the server itself answered
    (it carries kvstored's code) is left to :func:`error_from_rpc`.

    Args:
        exc: the failed call.
        server: who was asked, for the message (e.g. ``"master at 127.0.0.1:7080"``).
        method: the RPC's name, for the message.
        timeout_s: the call's deadline in seconds (None: not known).

    Returns:
        ``Unavailable("<server> did not answer <method> within <N> ms ...")``, or None when
        ``exc`` is any other failure.
    """
    code_fn = getattr(exc, "code", None)
    if not callable(code_fn) or code_fn() != _S.DEADLINE_EXCEEDED:
        return None
    trailing_fn = getattr(exc, "trailing_metadata", None)
    trailing = trailing_fn() if callable(trailing_fn) else None
    if any(key == ERROR_CODE_METADATA_KEY for key, _ in trailing or ()):
        return None  # the server answered it: its own DeadlineExceeded
    within = f" within {round(timeout_s * 1000)} ms" if timeout_s else ""
    return Unavailable(f"{server} did not answer {method}{within} (the process may be "
                       "stopped, overloaded or cut off); the call may be retried")
