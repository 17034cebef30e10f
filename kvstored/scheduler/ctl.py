"""``kvstorectl scheduler``: instances and loads of the scheduler a daemon hosts.

Registered by kvstored/cli/kvstorectl.py (lazy command). Expects ``ctx.obj`` to have
``.address: str | None`` (None = ``$KVSTORED_ADDRESS`` or the local unix socket),
``.timeout_s: float`` and ``.output: "table" | "json"``.

JSON output (sorted keys)::

    {"policy", "admission", "profile", "uniform_decode_s", "num_admitted", "num_completed",
     "num_rejected": {reason: count},
     "instances": [{"instance_id", "node_id", "role", "load", "queued_prefill_s",
                    "num_running", "num_context_tokens", "num_incoming", "step_ms",
                    "last_seen_age_s"}]}

Exit codes as kvstorectl: 3 unreachable (or no scheduler hosted there), 4 server error.
"""

from __future__ import annotations

from typing import Any

import click
import grpc
from rich.table import Table

from kvstored.errors import Unavailable
from kvstored.rpc_status import error_from_rpc
from kvstored.v1 import scheduler_pb2, scheduler_pb2_grpc

_ROLE_NAMES = {scheduler_pb2.INSTANCE_ROLE_PREFILL: "prefill",
               scheduler_pb2.INSTANCE_ROLE_DECODE: "decode"}


def describe_scheduler(address: str, timeout_s: float) -> dict[str, Any]:
    """Fetch the scheduler's state as a JSON-able dict (see the module doc).

    Raises:
        Unavailable: the address cannot be reached or hosts no scheduler.
        KvstoredError: any other failure, mapped from the gRPC status.
    """
    with grpc.insecure_channel(address) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        try:
            resp = stub.DescribeScheduler(scheduler_pb2.DescribeSchedulerRequest(),
                                          timeout=timeout_s)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:  # type: ignore[attr-defined]
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


def _tables(data: dict[str, Any]) -> list[Table]:
    summary = Table(title="scheduler", show_header=False, title_justify="left")
    summary.add_column("field", style="bold")
    summary.add_column("value")
    rejected = ", ".join(f"{k}={v}" for k, v in data["num_rejected"].items() if v) or "0"
    for k, v in (("policy", data["policy"]), ("admission", data["admission"]),
                 ("profile", data["profile"]), ("admitted", data["num_admitted"]),
                 ("completed", data["num_completed"]), ("rejected", rejected),
                 ("uniform decode time (s)", data["uniform_decode_s"])):
        summary.add_row(k, str(v))
    inst = Table(title="instances", title_justify="left")
    for col in ("instance", "node", "role", "load", "queue (s)", "running", "context tokens",
                "incoming", "step (ms)", "seen (s ago)"):
        inst.add_column(col, justify="left" if col in ("instance", "node", "role") else "right")
    for i in data["instances"]:
        prefill = i["role"] == "prefill"
        inst.add_row(
            i["instance_id"], i["node_id"], i["role"], f"{i['load']:.2f}",
            f"{i['queued_prefill_s']:.2f}" if prefill else "",
            "" if prefill else str(i["num_running"]),
            "" if prefill else str(i["num_context_tokens"]),
            "" if prefill else str(i["num_incoming"]),
            "" if prefill else f"{i['step_ms']:.1f}",
            f"{i['last_seen_age_s']:.1f}",
        )
    return [summary, inst]


def _common_options(fn: Any) -> Any:
    """kvstorectl's ``--address/--timeout-s/--output`` after the command name, when available."""
    try:
        from kvstored.cli.kvstorectl import _common_options as common
    except ImportError:  # kvstorectl not installed: the command still works with ctx.obj
        return fn
    return common(fn)


@click.command("scheduler")
@_common_options
@click.pass_context
def scheduler(ctx: click.Context) -> None:
    """Scheduler policy, counters, and every instance with its load."""
    from kvstored.cli import output
    from kvstored.cli.kvstorectl import EXIT_SERVER_ERROR, EXIT_UNREACHABLE
    from kvstored.addresses import default_address
    from kvstored.errors import DeadlineExceeded, KvstoredError

    obj = ctx.obj
    out = getattr(obj, "output", "table")
    address = getattr(obj, "address", None) or default_address()
    try:
        data = describe_scheduler(address, getattr(obj, "timeout_s", 5.0))
    except (Unavailable, DeadlineExceeded) as exc:
        output.emit_error(out, exc.code.name, str(exc))
        ctx.exit(EXIT_UNREACHABLE)
    except KvstoredError as exc:
        output.emit_error(out, exc.code.name, str(exc))
        ctx.exit(EXIT_SERVER_ERROR)
    output.emit(out, data, _tables)
