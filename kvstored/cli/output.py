"""Printers of kvstorectl: rich tables for people, stable JSON for scripts.

Commands build plain dicts and hand them to :func:`emit`; they never print themselves.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from kvstored.units import format_size


def console(min_width: int = 100) -> Console:
    """A console on stdout (no colours when not a terminal), at least ``min_width`` wide."""
    return Console(file=sys.stdout, highlight=False, soft_wrap=False,
                   width=max(min_width, Console().width))


def emit_json(data: Any) -> None:
    """One JSON document on stdout (sorted keys: stable for scripts)."""
    sys.stdout.write(json.dumps(data, sort_keys=True, indent=2) + "\n")
    sys.stdout.flush()


def emit(output: str, data: Any, tables: Callable[[Any], Sequence[Table]], *,
         min_width: int = 100) -> None:
    """Print ``data`` as JSON or as the tables ``tables(data)`` builds (``min_width``: of the
    console, for wide tables that must not truncate ids and addresses)."""
    if output == "json":
        emit_json(data)
        return
    out = console(min_width)
    for i, table in enumerate(tables(data)):
        if i:
            out.print()
        out.print(table)


def emit_error(output: str, code: str, message: str) -> None:
    """Report a failed command: JSON on stdout in json mode, always a line on stderr.

    A message that already starts with ``code`` (a gRPC failure without a kvstored error
    code is ``"UNAVAILABLE: failed to connect..."``, kvstored/errors.py) is not prefixed
    twice.
    """
    message = message.removeprefix(f"{code}: ")
    if output == "json":
        emit_json({"error": {"code": code, "message": message}})
    sys.stderr.write(f"kvstorectl: {code}: {message}\n")


def format_duration(seconds: float) -> str:
    """A duration for people: ``"12.3s"``, ``"2m 03s"``, ``"1h 02m 03s"``, ``"3d 04h 05m"``."""
    if seconds < 60:
        return f"{math.floor(max(0.0, seconds) * 10) / 10:.1f}s"
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h {minutes:02d}m"
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    return f"{minutes}m {secs:02d}s"


def kv_table(title: str, rows: Sequence[tuple[str, Any]]) -> Table:
    """A two-column key/value table."""
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("field", style="bold")
    t.add_column("value")
    for k, v in rows:
        t.add_row(k, "" if v is None else str(v))
    return t


def tier_table(tiers: Sequence[dict[str, Any]]) -> Table:
    """Usage per tier."""
    t = Table(title="tiers", title_justify="left")
    for col in ("tier", "used", "capacity", "used %", "blocks", "hits", "evictions"):
        t.add_column(col, justify="left" if col == "tier" else "right")
    for tier in tiers:
        cap = tier["capacity_bytes"]
        t.add_row(
            tier["tier"], format_size(tier["used_bytes"]), format_size(cap),
            f"{100.0 * tier['used_bytes'] / cap:.1f}" if cap else "-",
            str(tier["num_blocks"]), str(tier.get("hits", "")), str(tier.get("evictions", "")),
        )
    return t


def rows_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    """A plain table with a header."""
    t = Table(title=title, title_justify="left")
    for col in columns:
        t.add_column(col)
    for row in rows:
        t.add_row(*("-" if v is None else str(v) for v in row))
    return t
