"""The scheduler a daemon hosts, as ``kvstorectl scheduler`` shows it (the click command and
its tables are in kvstored/cli/scheduler.py), and an engine's registration with it
(:func:`register_engine`, used by the vLLM connector's ``scheduler_address``).

:func:`describe_scheduler` returns (JSON output, sorted keys)::

    {"policy", "admission", "profile", "uniform_decode_s", "num_admitted", "num_completed",
     "num_rejected": {reason: count},
     "instances": [{"instance_id", "node_id", "role", "load", "queued_prefill_s",
                    "num_running", "num_context_tokens", "num_incoming", "step_ms",
                    "last_seen_age_s"}]}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from kvstored.errors import Unavailable
from kvstored.rpc_status import error_from_rpc
from kvstored.security.tls import TlsFiles, open_channel
from kvstored.v1 import scheduler_pb2, scheduler_pb2_grpc

_ROLE_NAMES = {scheduler_pb2.INSTANCE_ROLE_PREFILL: "prefill",
               scheduler_pb2.INSTANCE_ROLE_DECODE: "decode"}
_ROLES = {v: k for k, v in _ROLE_NAMES.items()}


def engine_instance_ids(instance_id: str, roles: Sequence[str]) -> dict[str, str]:
    """``{role: instance id}`` of one engine: the prefill instance is ``instance_id``, the
    decode instance ``instance_id + "/decode"`` (an engine doing both registers twice).

    Raises:
        InvalidArgument: a role is neither ``prefill`` nor ``decode``, or none is given.
    """
    from kvstored.errors import InvalidArgument

    bad = [r for r in roles if r not in _ROLES]
    if bad or not roles:
        raise InvalidArgument(f"scheduler roles must be some of ['prefill', 'decode'], got "
                              f"{list(roles)}")
    return {r: instance_id if r == "prefill" else f"{instance_id}/decode" for r in roles}


def register_engine(address: str, instance_id: str, node_id: str, roles: Sequence[str], *,
                    timeout_s: float, tls: TlsFiles | None = None) -> dict[str, str]:
    """Register an engine's instances with the scheduler at ``address`` (idempotent).

    Args:
        address: the master hosting the SchedulerService (``HOST:PORT``).
        instance_id: the engine's name (see :func:`engine_instance_ids`).
        node_id: the kvstored node on the engine's host (its cache is the engine's local one).
        roles: ``prefill`` and/or ``decode``.
        timeout_s: deadline of each call, seconds.

    Returns:
        ``{role: instance id}`` registered.

    Raises:
        InvalidArgument: a bad role.
        KvstoredError: the call failed (mapped from the gRPC status; NotLeader names the
            leader).
    """
    ids = engine_instance_ids(instance_id, roles)
    with open_channel(address, tls) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        for role, iid in ids.items():
            try:
                stub.RegisterInstance(scheduler_pb2.RegisterInstanceRequest(
                    instance=scheduler_pb2.InstanceInfo(instance_id=iid, node_id=node_id,
                                                        role=_ROLES[role])), timeout=timeout_s)
            except grpc.RpcError as exc:
                raise error_from_rpc(exc) from None
    return ids


def unregister_engine(address: str, instance_ids: Sequence[str], *, timeout_s: float,
                      tls: TlsFiles | None = None) -> None:
    """Unregister instances (best effort: an unknown one or a failed call is ignored)."""
    with open_channel(address, tls) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        for iid in instance_ids:
            try:
                stub.UnregisterInstance(scheduler_pb2.UnregisterInstanceRequest(
                    instance_id=iid), timeout=timeout_s)
            except grpc.RpcError:
                pass


def describe_scheduler(address: str, timeout_s: float, tls: TlsFiles | None = None) -> dict[str, Any]:
    """Fetch the scheduler's state as a JSON-able dict (see the module doc); ``tls``: mutual
    TLS to a HOST:PORT address (None = plaintext).

    Raises:
        Unavailable: the address cannot be reached or hosts no scheduler.
        KvstoredError: any other failure, mapped from the gRPC status.
    """
    with open_channel(address, tls) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        try:
            resp = stub.DescribeScheduler(scheduler_pb2.DescribeSchedulerRequest(),
                                          timeout=timeout_s)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise Unavailable(f"{address} hosts no scheduler service") from None
            raise error_from_rpc(exc) from None
    return {
        "policy": resp.policy,
        "admission": resp.admission,
        "profile": resp.profile,
        "uniform_decode_s": round(resp.uniform_decode_s, 3),
        "num_admitted": resp.num_admitted,
        "num_completed": resp.num_completed,
        "num_rejected": dict(sorted(resp.num_rejected.items())),
        "instances": [
            {
                "instance_id": st.instance.instance_id,
                "node_id": st.instance.node_id,
                "role": _ROLE_NAMES.get(st.instance.role, "unspecified"),
                "load": round(st.load, 4),
                "queued_prefill_s": st.queued_prefill_ms / 1000.0,
                "num_running": st.num_running_requests,
                "num_context_tokens": st.num_context_tokens,
                "num_incoming": st.num_incoming_requests,
                "step_ms": round(st.step_time_us / 1000.0, 3),
                "last_seen_age_s": st.last_seen_age_ms / 1000.0,
            }
            for st in resp.instances
        ],
    }


def report_prefill_queue(address: str, instance_id: str, queued_s: float, *, timeout_s: float,
                         tls: TlsFiles | None = None) -> None:
    """Report a prefill instance's queued work, seconds (``ReportLoad.queued_prefill_ms``).

    Raises:
        KvstoredError: the call failed (NotFound: the instance is not registered).
    """
    with open_channel(address, tls) as channel:
        try:
            scheduler_pb2_grpc.SchedulerServiceStub(channel).ReportLoad(
                scheduler_pb2.ReportLoadRequest(instance_id=instance_id,
                                                queued_prefill_ms=round(queued_s * 1000)),
                timeout=timeout_s)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None


def schedule(address: str, request_id: str, keys: Sequence[bytes], input_tokens: int, *,
             namespace_id: bytes = b"", keys_per_block: int = 1, copy_wait_s: float = 0.0,
             timeout_s: float, tls: TlsFiles | None = None) -> scheduler_pb2.ScheduleResponse:
    """Ask the scheduler to place one request (``Schedule``), waiting up to ``copy_wait_s``
    seconds for the copy it plans to end.

    Args:
        keys: the prompt's block keys in prefix order (block-major when ``keys_per_block``
            > 1: each block's keys together).
        input_tokens: the prompt's length.
        namespace_id: the keys' stored namespace id (the master's index is per namespace).

    Returns:
        The decision (``admitted``, ``prefill_instance_id``, ``prefix_node_id``,
        ``replicate_block_keys``, ``copy_state``, ``copied_blocks``, predictions).

    Raises:
        KvstoredError: the call failed (InvalidArgument: bad keys; NotLeader: a follower).
    """
    with open_channel(address, tls) as channel:
        try:
            return scheduler_pb2_grpc.SchedulerServiceStub(channel).Schedule(
                scheduler_pb2.ScheduleRequest(
                    request_id=request_id, block_keys=list(keys), input_tokens=input_tokens,
                    namespace_id=namespace_id, keys_per_block=keys_per_block,
                    copy_wait_ms=round(copy_wait_s * 1000)),
                timeout=timeout_s + copy_wait_s)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
