"""Repair throughput alone: the "repair" section of bench/bench_failover.py (no etcd).

GB/s re-replicated by the master's copy commands vs the TCP data plane's own GB/s in the
same run, the SIGKILL case, and the rate-limited case; see bench/bench_failover.py.

Usage:  python bench/bench_repair.py [--total-mib 256] [--block-mib 2] [--node-lease-s 3]
        [--limited-mib-per-s 64] [--out bench/results/bench_repair.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_failover  # noqa: E402

if __name__ == "__main__":
    if not any(a.startswith("--out") for a in sys.argv[1:]):
        sys.argv += ["--out", "bench/results/bench_repair.json"]
    sys.argv[1:1] = ["--sections", "repair"]
    bench_failover.main()
