"""The node's side of a reserve-ahead put, in process: one CommitSlots of a batch plus its refill.

Usage:
    python bench/bench_commit.py [--batch 16] [--size 256KiB] [--reps 1000] [--fill 0]
                                 [--json bench/results/bench_commit.json]

What a steady shared-memory put costs the node once its bytes are in the arena (no socket,
no client): ``NodeCore.slots.commit_slots`` of ``batch`` writes into granted slots (the lease
takes, the store's commit: DRAM map, change feed, the slot headers and the shared index) and
the refill of ``batch`` slots for the next put, then a removal of the batch (not timed). Rows,
measured alternated rep by rep in the same run:

  * native     the slot headers and index buckets stamped by one C call per batch
               (``SlotTable.publish_many`` -> ``kvstored._native.publish_many``)
  * python     the same with the pure-Python fallback (``SlotTable.publish`` per block)
  * after_answer  what a client's put asks for now (``grant_after_answer``, native publish):
               the CommitSlots without its refill (``call``: what the answer waits for) and
               the refill granted after it (``SlotGrants.grant``, timed as ``refill``)

Each row: p50 / p90 of the whole call in us (``time.perf_counter``), per block, and the
fallback's p50 over the native one. The store's commit alone (``TieredStore.commit_slots``)
and the publish alone are timed as parts of the same calls.
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvstored import native  # noqa: E402
from kvstored.clock import FakeClock  # noqa: E402
from kvstored.config import NodeConfig  # noqa: E402
from kvstored.node.core import NodeCore  # noqa: E402
from kvstored.node.metrics import NodeMetrics  # noqa: E402
from kvstored.tiers.tiered import TieredStore  # noqa: E402
from kvstored.units import parse_size  # noqa: E402


def _timed(into: dict[str, list[float]], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            into.setdefault(name, []).append(time.perf_counter() - t0)
    return wrapper


def run(batch: int, size: int, reps: int, fill: int = 0) -> dict[str, Any]:
    """Every row (see the module docstring); seconds in, microseconds out. ``fill``: blocks
    of 4 KiB stored first (a node holding blocks: its maps and offset index are that big)."""
    cfg = NodeConfig(node_id="bench",
                     dram_size_bytes=max(256 << 20, 4 * batch * size + (64 << 20)) + fill * 4096,
                     ssd_size_bytes=0, max_block_bytes=max(size, 1 << 20), pin_lease_s=60.0)
    store = TieredStore(dram_size_bytes=cfg.dram_size_bytes, arena_dir=None,
                        max_block_bytes=cfg.max_block_bytes)
    try:
        page = b"f" * 4096
        for i in range(fill):
            store.put(b"fill:%011d" % i, page)
        core = NodeCore(store, cfg, epoch=1, metrics=NodeMetrics(), clock=FakeClock())
        table = store._state.dram.arena.slot_table  # noqa: SLF001 (the bench switches the publish)
        fast = table.native_publish, table.native_unindex
        parts: dict[str, dict[str, list[float]]] = {"native": {}, "python": {}, "after_answer": {}}
        sid = core.open_session("bench")
        got = core.slots.commit_slots(b"", [], session_id=sid, want=[(size, batch)])
        assert isinstance(got, tuple)
        pool = got[1]
        real_commit, real_publish = type(store).commit_slots, type(table).publish_many

        def one(i: int, row: str) -> None:
            nonlocal pool
            table.native_publish, table.native_unindex = fast if row != "python" else (None, None)
            acc = parts[row]
            store.commit_slots = _timed(acc, "store_commit", functools.partial(real_commit, store))  # type: ignore[method-assign]
            table.publish_many = _timed(acc, "publish", functools.partial(real_publish, table))  # type: ignore[method-assign]
            writes = [(g.slot_id, (b"bench:%d:%d" % (i, j)).ljust(16, b"."), size, b"") for j, g in enumerate(pool)]
            later = row == "after_answer"
            t0 = time.perf_counter()
            out = core.slots.commit_slots(b"", writes, session_id=sid, want=[] if later else [(size, batch)])
            acc.setdefault("call", []).append(time.perf_counter() - t0)
            assert isinstance(out, tuple) and all(o.stored for o in out[0])
            if later:
                t0 = time.perf_counter()
                refill = core.slots.grant(b"", [(size, batch)], session_id=sid)
                acc.setdefault("refill", []).append(time.perf_counter() - t0)
                assert isinstance(refill, list)
                pool = refill
            else:
                pool = out[1]
            assert len(pool) == batch
            store.remove([w[1] for w in writes])

        rows = list(parts)
        for i in range(60):  # warm up every row
            one(i, rows[i % len(rows)])
        for row in parts.values():
            row.clear()
        for i in range(reps):
            for j, row in enumerate(rows):
                one(1000 + len(rows) * i + j, row)
    finally:
        store.close()

    def us(xs: list[float], q: float) -> float:
        return sorted(xs)[int(q * (len(xs) - 1))] * 1e6

    out: dict[str, Any] = {"batch": batch, "size_bytes": size, "reps": reps, "fill_blocks": fill,
                           "native_built": fast[0] is not None}
    for row, acc in parts.items():
        out[row] = {f"{name}_p50_us": us(v, 0.5) for name, v in acc.items()}
        out[row]["call_p90_us"] = us(acc["call"], 0.9)
        out[row]["call_per_block_us"] = out[row]["call_p50_us"] / batch
    out["python_vs_native_call"] = out["python"]["call_p50_us"] / out["native"]["call_p50_us"]
    out["python_vs_native_publish"] = out["python"]["publish_p50_us"] / out["native"]["publish_p50_us"]
    out["date_utc"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", default="256KiB")
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--fill", type=int, default=0,
                    help="blocks of 4 KiB stored before the timed commits (default 0)")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "bench_commit.json"))
    args = ap.parse_args()
    if native.publish_many is None:
        sys.exit("kvstored._native is not built (python setup.py build_ext --inplace): no native row")
    res = run(args.batch, parse_size(args.size), args.reps, args.fill)
    print(f"CommitSlots of {res['batch']} x {args.size} + a refill of {res['batch']}, in process, "
          f"{res['fill_blocks']} blocks stored before, p50 of {res['reps']} alternated reps")
    print(f"{'row':12s} {'call us':>9s} {'p90 us':>8s} {'per block':>10s} {'store commit':>13s} {'publish':>8s}")
    for row in ("native", "python", "after_answer"):
        r = res[row]
        print(f"{row:12s} {r['call_p50_us']:9.1f} {r['call_p90_us']:8.1f} {r['call_per_block_us']:10.1f} "
              f"{r['store_commit_p50_us']:13.1f} {r['publish_p50_us']:8.1f}"
              + (f"   (+ refill after the answer {r['refill_p50_us']:.1f})" if "refill_p50_us" in r else ""))
    print(f"python / native: call {res['python_vs_native_call']:.2f}x, publish {res['python_vs_native_publish']:.2f}x")
    out = pathlib.Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
