"""Reading Mooncake request traces (JSON lines; two ship in kvstored/scheduler/traces/).

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

SHIPPED_TRACES = {
    "conversation": "conversation_trace.jsonl",
    "synthetic": "synthetic_trace.jsonl",
}
"""Traces shipped as package data (kvstored/scheduler/traces/, from the Mooncake repository
``kvcache-ai/Mooncake``, folder ``FAST25-release/traces/``, Apache-2.0; see the README
there): name -> file name."""


def resolve_trace(name_or_path: str | pathlib.Path) -> pathlib.Path:
    """The file of a shipped trace by name (``conversation``, ``synthetic``), or a path.

    Raises:
        InvalidArgument: neither a shipped name nor an existing file (the message lists the
            names).
    """
    key = str(name_or_path)
    if key in SHIPPED_TRACES:
        from importlib.resources import files

        p = pathlib.Path(str(files("kvstored.scheduler") / "traces" / SHIPPED_TRACES[key]))
        if not p.is_file():
            raise InvalidArgument(f"the shipped trace {key!r} is missing from the package ({p})")
        return p
    p = pathlib.Path(key)
    if not p.is_file():
        raise InvalidArgument(
            f"trace {key!r} is neither a shipped trace ({', '.join(SHIPPED_TRACES)}) nor an "
            "existing file"
        )
    return p


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


def synthetic_trace(
    num_requests: int,
    *,
    rate_per_s: float = 5.0,
    num_conversations: int = 50,
    system_prompt_blocks: int = 2,
    seed: int = 0,
) -> list[TraceRecord]:
    """A small Mooncake-like trace for tests and examples (deterministic for a seed).

    Requests arrive as a Poisson process. Each belongs to one of ``num_conversations``
    conversations; a conversation's next turn extends its previous prompt by a few blocks, and
    every prompt starts with the same ``system_prompt_blocks`` blocks, so prefixes are reused
    the way the published traces reuse them.

    Raises:
        InvalidArgument: a count or rate that is not positive.
    """
    import random

    if num_requests < 0 or rate_per_s <= 0 or num_conversations < 1 or system_prompt_blocks < 0:
        raise InvalidArgument(
            f"need num_requests >= 0, rate_per_s > 0, num_conversations >= 1, "
            f"system_prompt_blocks >= 0; got {num_requests}, {rate_per_s}, {num_conversations}, "
            f"{system_prompt_blocks}"
        )
    rng = random.Random(seed)
    next_id = system_prompt_blocks
    convs: list[list[int]] = [list(range(system_prompt_blocks)) for _ in range(num_conversations)]
    t = 0.0
    out: list[TraceRecord] = []
    for _ in range(num_requests):
        t += rng.expovariate(rate_per_s)
        c = rng.randrange(num_conversations)
        grow = rng.randint(1, 6)
        convs[c] = convs[c] + list(range(next_id, next_id + grow))
        next_id += grow
        if len(convs[c]) > 64:  # start a new conversation
            convs[c] = list(range(system_prompt_blocks)) + list(range(next_id, next_id + grow))
            next_id += grow
        ids = tuple(convs[c])
        n_in = len(ids) * TRACE_BLOCK_TOKENS - rng.randrange(TRACE_BLOCK_TOKENS)
        n_out = max(1, int(rng.lognormvariate(5.0, 0.8)))
        out.append(TraceRecord(int(t * 1000), max(1, n_in), n_out, ids))
    return out
