"""TLS benchmark: the TCP data plane (and gRPC control) with mutual TLS next to the same node
without TLS, in the same run.

Usage:
    python bench/bench_tls.py [--size 4MiB] [--batch 8] [--iters 8] [--json bench/results/bench_tls.json]

Two ``kvstored serve`` processes on loopback, one plain and one with ``--tls-*``
(certificates from :func:`kvstored.security.certs.init_cluster_certs`); a ``Client`` with
``transport="tcp"`` puts ``batch`` blocks of ``size`` once, then times ``get`` of the batch
``iters`` times (after a warm-up), and one small ``exists`` call (control-plane round trip,
p50). Prints GB/s per path and the ratio ``tls / plain`` (the cost of encryption on this
machine: AES-GCM in OpenSSL, one core per stream). No target: a reference for operators.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from bench_common import write_json  # bench/ is on sys.path when this script runs

from kvstored import Client
from kvstored.security.certs import init_cluster_certs
from kvstored.security.tls import TlsFiles
from kvstored.units import parse_size


def _serve(workdir: pathlib.Path, name: str, extra: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvstored.cli.main", "serve", "--listen", f"unix:{workdir}/{name}.sock",
         "--listen", "127.0.0.1:0", "--data-address", "127.0.0.1:0", "--metrics-address", "",
         "--dram-size", "512MiB", "--ssd-size", "0", "--node-id", name, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=workdir)
    address: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("listening grpc 127.0.0.1:"):
                address.append(line.split()[2])
            elif line.strip() == "ready":
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(60):
        proc.kill()
        raise SystemExit(f"kvstored serve ({name}) did not become ready")
    return proc, address[0]


def _measure(address: str, tls: TlsFiles | bool, size: int, batch: int, iters: int) -> dict[str, float]:
    keys = [i.to_bytes(16, "big") for i in range(batch)]
    value = bytes(range(256)) * (size // 256)
    with Client(address, transport="tcp", tls=tls if tls else False, timeout_s=60) as c:
        assert all(r.stored for r in c.put(keys, [value] * batch))
        c.get(keys)  # warm-up (connections, TLS sessions)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            got = c.get(keys)
            times.append(time.perf_counter() - t0)
            assert got[0] is not None and len(got[0]) == size
        probes = []
        for _ in range(50):
            t0 = time.perf_counter()
            c.exists(keys[:1])
            probes.append(time.perf_counter() - t0)
    return {"get_gbps": size * batch / statistics.median(times) / 1e9,
            "exists_p50_us": statistics.median(probes) * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="4MiB")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    size = parse_size(args.size)
    with tempfile.TemporaryDirectory(prefix="kvbtls") as d:
        workdir = pathlib.Path(d)
        certs = workdir / "certs"
        init_cluster_certs(certs, nodes=["n"], engines=["e"], admins=[])
        flags = ["--tls-cert", str(certs / "node-n.pem"), "--tls-key", str(certs / "node-n.key"),
                 "--tls-ca", str(certs / "ca.pem")]
        plain_proc, plain_addr = _serve(workdir, "plain", [])
        tls_proc, tls_addr = _serve(workdir, "tls", flags)
        try:
            engine = TlsFiles.load(certs / "engine-e.pem", certs / "engine-e.key", certs / "ca.pem")
            plain = _measure(plain_addr, False, size, args.batch, args.iters)
            tls = _measure(tls_addr, engine, size, args.batch, args.iters)
        finally:
            for p in (plain_proc, tls_proc):
                p.terminate()
                p.wait(60)
    res = {"size": args.size, "batch": args.batch, "plain": plain, "tls": tls,
           "get_ratio_tls_to_plain": tls["get_gbps"] / plain["get_gbps"],
           "exists_ratio_tls_to_plain": tls["exists_p50_us"] / plain["exists_p50_us"],
           "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    print(f"tcp get {args.size} x {args.batch}: plain {plain['get_gbps']:.2f} GB/s, "
          f"tls {tls['get_gbps']:.2f} GB/s, ratio {res['get_ratio_tls_to_plain']:.2f}")
    print(f"exists p50: plain {plain['exists_p50_us']:.0f} us, tls {tls['exists_p50_us']:.0f} us, "
          f"ratio {res['exists_ratio_tls_to_plain']:.2f}")
    write_json(res, args.json)


if __name__ == "__main__":
    main()
