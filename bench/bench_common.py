"""Helpers the bench scripts share: a timed loop, a percentile, the JSON file.

Imported as ``bench_common`` (bench/ is on ``sys.path`` when a bench script runs).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable


def timed(fn: Callable[[int], object], iters: int, warmup: int = 1) -> list[float]:
    """Latencies in seconds of ``fn(0) .. fn(iters - 1)``, after ``warmup`` untimed calls
    (given negative indexes, so they can use their own keys)."""
    for i in range(warmup):
        fn(-1 - i)
    out = []
    for i in range(iters):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return out


def percentile(lat_s: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``lat_s``: the nearest rank, no interpolation."""
    s = sorted(lat_s)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def write_json(res: object, path: str | None) -> None:
    """Write ``res`` as indented JSON to ``path`` (None: nothing)."""
    if path:
        with open(path, "w") as f:
            json.dump(finite_or_none(res), f, indent=2, allow_nan=False)


def finite_or_none(obj: object) -> object:
    """``obj`` with every NaN/inf float replaced by None (strict JSON: jq, browsers)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj
