"""bench/bench_put_floor.py runs against a real daemon and every row commits its writes."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_put_floor_rows_have_their_fields() -> None:
    """Every row of the put decomposition is measured (the floor rows raise if the node
    refuses a write) and reported with its ratio; no timing asserted."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import bench_put_floor
    finally:
        sys.path.remove(str(ROOT / "bench"))
    res = bench_put_floor.run(reps=3, batch=4, size=64 << 10, dram_bytes=64 << 20)
    assert res["batch"] == 4 and res["reps"] == 3
    for row in bench_put_floor.ROWS:
        assert res[f"{row}_p50_us"] > 0, row
        assert res[f"{row}_ratio_vs_ws_memcpy"] > 0, row
    assert res["memcpy_ws_ratio_vs_ws_memcpy"] == 1.0
    assert "client_python_p50_us" in res
