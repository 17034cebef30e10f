"""512-key lookups of two builds of kvstored._native_master, interleaved in one process.

bench_master.py measures each size in its own process, one build per run; on a shared
machine its p50 moves by x1.5-2 between runs minutes apart, more than most changes to the C
lookups. Here one index (N blocks, ``--replicas`` COMMITTED replicas each over 8 holders,
16-byte random keys, as bench_master.py builds it) is asked by both builds in turn, 400
lookups per build per round, ``--rounds`` rounds, so both see the same index, caches and
load. ``--other`` is the other build's extension file (e.g. main's, built in a scratch
worktree: ``git worktree add /tmp/base main && (cd /tmp/base && python setup.py build_ext
--inplace)``); the build imported as ``kvstored._native_master`` is "this". When the
other build reads another key-table layout, ``--other-keytable`` is that tree's
kvstored/master/keytable.py: its KeyTable is filled with the same keys and slots and swapped
into the index for the other build's lookups (both tables stay in memory).

Four kinds of lookup, each 512 keys, all present, asked from one of the holders:
``seq prefix``: 512 keys added together (adjacent rows, as bench_master.py's prefixes),
through ``BlockIndex.lookup_prefix`` (C ``keytable_get_many`` then ``best_rows``);
``seq wire``: the same through ``BlockIndex.lookup_wire`` (C ``lookup_wire``, the
LookupPrefix RPC's path, from request bytes); ``rand prefix`` / ``rand wire``: 512 keys
drawn from the whole index (rows anywhere).

Printed: per kind, the median over rounds of each build's p50 (us), their ratio, and the
range over rounds.

Usage:  python bench/bench_master_lookup_ab.py --other /tmp/base/kvstored/_native_master.*.so
        [--other-keytable /tmp/base/kvstored/master/keytable.py]
        [--sizes 10000,1000000,10000000] [--replicas 1] [--rounds 5]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import subprocess
import sys
import time
from types import ModuleType

import numpy as np

HOLDERS = 8
PREFIX = 512
NS = b"\x42" * 16
CHUNK = 1 << 20


def load_build(path: str) -> ModuleType:
    """The extension at ``path`` as a module of its own (its init function is the same)."""
    spec = importlib.util.spec_from_file_location("kvstored._native_master", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--other: cannot load an extension from {path!r}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_keytable(path: str) -> ModuleType:
    """The module at ``path`` (another tree's kvstored/master/keytable.py), under its own name."""
    spec = importlib.util.spec_from_file_location("other_keytable", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--other-keytable: cannot load a module from {path!r}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_one(n: int, replicas: int, rounds: int, other_path: str, other_keytable: str = "") -> None:
    """Build the index of ``n`` blocks and print the interleaved p50s of both builds."""
    from kvstored import native
    from kvstored.master.index import BlockIndex
    from kvstored.types import Tier
    from kvstored.v1 import master_pb2 as pb

    this = native.master_index
    if this is None:
        raise SystemExit("kvstored._native_master is not built (python setup.py build_ext --inplace)")
    builds = (("other", load_build(other_path)), ("this", this))
    rng = np.random.default_rng(n)
    ix = BlockIndex(initial_blocks=1024)
    holders = [ix.add_holder() for _ in range(HOLDERS)]
    for h in holders:
        ix.set_readable(h, True)
        ix.set_load(h, float(h))
    chunks = []
    done = 0
    while done < n:
        m = min(CHUNK, n - done)
        buf = rng.bytes(16 * m)
        keys = [buf[i : i + 16] for i in range(0, 16 * m, 16)]
        tiers = np.where(rng.random(m) < 0.5, int(Tier.DRAM), int(Tier.SSD))
        for r in range(replicas):
            ix.add_replicas_bulk(NS, keys, holder=holders[(done // CHUNK + 3 * r) % HOLDERS], tiers=tiers,
                                 sizes=np.full(m, 1 << 20), generation=done + 1)
        chunks.append(buf)
        done += m
    allkeys = b"".join(chunks)

    c = ix.columns
    ns = c.ns(NS, create=False)
    tables = {"this": c.tables[ns], "other": c.tables[ns]}
    if other_keytable:
        t = c.tables[ns]
        live = t._sl >= 0
        ot = load_keytable(other_keytable).KeyTable(16)
        ot.insert_many(np.stack([t._lo[live], t._hi[live]], axis=1), t._sl[live].astype(np.int64))
        tables["other"] = ot
        print(f"N={n:>10,} key table bytes/key: other {ot.nbytes / n:.1f}, this {t.nbytes / n:.1f}", flush=True)

    def key(i: int) -> bytes:
        return allkeys[16 * i : 16 * i + 16]

    sets: dict[str, list[list[bytes]]] = {"seq": [], "rand": []}
    for _ in range(64):
        s = int(rng.integers(0, n - PREFIX))
        sets["seq"].append([key(s + t) for t in range(PREFIX)])
        sets["rand"].append([key(int(t)) for t in rng.integers(0, n, PREFIX)])
    reqs = {k: [pb.MasterLookupPrefixRequest(namespace_id=NS, keys=p).SerializeToString() for p in v]
            for k, v in sets.items()}

    def p50(name: str, impl: ModuleType, kind: str, wire: bool) -> float:
        native.master_index = impl
        c.tables[ns] = tables[name]
        out = []
        for i in range(400):
            t = time.perf_counter_ns()
            if wire:
                got = ix.lookup_wire(NS, reqs[kind][i % 64], local_holder=holders[i % HOLDERS])
                assert got is not None and got.num_blocks == PREFIX
            else:
                assert len(ix.lookup_prefix(NS, sets[kind][i % 64], local_holder=holders[i % HOLDERS])) == PREFIX
            out.append(time.perf_counter_ns() - t)
        return float(np.percentile(np.asarray(out) / 1000.0, 50))

    gc.disable()
    res: dict[tuple[str, bool, str], list[float]] = {}
    for _ in range(rounds):
        for kind in ("seq", "rand"):
            for wire in (False, True):
                for name, impl in builds:
                    res.setdefault((kind, wire, name), []).append(p50(name, impl, kind, wire))
    native.master_index = this
    c.tables[ns] = tables["this"]
    for kind in ("seq", "rand"):
        for wire in (False, True):
            a, b = res[(kind, wire, "other")], res[(kind, wire, "this")]
            ma, mb = float(np.median(a)), float(np.median(b))
            print(f"N={n:>10,} replicas {replicas} {kind:4} {'wire  ' if wire else 'prefix'}  other p50 {ma:6.1f} us"
                  f"  this {mb:6.1f} us  x{mb / ma:.2f}  (other {min(a):.1f}-{max(a):.1f},"
                  f" this {min(b):.1f}-{max(b):.1f})", flush=True)


def main() -> None:
    """Each size in a fresh subprocess (its own index and caches)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", required=True, help="the other build's _native_master extension file")
    ap.add_argument("--other-keytable", default="",
                    help="the other tree's kvstored/master/keytable.py (when its layout differs)")
    ap.add_argument("--sizes", default="10000,1000000,10000000")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        run_one(args.one, args.replicas, args.rounds, args.other, args.other_keytable)
        return
    for n in (int(x) for x in args.sizes.split(",")):
        if n <= PREFIX:
            raise SystemExit(f"--sizes: each size must exceed {PREFIX} blocks, got {n}")
        subprocess.run([sys.executable, __file__, "--one", str(n), "--other", args.other, "--replicas",
                        str(args.replicas), "--rounds", str(args.rounds), "--other-keytable", args.other_keytable],
                       check=True)


if __name__ == "__main__":
    main()
