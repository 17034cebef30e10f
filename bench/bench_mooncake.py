"""Peer benchmark: kvstored next to Mooncake Store (and Redis), same workload, same run.

Usage:
    python bench/bench_mooncake.py --install            # once: Mooncake into its own venv
    python bench/bench_mooncake.py [--quick] [--total 1GiB] [--json FILE]

What runs, back to back, on loopback only:
  * kvstored   a daemon (unix socket + shared memory arena, and gRPC/TCP + the TCP data plane);
               shm and tcp clients put, then get, the workload
  * Mooncake   mooncake_master (RPC, HTTP metadata server and metrics pinned to 127.0.0.1),
               then (a) a store process holding the segment + a client without one: gets go
               over Mooncake's TCP transfer engine; (b) a client holding its own segment
               (in-process memcpy, no second process). Puts/gets use registered buffers
               (``batch_put_from`` / ``batch_get_into``: no Python bytes copies)
  * Redis      redis-server on 127.0.0.1 (as in bench_blocks.py), pipelined batches
Workload: ``--total`` bytes of values of each size (256 KiB, 1 MiB, 4 MiB, 16 MiB), in single
ops and batches of 8 and 16. Ratios printed (issue 9): kvstored shm get / Mooncake in-process
get (target >= 0.8x), kvstored tcp get / Mooncake TCP get (target >= 2x), same for puts.

Safety: after each server starts, ``ss -ltnp`` lists the listeners of the processes this
benchmark started; any bound beyond loopback (a real interface, or 0.0.0.0/:: in a namespace
that has one) aborts the run. Mooncake 0.3.13.post1 binds its HTTP metadata server (whatever
-http_metadata_server_host says), the transfer engine's handshake port and its TCP data port to
0.0.0.0, so its phase runs in a private network namespace (``unshare --net``, only ``lo`` up;
needs root) and uses P2PHANDSHAKE metadata; ``--no-netns`` runs it here and so aborts.

Mooncake needs libibverbs/librdmacm at import even for TCP (``apt-get install libibverbs1
librdmacm1``); without them, or without the venv, the Mooncake rows say why and are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from bench_blocks import daemon, free_port, machine, redis_server  # noqa: E402
from bench_common import finite_or_none  # noqa: E402

from kvstored import Client  # noqa: E402
from kvstored.units import format_size, parse_size  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
VENV = ROOT / "bench" / ".mooncake-venv"
PACKAGE = "mooncake-transfer-engine-non-cuda"
SIZES = ["256KiB", "1MiB", "4MiB", "16MiB"]
BATCHES = [1, 8, 16]


class ListenerError(RuntimeError):
    """A process started by this benchmark listens beyond loopback."""


def _tree_pids(root: int) -> set[int]:
    pids, todo = {root}, [root]
    while todo:
        p = todo.pop()
        try:
            kids = pathlib.Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        for k in map(int, kids):
            if k not in pids:
                pids.add(k)
                todo.append(k)
    return pids


def netns_is_loopback_only() -> bool:
    """True when this process's network namespace has no interface but ``lo`` (/proc/net/dev
    is per namespace): a wildcard listener here is reachable from loopback only."""
    lines = pathlib.Path("/proc/net/dev").read_text().splitlines()[2:]
    return [ln.split(":")[0].strip() for ln in lines] == ["lo"]


def check_loopback_only(procs: list[subprocess.Popen[Any]], what: str) -> list[str]:
    """Listeners (``ss -ltnp``) of ``procs`` and their children; abort if any is not loopback.

    A wildcard listener (0.0.0.0, ::, *) counts as loopback only inside a network namespace
    whose only interface is ``lo`` (how the Mooncake phase runs; see ``--no-netns``).

    Returns:
        The listening addresses seen, e.g. ``["127.0.0.1:5000 mooncake_master"]``.

    Raises:
        ListenerError: a listener bound to 0.0.0.0, ::, or a non-loopback address.
    """
    pids: set[int] = set()
    for p in procs:
        pids |= _tree_pids(p.pid)
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    seen, bad = [], []
    for line in out.splitlines():
        owners = {int(m) for m in re.findall(r"pid=(\d+)", line)}
        if not owners & pids:
            continue
        local = line.split()[3]
        host = local.rsplit(":", 1)[0].strip("[]").removeprefix("::ffff:")  # v4-mapped
        name = (re.findall(r'\("([^"]+)"', line) or ["?"])[0]
        seen.append(f"{local} {name}")
        wildcard_ok = host in ("0.0.0.0", "::", "*") and netns_is_loopback_only()
        if not (host.startswith("127.") or host == "::1" or wildcard_ok):
            bad.append(f"{local} ({name})")
    if bad:
        raise ListenerError(f"{what}: listening beyond loopback: {', '.join(bad)}; aborted")
    return seen


# ---- kvstored ------------------------------------------------------------------------------
def run_kvstored(tmp: pathlib.Path, sizes: list[int], total: int, reps: int) -> dict[str, Any]:
    res: dict[str, Any] = {}
    dram = total + (256 << 20)
    with daemon(tmp, dram=str(dram), ssd_size="0", name="kv") as (shm_addr, tcp_addr):
        pids = [p for p in map(int, _pgrep_children(os.getpid()))]
        res["listeners"] = check_loopback_only([_FakeProc(p) for p in pids], "kvstored")
        for transport, addr in (("shm", shm_addr), ("tcp", tcp_addr)):
            with Client(addr, timeout_s=120.0, transport=transport) as c:
                for size in sizes:
                    n = max(16, total // size)
                    vals = [np.random.default_rng(i).integers(0, 255, size, dtype=np.uint8)
                            for i in range(16)]
                    bufs = [np.empty(size, dtype=np.uint8) for _ in range(16)]
                    for batch in BATCHES:
                        keys = [f"kv:{transport}:{size}:{batch}:{i}".encode() for i in range(n)]
                        put_t, get_t = [], []
                        for _ in range(reps):
                            t0 = time.perf_counter()
                            for i in range(0, n, batch):
                                ks = keys[i : i + batch]
                                r = c.put(ks, vals[: len(ks)])
                                assert all(x.ok for x in r), r
                            put_t.append(time.perf_counter() - t0)
                            t0 = time.perf_counter()
                            for i in range(0, n, batch):
                                ks = keys[i : i + batch]
                                got = c.get_into(ks, bufs[: len(ks)])
                                assert all(g == size for g in got), got
                            get_t.append(time.perf_counter() - t0)
                            assert bytes(bufs[0][:64]) == bytes(vals[0][:64])
                            c.remove(keys)
                        key = f"{format_size(size)}/b{batch}"
                        res.setdefault(f"{transport}_put", {})[key] = n * size / min(put_t) / 1e9
                        res.setdefault(f"{transport}_get", {})[key] = n * size / min(get_t) / 1e9
    return res


class _FakeProc:
    def __init__(self, pid: int) -> None:
        self.pid = pid


def _pgrep_children(pid: int) -> list[str]:
    try:
        return pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []


# ---- Mooncake ------------------------------------------------------------------------------
MC_CLIENT = textwrap.dedent('''
    import json, sys, time, ctypes
    import numpy as np
    from mooncake.store import MooncakeDistributedStore
    cfg = json.loads(sys.argv[1])
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", cfg["metadata"], cfg["segment"], cfg["local_buffer"], "tcp", "",
                 cfg["master"])
    if rc != 0:
        print(json.dumps({"error": f"setup returned {rc}"})); sys.exit(1)
    if cfg["role"] == "store":
        print(json.dumps({"ready": True}), flush=True)
        sys.stdin.read()  # hold the segment until the benchmark closes our stdin
        s.close(); sys.exit(0)
    out = {}
    for size in cfg["sizes"]:
        n = max(16, cfg["total"] // size)
        src = np.random.default_rng(1).integers(0, 255, 16 * size, dtype=np.uint8)
        dst = np.empty(16 * size, dtype=np.uint8)
        for a in (src, dst):
            assert s.register_buffer(a.ctypes.data, a.nbytes) == 0
        for batch in cfg["batches"]:
            keys = [f"mc:{cfg['role']}:{size}:{batch}:{i}" for i in range(n)]
            put_t, get_t = [], []
            for rep in range(cfg["reps"]):
                t0 = time.perf_counter()
                for i in range(0, n, batch):
                    ks = keys[i:i + batch]
                    ptrs = [src.ctypes.data + j * size for j in range(len(ks))]
                    r = s.batch_put_from(ks, ptrs, [size] * len(ks))
                    assert all(x == 0 for x in r), r
                put_t.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                for i in range(0, n, batch):
                    ks = keys[i:i + batch]
                    ptrs = [dst.ctypes.data + j * size for j in range(len(ks))]
                    r = s.batch_get_into(ks, ptrs, [size] * len(ks))
                    assert all(x == size for x in r), r
                get_t.append(time.perf_counter() - t0)
                assert bytes(dst[:64]) == bytes(src[:64])
                time.sleep(1.1)  # the read lease (-default_kv_lease_ttl=1000 ms) must lapse
                s.remove_all()
            key = f"{size}/b{batch}"
            out.setdefault("put", {})[key] = n * size / min(put_t) / 1e9
            out.setdefault("get", {})[key] = n * size / min(get_t) / 1e9
        for a in (src, dst):
            s.unregister_buffer(a.ctypes.data)
    s.close()
    print(json.dumps(out))
''')


def mooncake_python(venv: pathlib.Path) -> tuple[str | None, str]:
    """The venv's python if Mooncake imports there, else (None, why not)."""
    py = venv / "bin" / "python"
    if not py.exists():
        return None, f"no Mooncake venv at {venv} (run with --install)"
    r = subprocess.run([str(py), "-c", "import mooncake.store"], capture_output=True, text=True)
    if r.returncode != 0:
        why = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "import failed"
        if "libibverbs" in why or "librdmacm" in why:
            why += " (apt-get install libibverbs1 librdmacm1)"
        return None, f"mooncake.store does not import: {why}"
    return str(py), ""


def run_mooncake(py: str, tmp: pathlib.Path, sizes: list[int], total: int, reps: int,
                 timeout_s: float) -> dict[str, Any]:
    bindir = pathlib.Path(py).parent
    rpc, metrics = free_port(), free_port()
    master = subprocess.Popen(
        [str(bindir / "mooncake_master"), "-rpc_address", "127.0.0.1", f"-rpc_port={rpc}",
         # no -enable_http_metadata_server: its listener binds 0.0.0.0 whatever
         # -http_metadata_server_host says (seen with 0.3.13.post1); peers handshake directly
         "-enable_http_metadata_server=false", "-metrics_host", "127.0.0.1",
         f"-metrics_port={metrics}", "-default_kv_lease_ttl=1000"],
        stdout=open(tmp / "mc-master.log", "w"), stderr=subprocess.STDOUT,
    )
    procs: list[subprocess.Popen[Any]] = [master]
    res: dict[str, Any] = {}
    try:
        _wait_port(rpc, master, "mooncake_master")
        res["listeners_master"] = check_loopback_only(procs, "mooncake_master")
        seg = total * 2 + (64 << 20)
        base = {"metadata": "P2PHANDSHAKE", "master": f"127.0.0.1:{rpc}",
                "local_buffer": 64 << 20, "sizes": sizes, "total": total, "reps": reps,
                "batches": BATCHES}
        # (a) a store process holds the segment; the client has none: TCP transfer engine
        store = subprocess.Popen(
            [py, "-c", MC_CLIENT, json.dumps({**base, "role": "store", "segment": seg})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(tmp / "mc-store.log", "w"),
            text=True,
        )
        procs.append(store)
        assert store.stdout is not None
        line = store.stdout.readline()
        if '"ready"' not in line:
            raise RuntimeError(f"Mooncake store process did not start: {line.strip()} "
                               f"(see {tmp / 'mc-store.log'})")
        res["listeners_store"] = check_loopback_only(procs, "Mooncake store process")
        res["tcp"] = _mc_client(py, {**base, "role": "tcp", "segment": 0}, tmp, procs, timeout_s)
        assert store.stdin is not None
        store.stdin.close()
        store.wait(30)
        # (b) a client that holds its own segment: gets are an in-process memcpy
        res["local"] = _mc_client(py, {**base, "role": "local", "segment": seg}, tmp, procs,
                                  timeout_s)
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
    return res


def run_mooncake_in_netns(args: argparse.Namespace, tmp: pathlib.Path) -> dict[str, Any]:
    """Run the Mooncake phase in a private network namespace with only ``lo`` up.

    Mooncake 0.3.13 binds its HTTP metadata server, transfer-engine handshake and TCP data
    listeners to 0.0.0.0 whatever the flags say; in a namespace of its own those reach
    nothing but its loopback. Needs root (or user namespaces) and ``unshare``.

    Raises:
        RuntimeError: the namespace cannot be made, or the inner run failed (its stderr).
    """
    import shutil

    if shutil.which("unshare") is None:
        raise RuntimeError("unshare not found: cannot give Mooncake a private network namespace")
    out = tmp / "mooncake.json"
    inner = [sys.executable, str(pathlib.Path(__file__).resolve()), "--mooncake-inner", str(out),
             "--venv", args.venv, "--sizes", args.sizes, "--total", args.total,
             "--reps", str(args.reps), "--timeout", str(args.timeout)] + (["--quick"] if args.quick else [])
    cmd = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', *inner]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=4 * args.timeout + 120)
    if r.returncode != 0 or not out.exists():
        tail = "\n".join(ln for ln in r.stderr.splitlines() if "[info" not in ln)[-1500:]
        raise RuntimeError(f"Mooncake run in a private network namespace failed (rc {r.returncode}): {tail}")
    res: dict[str, Any] = json.loads(out.read_text())
    res["netns"] = "private network namespace, lo only"
    return res


def _mc_client(py: str, cfg: dict[str, Any], tmp: pathlib.Path,
               procs: list[subprocess.Popen[Any]], timeout_s: float) -> dict[str, Any]:
    log = tmp / f"mc-{cfg['role']}.log"
    p = subprocess.Popen([py, "-c", MC_CLIENT, json.dumps(cfg)], stdout=subprocess.PIPE,
                         stderr=open(log, "w"), text=True)
    procs.append(p)
    try:
        time.sleep(0)  # (listeners are checked once the client has set up; see below)
        out, _ = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        raise RuntimeError(f"Mooncake {cfg['role']} client timed out after {timeout_s} s "
                           f"(see {log})") from None
    check_loopback_only(procs, f"Mooncake {cfg['role']} client")
    if p.returncode != 0:
        tail = log.read_text()[-600:]
        raise RuntimeError(f"Mooncake {cfg['role']} client failed (rc {p.returncode}): "
                           f"{out.strip()[-300:]} {tail}")
    got: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    # keys "<bytes>/b<batch>" -> "<size>/b<batch>"
    return {op: {f"{format_size(int(k.split('/')[0]))}/{k.split('/')[1]}": v
                 for k, v in rows.items()} for op, rows in got.items()}


def _wait_port(port: int, proc: subprocess.Popen[Any], what: str) -> None:
    import socket

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within 30 s")


# ---- Redis ---------------------------------------------------------------------------------
def run_redis(tmp: pathlib.Path, sizes: list[int], total: int, reps: int) -> dict[str, Any]:
    res: dict[str, Any] = {}
    with redis_server(tmp) as port:
        if port is None:
            return {"skipped": "redis-server not found"}
        import redis

        r = redis.Redis(port=port)
        for size in sizes:
            n = max(16, total // size)
            val = np.random.default_rng(2).integers(0, 255, size, dtype=np.uint8).data
            for batch in BATCHES:
                keys = [f"rd:{size}:{batch}:{i}" for i in range(n)]
                put_t, get_t = [], []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    for i in range(0, n, batch):
                        p = r.pipeline(transaction=False)
                        for k in keys[i : i + batch]:
                            p.set(k, val)
                        p.execute()
                    put_t.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    for i in range(0, n, batch):
                        p = r.pipeline(transaction=False)
                        for k in keys[i : i + batch]:
                            p.get(k)
                        assert len(p.execute()[0]) == size
                    get_t.append(time.perf_counter() - t0)
                    r.flushall()
                key = f"{format_size(size)}/b{batch}"
                res.setdefault("set", {})[key] = n * size / min(put_t) / 1e9
                res.setdefault("get", {})[key] = n * size / min(get_t) / 1e9
    return res


# ---- main ----------------------------------------------------------------------------------
def install(venv: pathlib.Path) -> None:
    """Create ``venv`` and pip-install Mooncake Store into it (never into the project's venv)."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", PACKAGE, "numpy"], check=True)
    py, why = mooncake_python(venv)
    print(f"installed {PACKAGE} into {venv}" + ("" if py else f"; but: {why}"))


def print_table(results: dict[str, Any]) -> None:
    print(f"\n{results['machine']}; {results['date_utc']} UTC; {results['total']} per size; GB/s")
    kv, mc, rd = results["kvstored"], results.get("mooncake", {}), results.get("redis", {})
    cols = [("kv shm get", kv.get("shm_get", {})), ("kv tcp get", kv.get("tcp_get", {})),
            ("mc local get", mc.get("local", {}).get("get", {})),
            ("mc tcp get", mc.get("tcp", {}).get("get", {})), ("redis get", rd.get("get", {})),
            ("kv shm put", kv.get("shm_put", {})), ("kv tcp put", kv.get("tcp_put", {})),
            ("mc local put", mc.get("local", {}).get("put", {})),
            ("mc tcp put", mc.get("tcp", {}).get("put", {})), ("redis set", rd.get("set", {}))]
    print(f"{'size/batch':>12} " + " ".join(f"{c:>12}" for c, _ in cols) + "   shm/mc-local get, tcp/mc-tcp get, put")
    for key in kv.get("shm_get", {}):
        vals = [d.get(key) for _, d in cols]
        cells = " ".join(f"{v:12.2f}" if v is not None else f"{'-':>12}" for v in vals)

        def ratio(a: float | None, b: float | None) -> str:
            return f"{a / b:.2f}x" if a and b else "-"

        print(f"{key:>12} {cells}   {ratio(vals[0], vals[2])} (>=0.8x), {ratio(vals[1], vals[3])} "
              f"(>=2x); put {ratio(vals[5], vals[7])}, {ratio(vals[6], vals[8])}")
    if "mooncake_skipped" in results:
        print(f"\nMooncake not measured: {results['mooncake_skipped']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--install", action="store_true", help=f"pip install {PACKAGE} into --venv, then exit")
    ap.add_argument("--venv", default=str(VENV))
    ap.add_argument("--total", default="1GiB", help="bytes of values per size")
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="64 MiB per size, 1 MiB and 4 MiB, one rep")
    ap.add_argument("--timeout", type=float, default=600.0, help="per Mooncake client, seconds")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "bench_mooncake.json"))
    ap.add_argument("--no-netns", action="store_true",
                    help="run Mooncake in this network namespace (it then aborts: Mooncake binds 0.0.0.0)")
    ap.add_argument("--mooncake-inner", default=None, help=argparse.SUPPRESS)  # JSON out, in the netns
    args = ap.parse_args()
    venv = pathlib.Path(args.venv)
    if args.install:
        install(venv)
        return
    sizes = [parse_size(s) for s in (["1MiB", "4MiB"] if args.quick else args.sizes.split(","))]
    total = parse_size("64MiB") if args.quick else parse_size(args.total)
    reps = 1 if args.quick else args.reps
    if args.mooncake_inner:
        py, why = mooncake_python(venv)
        assert py is not None, why
        with tempfile.TemporaryDirectory(prefix="kvstored-peer-mc-") as d:
            res = run_mooncake(py, pathlib.Path(d), sizes, total, reps, args.timeout)
        pathlib.Path(args.mooncake_inner).write_text(json.dumps(res))
        return
    results: dict[str, Any] = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                               "machine": machine(), "total": format_size(total)}
    with tempfile.TemporaryDirectory(prefix="kvstored-peer-") as tmpdir:
        tmp = pathlib.Path(tmpdir)
        print("... kvstored", file=sys.stderr)
        results["kvstored"] = run_kvstored(tmp, sizes, total, reps)
        py, why = mooncake_python(venv)
        if py is None:
            results["mooncake_skipped"] = why
        else:
            print("... Mooncake", file=sys.stderr)
            try:
                if args.no_netns:
                    results["mooncake"] = run_mooncake(py, tmp, sizes, total, reps, args.timeout)
                else:
                    results["mooncake"] = run_mooncake_in_netns(args, tmp)
            except ListenerError:
                raise
            except Exception as exc:  # say exactly why, keep the other rows
                results["mooncake_skipped"] = f"{type(exc).__name__}: {exc}"
        print("... Redis", file=sys.stderr)
        results["redis"] = run_redis(tmp, sizes, total, reps)
    print_table(results)
    out = pathlib.Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(finite_or_none(results), indent=2, allow_nan=False))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
