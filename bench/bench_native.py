"""The native batch copy (kvstored.native) next to its fallback and a plain numpy memcpy.

Run alone (``python bench/bench_native.py``) or as the ``native_copy`` rows of
bench/bench_blocks.py. Per block size, a batch of ``batch`` blocks is copied from numpy
arrays into consecutive slices of one anonymous mapping (the arena, as the client's shm put
writes it): ``memcpy`` is one ``numpy.copyto`` per block into preallocated numpy buffers (the
same reference as bench_blocks' memcpy row), ``fallback`` is :func:`kvstored.native.py_copy_many`
(what runs without the extension), ``native`` the C ``copy_many`` with its default threads and
``native_1t`` with one thread. GB/s at the median of ``iters`` batches; the ratios are the
median of per-iteration ratios (all copies timed back to back in each iteration).
"""

from __future__ import annotations

import argparse
import mmap
import statistics
import time
from collections.abc import Callable

import numpy as np
from bench_common import write_json  # bench/ is on sys.path when this script runs

from kvstored import native


def _paired(fns: dict[str, Callable[[], object]], nbytes: int, iters: int) -> dict[str, float]:
    """Each iteration times every copy once, back to back (the machine is shared: pairs
    taken at the same moment compare better than medians taken minutes apart). Returns
    GB/s at the median time per copy, and ``<name>_vs_<ref>`` ratios as the median of the
    per-iteration ratios."""
    for fn in fns.values():
        fn()  # warm: fault the pages in
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(iters):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    out = {f"{k}_gbps": nbytes / statistics.median(v) / 1e9 for k, v in times.items()}
    if "native" in times:
        for ref in ("fallback", "memcpy"):
            out[f"native_vs_{ref}"] = statistics.median(
                r / n for n, r in zip(times["native"], times[ref], strict=True))
    return out


def bench_native_copy(sizes: list[int], batch: int = 16, iters: int = 20) -> dict[str, object]:
    """``{"native_built": bool, "<size>": {memcpy_gbps, fallback_gbps, native_gbps,
    native_1t_gbps, native_vs_fallback, native_vs_memcpy}}`` (native fields NaN when the
    extension is not built)."""
    out: dict[str, object] = {"native_built": native.native_copy_many is not None, "batch": batch,
                              "fallback_reason": native.FALLBACK_REASON}
    for size in sizes:
        rng = np.random.default_rng(size)
        srcs = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(batch)]
        bufs = [np.empty(size, dtype=np.uint8) for _ in range(batch)]
        arena = mmap.mmap(-1, size * batch)
        region = np.frombuffer(arena, dtype=np.uint8)
        pairs = [(region[j * size : (j + 1) * size], memoryview(s)) for j, s in enumerate(srcs)]
        row = _paired(_copy_fns(srcs, bufs, pairs), size * batch, iters)
        for k in ("native_gbps", "native_1t_gbps", "native_vs_fallback", "native_vs_memcpy"):
            row.setdefault(k, float("nan"))
        out[_fmt(size)] = row
        assert bytes(region[-16:]) == srcs[-1][-16:].tobytes()
    return out


def _copy_fns(srcs: list[np.ndarray], bufs: list[np.ndarray],
              pairs: list[tuple[np.ndarray, memoryview]]) -> dict[str, Callable[[], object]]:
    """The copies to time for one size: memcpy of ``srcs`` into ``bufs`` (same lengths), the
    Python fallback and, when the extension is built, the native batch copy of ``pairs``."""

    def memcpy() -> None:
        for s, b in zip(srcs, bufs, strict=True):
            np.copyto(b, s)

    fns: dict[str, Callable[[], object]] = {
        "memcpy": memcpy, "fallback": lambda: native.py_copy_many(pairs)}
    c = native.native_copy_many
    if c is not None:
        fns["native"] = lambda: c(pairs)
        fns["native_1t"] = lambda: c(pairs, threads=1)
    return fns


def _fmt(size: int) -> str:
    return f"{size >> 20}MiB" if size >= 1 << 20 else f"{size >> 10}KiB"


def print_rows(res: dict[str, object]) -> None:
    """One line per size: GB/s of each copy and the native ratios."""
    built = "built" if res["native_built"] else f"not used: {res.get('fallback_reason') or 'not built'}; fallback only"
    print(f"\nnative copy_many (kvstored._native {built}), batch of {res['batch']} into one mapping:")
    for size, row in res.items():
        if not isinstance(row, dict):
            continue
        print(f"{size:>9} {'native_copy':>16} {row['native_gbps']:7.2f}  "
              f"{row['native_vs_fallback']:.2f}x fallback {row['fallback_gbps']:.2f}, "
              f"{row['native_vs_memcpy']:.2f}x memcpy {row['memcpy_gbps']:.2f} GB/s "
              f"(1 thread {row['native_1t_gbps']:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="256KiB,1MiB,4MiB,16MiB")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sizes = [int(s[:-3]) << (20 if s.endswith("MiB") else 10) for s in args.sizes.split(",")]
    res = bench_native_copy(sizes, args.batch, args.iters)
    print_rows(res)
    write_json(res, args.json)


if __name__ == "__main__":
    main()
