"""Metadata RPC latency under a demotion storm: LookupPrefix(512 keys) and Exists, SSD on vs off.

Usage:
    python bench/bench_metadata_storm.py [--samples 300] [--storm-block 4MiB] [--storm-batch 4]
                                         [--json bench/results/bench_metadata_storm.json]

For each setting of the SSD tier (on: 1 GiB directory under the temp dir; off) a daemon with
a 64 MiB DRAM tier is started, 512 small blocks are stored for the probes, and then:
  * idle   p50/p99 of LookupPrefix(512 keys) and Exists(512 keys) with nothing else running
  * storm  the same while another client puts batches of 4 MiB blocks without pause, so DRAM
           stays full and every put evicts: with the SSD tier on, each eviction is a demotion
           (file write + xxh3 + RocksDB put); with it off, a drop
The probe client re-reads its 512 blocks (untimed) every 20 samples so they stay resident.
Before issue 6, demotions ran under the store lock, which the metadata RPCs take on the event
loop, so "storm, SSD on" p99 was that of a 4 MiB file write. Ratios storm/idle are from the
same run; absolute times depend on the (shared) machine.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_blocks import ROOT, daemon  # noqa: E402

from kvstored import Client  # noqa: E402
from kvstored.units import parse_size  # noqa: E402


def pct(lat_s: list[float], q: float) -> float:
    s = sorted(lat_s)
    return s[int(q * (len(s) - 1))] * 1e3


def probe(c: Client, keys: list[bytes], samples: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, fn in (("lookup_prefix_512", lambda: c.lookup_prefix(keys)),
                     ("exists_512", lambda: c.exists(keys))):
        lat: list[float] = []
        for i in range(samples):
            if i % 20 == 0:
                c.get(keys)  # untimed: keep the probe blocks resident (touch)
            t0 = time.perf_counter()
            fn()
            lat.append(time.perf_counter() - t0)
        out[name] = {"p50_ms": statistics.median(lat) * 1e3, "p99_ms": pct(lat, 0.99),
                     "max_ms": max(lat) * 1e3}
    return out


def run_setting(tmp: pathlib.Path, ssd_size: str, args: argparse.Namespace) -> dict[str, object]:
    name = "ssd_on" if ssd_size != "0" else "ssd_off"
    block = parse_size(args.storm_block)
    with daemon(tmp, dram="64MiB", ssd_size=ssd_size, name=name) as (shm_addr, _tcp):
        keys = [b"probe-%010d" % i for i in range(512)]
        with Client(shm_addr, timeout_s=30.0) as c:
            c.put(keys, [b"p" * 64] * len(keys))
            idle = probe(c, keys, args.samples)
            stop = threading.Event()
            stats = {"puts": 0, "bytes": 0, "errors": 0}
            payload = os.urandom(block)

            def storm() -> None:
                n = 0
                with Client(shm_addr, timeout_s=30.0) as s:
                    while not stop.is_set():
                        ks = [b"storm-%s-%010d" % (name.encode(), n + j) for j in range(args.storm_batch)]
                        n += args.storm_batch
                        try:
                            res = s.put(ks, [payload] * len(ks))
                        except Exception:
                            stats["errors"] += len(ks)
                            continue
                        ok = sum(1 for r in res if r.stored)
                        stats["puts"] += ok
                        stats["bytes"] += ok * block
                        stats["errors"] += len(ks) - ok

            before = c.stats()
            t = threading.Thread(target=storm, daemon=True)
            t0 = time.perf_counter()
            t.start()
            while stats["puts"] < 2 * args.storm_batch and t.is_alive():  # storm under way
                time.sleep(0.05)
            stormy = probe(c, keys, args.samples)
            stop.set()
            t.join(60)
            dt = time.perf_counter() - t0
            after = c.stats()
            hits = c.lookup_prefix(keys)
    ev = after["tiers"][0]["evictions"] - before["tiers"][0]["evictions"]
    demoted = 0
    if len(after["tiers"]) > 1:
        demoted = after["tiers"][1]["num_blocks"] - before["tiers"][1]["num_blocks"]
        demoted += after["tiers"][1]["evictions"] - before["tiers"][1]["evictions"]
    return {
        "idle": idle, "storm": stormy,
        "storm_put_gbps": stats["bytes"] / dt / 1e9, "storm_blocks": stats["puts"],
        "storm_errors": stats["errors"], "dram_evictions": ev, "ssd_blocks_written": demoted,
        "probe_blocks_present_after": hits,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--storm-block", default="4MiB")
    ap.add_argument("--storm-batch", type=int, default=4)
    ap.add_argument("--settings", default="ssd_on,ssd_off", help="which SSD settings to run")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "bench_metadata_storm.json"))
    args = ap.parse_args()
    results: dict[str, object] = {"samples": args.samples, "storm_block": args.storm_block,
                                  "storm_batch": args.storm_batch, "dram": "64MiB"}
    with tempfile.TemporaryDirectory(prefix="kvstored-storm-", dir=os.environ.get("TMPDIR")) as d:
        tmp = pathlib.Path(d)
        for ssd_size in ("1GiB", "0"):
            key = "ssd_on" if ssd_size != "0" else "ssd_off"
            if key not in args.settings.split(","):
                continue
            print(f"... {key}", file=sys.stderr)
            results[key] = run_setting(tmp, ssd_size, args)
    print_table(results)
    out = pathlib.Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out}")


def print_table(results: dict[str, object]) -> None:
    print(f"\nmetadata RPCs over the unix socket while another client puts {results['storm_batch']} x "
          f"{results['storm_block']} batches into {results['dram']} of DRAM; {results['samples']} samples each")
    hdr = (f"{'ssd':>7} {'rpc':>18} {'idle p50':>9} {'idle p99':>9} {'storm p50':>10} {'storm p99':>10} "
           f"{'p99 ratio':>10}")
    print(hdr)
    print("-" * len(hdr))
    settings = [k for k in ("ssd_on", "ssd_off") if k in results]
    for setting in settings:
        r = results[setting]
        for rpc in ("lookup_prefix_512", "exists_512"):
            i, s = r["idle"][rpc], r["storm"][rpc]  # type: ignore[index]
            print(f"{setting:>7} {rpc:>18} {i['p50_ms']:8.3f}  {i['p99_ms']:8.3f}  {s['p50_ms']:9.3f}  "
                  f"{s['p99_ms']:9.3f}  {s['p99_ms'] / i['p99_ms']:8.2f}x")
    for setting in settings:
        r = results[setting]
        print(f"{setting}: storm {r['storm_blocks']} blocks at {r['storm_put_gbps']:.2f} GB/s, "  # type: ignore[index]
              f"{r['dram_evictions']} DRAM evictions, {r['ssd_blocks_written']} SSD writes, "  # type: ignore[index]
              f"{r['storm_errors']} errors")  # type: ignore[index]
    if len(settings) < 2:
        return
    on, off = results["ssd_on"], results["ssd_off"]
    for rpc in ("lookup_prefix_512", "exists_512"):
        ratio = on["storm"][rpc]["p99_ms"] / off["storm"][rpc]["p99_ms"]  # type: ignore[index]
        print(f"storm p99 {rpc}: SSD on / SSD off = {ratio:.2f}x")


if __name__ == "__main__":
    main()
