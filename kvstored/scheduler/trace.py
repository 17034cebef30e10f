"""Reading Mooncake request traces (JSON lines, as published in shared/traces).

One record per line: ``{"timestamp": ms, "input_length": tokens, "output_length": tokens,
"hash_ids": [int, ...]}``, sorted by timestamp; ``hash_ids`` are chained prefix-block ids, one
per 512-token block.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

from kvstored.errors import InvalidArgument

TRACE_BLOCK_TOKENS = 512
"""Tokens per block in the published Mooncake traces."""


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One request of a trace.

    Attributes:
        timestamp_ms: arrival time relative to the trace start, milliseconds.
        input_tokens: prompt length.
        output_tokens: tokens to generate.
        hash_ids: prefix block ids (equal id at equal position = reusable KV prefix).
    """

    timestamp_ms: int
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]


def load_trace(path: str | pathlib.Path, *, limit: int | None = None) -> list[TraceRecord]:
    """Read a trace file.

    Args:
        path: a ``.jsonl`` trace.
        limit: read at most this many records (None = all).

    Raises:
        InvalidArgument: the file cannot be read, a line is not JSON, a field is missing or has
            the wrong type, a length is not positive, or timestamps go backwards (the message
            names the line).
    """
    p = pathlib.Path(path)
    try:
        fh = p.open(encoding="utf-8")
    except OSError as exc:
        raise InvalidArgument(f"cannot read trace {p}: {exc.strerror}") from None
    out: list[TraceRecord] = []
    last_ts = 0
    with fh:
        for lineno, line in enumerate(fh, 1):
            if limit is not None and len(out) >= limit:
                break
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
                ts = obj["timestamp"]
                n_in = obj["input_length"]
                n_out = obj["output_length"]
                ids = obj["hash_ids"]
            except json.JSONDecodeError as exc:
                raise InvalidArgument(f"{p}:{lineno}: not valid JSON: {exc}") from None
            except (KeyError, TypeError) as exc:
                raise InvalidArgument(
                    f"{p}:{lineno}: missing field {exc}; need timestamp, input_length, "
                    "output_length and hash_ids"
                ) from None
            if not (isinstance(ts, int) and isinstance(n_in, int) and isinstance(n_out, int)
                    and isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
                raise InvalidArgument(
                    f"{p}:{lineno}: timestamp, input_length, output_length must be integers and "
                    f"hash_ids a list of integers, got {line[:200]!r}"
                )
            if n_in <= 0 or n_out < 0 or ts < 0:
                raise InvalidArgument(
                    f"{p}:{lineno}: need input_length > 0, output_length >= 0, timestamp >= 0; "
                    f"got {n_in}, {n_out}, {ts}"
                )
            if ts < last_ts:
                raise InvalidArgument(
                    f"{p}:{lineno}: timestamp {ts} is before the previous one ({last_ts}); "
                    "the trace must be sorted by timestamp"
                )
            last_ts = ts
            out.append(TraceRecord(ts, n_in, n_out, tuple(ids)))
    return out
