"""The scheduler a daemon hosts, as ``kvstorectl scheduler`` shows it (the click command and
its tables are in kvstored/cli/scheduler.py).

:func:`describe_scheduler` returns (JSON output, sorted keys)::

    {"policy", "admission", "profile", "uniform_decode_s", "num_admitted", "num_completed",
     "num_rejected": {reason: count},
     "instances": [{"instance_id", "node_id", "role", "load", "queued_prefill_s",
                    "num_running", "num_context_tokens", "num_incoming", "step_ms",
                    "last_seen_age_s"}]}
"""

from __future__ import annotations

from typing import Any

import grpc

from kvstored.errors import Unavailable
from kvstored.rpc_status import error_from_rpc
from kvstored.security.tls import TlsFiles, open_channel
from kvstored.v1 import scheduler_pb2, scheduler_pb2_grpc

_ROLE_NAMES = {scheduler_pb2.INSTANCE_ROLE_PREFILL: "prefill",
               scheduler_pb2.INSTANCE_ROLE_DECODE: "decode"}


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
