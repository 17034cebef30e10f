"""``kvstorectl scheduler``: instances and loads of the scheduler a daemon hosts.

Registered by kvstored/cli/kvstorectl.py (lazy command); the data comes from
:func:`kvstored.scheduler.ctl.describe_scheduler` (its JSON shape is documented there). Exit
codes as kvstorectl's (kvstored/cli/ctl_common.py): 3 unreachable (or no scheduler hosted
there), 4 server error.
"""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from kvstored.addresses import default_address
from kvstored.cli import output
from kvstored.cli.ctl_common import EXIT_SERVER_ERROR, EXIT_UNREACHABLE, common_options
from kvstored.errors import DeadlineExceeded, KvstoredError, Unavailable
from kvstored.scheduler.ctl import describe_scheduler


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


@click.command("scheduler")
@common_options
@click.pass_context
def scheduler(ctx: click.Context) -> None:
    """Scheduler policy, counters, and every instance with its load."""
    obj = ctx.obj
    out = getattr(obj, "output", "table")
    address = getattr(obj, "address", None) or default_address()
    try:
        data = describe_scheduler(address, getattr(obj, "timeout_s", 5.0), getattr(obj, "tls", None))
    except (Unavailable, DeadlineExceeded) as exc:
        output.emit_error(out, exc.code.name, str(exc))
        ctx.exit(EXIT_UNREACHABLE)
    except KvstoredError as exc:
        output.emit_error(out, exc.code.name, str(exc))
        ctx.exit(EXIT_SERVER_ERROR)
    output.emit(out, data, _tables)
