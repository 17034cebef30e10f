"""``kvstorectl events``: tail the master's KV events (vLLM's format; docs/cluster.md).

Registered by kvstored/cli/kvstorectl.py (lazy command). One line per event: a table row
for people, or a JSON object per line (``--output json``: ``seq``, ``ts``, then the event as
:func:`kvstored.kv_events.event_to_dict` writes it). Exit codes as kvstorectl's
(kvstored/cli/ctl_common.py): 2 bad arguments, 3 replay unreachable.
"""

from __future__ import annotations

import json

import click

from kvstored.cli import output
from kvstored.cli.ctl_common import EXIT_UNREACHABLE
from kvstored.client.events import EventSubscriber
from kvstored.errors import DeadlineExceeded, InvalidArgument
from kvstored.kv_events import event_to_dict

_ROW = "{:>6}  {:<16}  {:<12}  {:<5}  {:<8}  {:>6}  {}"


def _row(seq: int, ev: dict[str, object]) -> str:
    keys = ev.get("block_hashes") or []
    assert isinstance(keys, list)
    first = f"{str(keys[0])[:16]}" + (" ..." if len(keys) > 1 else "") if keys else ""
    return _ROW.format(seq, str(ev["type"]), str(ev.get("node_id") or ""),
                       str(ev.get("tier") or ""), str(ev.get("medium") or ""),
                       len(keys) if keys else "", first)


@click.command("events")
@click.option("--endpoint", required=True, metavar="tcp://HOST:PORT",
              help="The master's events_endpoint (ZeroMQ PUB).")
@click.option("--replay-endpoint", default=None, metavar="tcp://HOST:PORT",
              help="The master's events_replay_endpoint: fills gaps, and --from-seq.")
@click.option("--from-seq", type=click.IntRange(min=0), default=None,
              help="Replay buffered batches from this seq first (needs --replay-endpoint).")
@click.option("--count", "num_batches", type=click.IntRange(min=1), default=None,
              help="Stop after this many batches (default: follow until interrupted).")
@click.option("--idle-timeout-s", type=click.FloatRange(min=0.001), default=None,
              help="Stop when no batch came for this long, seconds.")
@click.pass_context
def events(ctx: click.Context, endpoint: str, replay_endpoint: str | None,
           from_seq: int | None, num_batches: int | None, idle_timeout_s: float | None) -> None:
    """Tail the KV events the leading master publishes (BlockStored / BlockRemoved /
    AllBlocksCleared, one line per event)."""
    out = getattr(ctx.obj, "output", "table")
    if from_seq is not None and not replay_endpoint:
        raise click.UsageError("--from-seq needs --replay-endpoint")
    try:
        with EventSubscriber(endpoint, replay_endpoint) as sub:
            if out != "json":
                click.echo(_ROW.format("seq", "type", "node", "tier", "medium", "blocks",
                                       "first key"))
            for seq, batch in sub.batches(from_seq=from_seq, count=num_batches,
                                          timeout_s=idle_timeout_s):
                for ev in batch.events:
                    d = event_to_dict(ev)
                    if out == "json":
                        click.echo(json.dumps({"seq": seq, "ts": batch.ts, **d}))
                    else:
                        click.echo(_row(seq, d))
    except InvalidArgument as exc:
        raise click.UsageError(str(exc)) from None
    except DeadlineExceeded as exc:
        output.emit_error(out, exc.code.name, str(exc))
        ctx.exit(EXIT_UNREACHABLE)
