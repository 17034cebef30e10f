"""Printers of kvstorectl: rich tables for people, stable JSON for scripts.

Commands build plain dicts and hand them to :func:`emit`; they never print themselves.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console, Group
from rich.live import Live
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


def emit_watched(output: str, produce: Callable[[], Any], tables: Callable[[Any], Sequence[Table]], *,
                 watch_s: float | None, count: int | None = None, min_width: int = 100,
                 errors: tuple[type[BaseException], ...] = (),
                 sleep: Callable[[float], None] = time.sleep) -> None:
    """Print ``produce()`` once (``watch_s`` None), or again every ``watch_s`` seconds.

    Watching, a terminal gets one live view redrawn in place (rich's Live); JSON prints one
    compact document per line and refresh (``{"refresh": n, "time_s": unix time, "data":
    ...}``), so a script can follow counters; other output (a pipe) prints the tables again
    each refresh under a time line. A refresh that raises one of ``errors`` shows it (JSON:
    ``{"refresh", "time_s", "error": {"code", "message"}}``) and the watch goes on: a daemon
    that restarts comes back into view. Ctrl-C ends the watch quietly.

    Args:
        produce: fetches the data of one refresh.
        tables: builds the tables of one refresh's data.
        watch_s: seconds between refreshes (> 0), or None for a single print.
        count: stop after this many refreshes (None: until interrupted).
        errors: exceptions shown per refresh instead of ending the watch (they need a
            ``code`` with a ``name``, like KvstoredError).
    """
    if watch_s is None:
        emit(output, produce(), tables, min_width=min_width)
        return
    out = console(min_width)
    live: Live | None = None
    if output != "json" and out.is_terminal:
        live = Live(console=out, auto_refresh=False, transient=False)
        live.start()
    n = 0
    try:
        while count is None or n < count:
            n += 1
            now = time.time()
            try:
                data: Any = produce()
                err: BaseException | None = None
            except errors as exc:
                data, err = None, exc
            if output == "json":
                doc: dict[str, Any] = {"refresh": n, "time_s": round(now, 3)}
                if err is None:
                    doc["data"] = data
                else:
                    doc["error"] = {"code": getattr(getattr(err, "code", None), "name", type(err).__name__),
                                    "message": str(err)}
                sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n")
                sys.stdout.flush()
            else:
                stamp = time.strftime("%H:%M:%S", time.localtime(now))
                header = f"kvstorectl --watch {watch_s:g}s   refresh {n}   {stamp}"
                body: list[Any] = [header]
                body += [f"error: {err}"] if err is not None else list(tables(data))
                if live is not None:
                    live.update(Group(*body), refresh=True)
                else:
                    for part in body:
                        out.print(part)
                    out.print()
            if count is None or n < count:
                sleep(watch_s)
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()


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
