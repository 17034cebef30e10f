"""The steps a client operation yields (see kvstored/client/_ops.py), and driving them.

Constants of the client's wire behaviour (chunking, timeouts, gRPC channel options) live here
too, so every module of the client shares one definition.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from google.protobuf.message import Message

from kvstored.client.types import NodeInfo
from kvstored.v1 import node_pb2 as pb

T = TypeVar("T")

SERVICE = "/kvstored.v1.NodeService/"
TRANSPORTS = ("auto", "shm", "tcp", "grpc")
PIN_CHUNK_KEYS = 1024
"""Most keys pinned by one PinBlocks (bounds the arena a reader holds at once)."""
MAX_CHUNK_BYTES = 256 << 20
"""Most payload bytes reserved by one ReservePut / data-plane PUT."""
INLINE_PUT_MAX_BYTES = 64 << 10
"""In tcp mode, batches up to this many bytes go inline over gRPC (no data-plane connection)."""
INITIAL_BACKOFF_S = 0.02
MAX_BACKOFF_S = 0.5
MAX_LEASE_S = 600.0
RELEASE_TIMEOUT_S = 5.0
"""Time a release/abort RPC is given; the caller waits for it only until its own deadline
(plus kvstored.client._orphans.PAST_DEADLINE_S), then it goes on in the background."""
PREFAULT_MAX_BYTES = 8 << 30
"""Arenas up to this size are prefaulted when mapped (MAP_POPULATE: no page faults in the
first copies); larger ones fault in lazily so that mapping stays fast."""

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
]
"""Options of a client's channel to its node: no message size limit, gRPC's own retries off
(kvstored/client/_ops.py retries what is safe to retry), and a reconnect backoff of at most
1 s. Not ``grpc.min_reconnect_backoff_ms``: gRPC core uses it as each attempt's connect
timeout (kvstored/transport/master_targets.py ``RECONNECT_BACKOFF_OPTIONS`` says why)."""


@dataclass(frozen=True, slots=True)
class Call:
    """A unary NodeService RPC step (see kvstored/client/_ops.py for ``undo`` and ``release``;
    ``trailer``: over the control channel, where the frame that follows an answer with
    ``grant_follows`` goes, later: kvstored/client/_control.py ``Trailer``)."""

    method: str
    request: Message
    response_cls: type[Message]
    undo: Callable[[Any], Call | None] | None = None
    release: bool = False
    trailer: Callable[[Any], None] | None = None


class _GrantingRequest(Protocol):
    """What every granting request (a :class:`Call` with ``undo``) carries."""

    session_id: int
    request_id: int


def grant_ids(step: Call) -> tuple[int, int]:
    """``(session_id, request_id)`` of a granting call's request: what an orphan ack names.

    Only for a :class:`Call` with ``undo`` (PinBlocks, ReservePut, ...), whose request
    messages all have both fields.
    """
    req = cast(_GrantingRequest, step.request)
    return req.session_id, req.request_id


@dataclass(frozen=True, slots=True)
class Blocking:
    """A blocking step: ``fn(deadline)``; ``num_bytes`` hints how much it copies."""

    fn: Callable[[float], Any]
    num_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Session:
    """This client's open session id (the driver opens the OpenSession stream if needed)."""


Op = Generator[Call | Blocking | Session, Any, T]

SESSION_METHOD = SERVICE + "OpenSession"


def abort_call(reservation_id: int) -> Call:
    """The CommitPut(abort) that releases a reservation (always sent, see ``release``)."""
    return Call(
        "CommitPut", pb.CommitPutRequest(reservation_id=reservation_id, abort=True),
        pb.CommitPutResponse, release=True,
    )


def release_call(pin_id: int) -> Call:
    """The ReleasePins that releases a pin (always sent, see ``release``)."""
    return Call("ReleasePins", pb.ReleasePinsRequest(pin_ids=[pin_id]), pb.ReleasePinsResponse,
                release=True)


def _undo_reserve(resp: pb.ReservePutResponse) -> Call | None:
    return abort_call(resp.reservation_id) if resp.reservation_id else None


def _undo_pin(resp: pb.PinBlocksResponse) -> Call | None:
    return release_call(resp.pin_id) if resp.pin_id else None



def lease_for(info: NodeInfo, deadline: float) -> float:
    """The lease to ask for: the node default, or longer when the caller's deadline is.

    The lease is a deadline for this client, not a safety margin: one that lapses mid-copy
    only quarantines the space on the node and the commit/read reports LeaseExpired.
    """
    return min(MAX_LEASE_S, max(info.pin_lease_s, deadline - time.monotonic()))



def drive_step(gen: Op[T], send_value: Any, throw_exc: BaseException | None) -> tuple[bool, Any]:
    """Advance an operation: ``(True, result)`` when it finished, else ``(False, next step)``."""
    try:
        if throw_exc is not None:
            step = gen.throw(throw_exc)
        else:
            step = gen.send(send_value)
    except StopIteration as stop:
        return True, stop.value
    return False, step
