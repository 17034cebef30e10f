"""The master driven by N simulated nodes: master CPU per second of cluster time, N = 10..1000.

One process, no gRPC transport: the real ``MasterServicer`` handlers (protobuf requests in,
protobuf answers out; membership, block index and service logic as in ``kvstored master``)
are awaited directly, with a :class:`~kvstored.clock.FakeClock` as the master's clock. Each
simulated node is an engine host that replays the Mooncake conversation trace
(kvstored/scheduler/traces/, loaded with ``load_trace`` as the scheduler replay does), each
node from its own offset, at ``--requests-per-node-s`` requests per second of cluster time.
Per request the node asks the master ``LookupPrefix`` of the request's blocks (the trace's
``hash_ids``, shared across nodes, so nodes hit each other's blocks), then "puts" the blocks
it lacks into its own LRU of ``--node-blocks`` blocks (evicting the oldest). Every second of
cluster time each node sends one ``Heartbeat`` carrying its events (its puts and evictions
since the last one, per-epoch seqs), as MasterLink sends a round to a master that says
``heartbeat_carries_events``; ``--separate-calls``: one ``ReportEvents`` and then one
``Heartbeat``, as a node of the previous version does. Nodes start with a full LRU, registered and
synced (``SyncInventory``) before the timed part.

Measured: the process CPU time spent inside master handlers only (node-side bookkeeping and
request building are outside the timed calls), per second of cluster time, split by RPC.
The timed calls are made as the gRPC server makes them (``master_method_handlers``, or the
generated handlers of a master without it: the request's wire bytes parsed, the handler, the
answer serialized, all timed; the transport is not). ``--separate-calls`` on a master
without events in heartbeats (an older main) measures that main the same way.
Growth is reported as the ratio per 10x nodes (1.0 per 10x = constant; 10 = linear in N,
which is expected since the load grows with N; more than 10 = superlinear).

Also reported: the index's replicas, its numpy bytes, and the rows of hot chains (blocks
with more than 16 replicas keep maps of their rows: C tables, native/master_hot.h, or the Python
dicts of master/columns.py ``PyHotChains`` with ``--impl python``), and the maps' bytes.

The simulated nodes keep their pending events as tuples and build the messages when they
send them (as MasterLink does): the collections of Python's cyclic GC run inside whatever
call allocates when they fall due, so a simulator holding ~1M event messages at 10,000
nodes made the master's calls pay full collections of the simulator's objects (0.45 s/s
of GC at 10,000 nodes; 2.24-3.18 s/s in all before, 1.68-2.85 with this, the same minutes
on loaded shared cores). The collections that run inside timed calls are counted and timed
(``gc_in_timed_calls``).

``--impl python`` runs the index's numpy loops and protobuf field reads instead of their C
versions (native/master.c, the default; kvstored/native.py ``master_index``); ``--profile N``
prints the N costliest functions (cProfile with process time, inside the handlers only).

Usage:  python bench/bench_master_sim.py [--nodes 10,100,1000,10000] [--seconds 10]
        [--requests-per-node-s 2] [--node-blocks 2000 | 2000,2000,2000,200]
        [--impl native|python] [--separate-calls] [--profile N] [--out bench/results/bench_master_sim.json]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import math
import pstats
import random
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from kvstored import log as kvlog
from kvstored import native
from kvstored.clock import FakeClock
from kvstored.master.service import MasterServicer
from kvstored.v1 import master_pb2_grpc as pb_grpc

try:
    from kvstored.master.service import master_method_handlers
except ImportError:  # a master before issue 19's wire handlers (to compare with an older main)
    master_method_handlers = None
from kvstored.master.state import MasterState
from kvstored.scheduler.trace import load_trace, resolve_trace
from kvstored.v1 import master_pb2 as pb

NS = b"\x07" * 16
BLOCK_BYTES = 1 << 20
LEASE_S = 10.0


class _Context:
    """The part of a grpc.aio ServicerContext the master's handlers use (their log lines
    name the peer; an error would abort)."""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def set_trailing_metadata(self, md: object) -> None:
        pass

    async def abort(self, code: object, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


_CTX = _Context()
_WIRE = ("Heartbeat", "LookupPrefix", "ReportEvents")
"""The timed calls, made through the server's method handlers (``master_method_handlers``):
the request's bytes parsed, the handler, the answer serialized, all inside the timed part."""
_ANSWERS = {"Heartbeat": pb.HeartbeatResponse, "LookupPrefix": pb.MasterLookupPrefixResponse,
            "ReportEvents": pb.ReportEventsResponse}


class _Handlers:
    """Takes the method handlers the generated ``add_MasterServiceServicer_to_server``
    registers (for a master without ``master_method_handlers``)."""

    handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.handlers = dict(handlers)


def server_handlers(servicer: MasterServicer) -> dict[str, Any]:
    """The method handlers the master's gRPC server would call."""
    if master_method_handlers is not None:
        return master_method_handlers(servicer)  # type: ignore[no-any-return]
    got = _Handlers()
    pb_grpc.add_MasterServiceServicer_to_server(servicer, got)
    return got.handlers


class _GcWatch:
    """Counts the collections of the cyclic GC that run inside timed calls, and their
    process time (a ``gc.callbacks`` entry): they are part of the master CPU measured."""

    def __init__(self) -> None:
        self.timed = False
        self.collections = [0, 0, 0]
        self.cpu_s = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if not self.timed:
            return
        if phase == "start":
            self._start = time.process_time()
        else:
            self.collections[info["generation"]] += 1
            self.cpu_s += time.process_time() - self._start


def _key(hash_id: int) -> bytes:
    return hash_id.to_bytes(16, "little")


class SimNode:
    """One simulated node: an LRU of block keys, a trace cursor, pending events."""

    def __init__(self, i: int, trace: list[tuple[int, ...]], capacity: int, rng: random.Random):
        self.node_id = f"sim-{i:04d}"
        self.epoch = 1_000_000 + i
        self.trace = trace
        self.cursor = rng.randrange(len(trace))
        self.capacity = capacity
        self.lru: OrderedDict[bytes, None] = OrderedDict()
        self.seq = 0
        # (seq, kind, key) as MasterLink keeps them: the messages are built when sent (931k
        # BlockEvent messages alive for a second at 10,000 nodes made the GC's full
        # collections, which ran inside the timed calls, scan the simulator's objects)
        self.events: list[tuple[int, int, bytes]] = []
        while len(self.lru) < capacity:  # start full, from the trace's own blocks
            for h in self.next_request():
                self.lru[_key(h)] = None
        while len(self.lru) > capacity:
            self.lru.popitem(last=False)

    def next_request(self) -> tuple[int, ...]:
        ids = self.trace[self.cursor]
        self.cursor = (self.cursor + 1) % len(self.trace)
        return ids

    def _event(self, kind: int, key: bytes) -> None:
        self.seq += 1
        self.events.append((self.seq, kind, key))

    def event_messages(self) -> list[pb.BlockEvent]:
        """The pending events as the node sends them."""
        return [pb.BlockEvent(seq=q, kind=kind, block=pb.BlockRef(
            namespace_id=NS, key=key, tier=1, size_bytes=BLOCK_BYTES))
            for q, kind, key in self.events]

    def put_missing(self, keys: list[bytes]) -> None:
        for k in keys:
            if k in self.lru:
                self.lru.move_to_end(k)
                continue
            self.lru[k] = None
            self._event(pb.BLOCK_EVENT_KIND_ADDED, k)
            if len(self.lru) > self.capacity:
                old, _ = self.lru.popitem(last=False)
                self._event(pb.BLOCK_EVENT_KIND_REMOVED, old)

    def info(self) -> pb.NodeInfo:
        return pb.NodeInfo(node_id=self.node_id, epoch=self.epoch,
                           grpc_address="127.0.0.1:1", data_address="127.0.0.1:2",
                           tiers=[self.usage()], transports=["tcp"])

    def usage(self) -> pb.TierCapacity:
        return pb.TierCapacity(tier=1, capacity_bytes=self.capacity * BLOCK_BYTES,
                               used_bytes=len(self.lru) * BLOCK_BYTES, num_blocks=len(self.lru))


def run(num_nodes: int, seconds: int, rate: float, node_blocks: int,
        trace: list[tuple[int, ...]], profiler: cProfile.Profile | None = None,
        separate: bool = False) -> dict[str, Any]:
    clock = FakeClock()
    servicer = MasterServicer(MasterState(epoch=1, clock=clock, node_lease_s=LEASE_S,
                                          first_generation=10, rng=random.Random(1)))
    rng = random.Random(num_nodes)
    nodes = [SimNode(i, trace, node_blocks, rng) for i in range(num_nodes)]
    cpu: dict[str, float] = {"Heartbeat": 0.0, "ReportEvents": 0.0, "LookupPrefix": 0.0}
    calls = {k: 0 for k in cpu}
    hits = asked = num_events = 0

    handlers = server_handlers(servicer)  # as the gRPC server calls them
    gc_watch = _GcWatch()

    async def call(name: str, req: Any, timed: bool = True) -> Any:
        h = handlers[name] if name in _WIRE else None
        data = req.SerializeToString() if h is not None else b""  # the node's work: not timed
        if timed and profiler is not None:
            profiler.enable()
        gc_watch.timed = timed
        c = time.process_time()
        if h is not None:  # the server's whole part: parse, handler, answer's bytes
            out = h.response_serializer(await h.unary_unary(h.request_deserializer(data), _CTX))
        else:
            resp = await getattr(servicer, name)(req, _CTX)
        gc_watch.timed = False
        if timed:
            cpu[name] += time.process_time() - c
            if profiler is not None:
                profiler.disable()
            calls[name] += 1
        if h is not None:
            resp = _ANSWERS[name].FromString(out)  # read as the node reads it: not timed
        return resp

    async def main() -> None:
        nonlocal hits, asked, num_events
        t0 = time.perf_counter()
        for n in nodes:  # setup (not timed): register, sync a full LRU
            await call("RegisterNode", pb.RegisterNodeRequest(node=n.info()), timed=False)
            await call("SyncInventory", pb.SyncInventoryRequest(
                node_id=n.node_id, epoch=n.epoch, sync_id=1, last_chunk=True, seq=0,
                blocks=[pb.BlockRef(namespace_id=NS, key=k, tier=1, size_bytes=BLOCK_BYTES)
                        for k in n.lru]), timed=False)
        setup_s = time.perf_counter() - t0
        carry = [0.0] * num_nodes
        for _ in range(seconds):
            gc.collect()
            # each node: its requests of this second (lookups), then its events, heartbeat
            order = list(range(num_nodes))
            rng.shuffle(order)
            for i in order:
                n = nodes[i]
                carry[i] += rate
                while carry[i] >= 1.0:
                    carry[i] -= 1.0
                    keys = [_key(h) for h in n.next_request()]
                    resp = await call("LookupPrefix", pb.MasterLookupPrefixRequest(
                        namespace_id=NS, keys=keys, local_node_id=n.node_id))
                    asked += len(keys)
                    hits += len(resp.tier)
                    n.put_missing(keys)
            for i in order:
                n = nodes[i]
                num_events += len(n.events)
                if n.events and separate:  # a node of the previous version
                    resp = await call("ReportEvents", pb.ReportEventsRequest(
                        node_id=n.node_id, epoch=n.epoch, events=n.event_messages()))
                    assert resp.action == pb.NODE_ACTION_UNSPECIFIED, resp
                    assert resp.applied_seq == n.seq
                    n.events = []
                # as MasterLink sends it: the round's events in the heartbeat (one RPC)
                hb = pb.HeartbeatRequest(node_id=n.node_id, epoch=n.epoch, tiers=[n.usage()],
                                         load=1.0, last_seq=n.seq)
                if n.events:
                    hb.events.extend(n.event_messages())
                resp = await call("Heartbeat", hb)
                assert resp.action == pb.NODE_ACTION_UNSPECIFIED, resp
                if n.events:
                    assert resp.applied_seq == n.seq
                    n.events = []
            clock.advance(1.0)
        run.setup_s = setup_s  # type: ignore[attr-defined]

    gc.callbacks.append(gc_watch)
    try:
        asyncio.run(main())
    finally:
        gc.callbacks.remove(gc_watch)
    total = sum(cpu.values())
    cols = servicer.index.columns
    return {"nodes": num_nodes, "seconds": seconds, "requests_per_node_s": rate,
            "node_blocks": node_blocks, "index_replicas": servicer.index.num_replicas,
            "index_blocks": servicer.index.num_blocks,
            "index_column_bytes": servicer.index.memory_bytes(),
            "hot_chains": len(cols.hot), "hot_chain_rows": cols.hot.num_rows,
            "hot_chain_bytes": cols.hot.nbytes, "hot_chain_maps": type(cols.hot).__name__,
            "setup_s": round(run.setup_s, 2),  # type: ignore[attr-defined]
            "master_cpu_s_per_s": total / seconds,
            "by_rpc_cpu_s_per_s": {k: v / seconds for k, v in cpu.items()},
            "calls_per_s": {k: v / seconds for k, v in calls.items()},
            "cpu_us_per_call": {k: (cpu[k] / calls[k] * 1e6 if calls[k] else 0.0) for k in cpu},
            "events_per_s": num_events / seconds, "hit_fraction": hits / max(asked, 1),
            "gc_in_timed_calls": {"collections_by_generation": gc_watch.collections,
                                  "cpu_s_per_s": gc_watch.cpu_s / seconds}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="10,100,1000")
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--requests-per-node-s", type=float, default=2.0)
    ap.add_argument("--node-blocks", default="2000",
                    help="blocks per node's LRU: one for every --nodes entry, or one per entry")
    ap.add_argument("--trace", default="conversation")
    ap.add_argument("--impl", choices=("native", "python"), default="native",
                    help="the index's hot loops: C (native/master.c) or the numpy fallback")
    ap.add_argument("--separate-calls", action="store_true",
                    help="nodes of the previous version: ReportEvents, then Heartbeat, per round "
                         "(the default: the events in the Heartbeat, as MasterLink now sends them)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="print the N costliest functions (cProfile, process time, handlers only)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/bench_master_sim.json"))
    args = ap.parse_args()
    if args.impl == "python":
        native.master_index = None  # read at each call by keytable.py and ranking.py
    elif native.master_index is None:
        raise SystemExit(f"--impl native: the C index is not built ({native.FALLBACK_REASON}); "
                         f"python setup.py build_ext --inplace builds it")
    kvlog.configure(level="warning")  # the master logs every registration and sync
    trace = [r.hash_ids for r in load_trace(resolve_trace(args.trace))]
    rows = []
    sizes = [int(s) for s in args.nodes.split(",")]
    blocks = [int(s) for s in args.node_blocks.split(",")]
    if len(blocks) == 1:
        blocks *= len(sizes)
    if len(blocks) != len(sizes):
        raise SystemExit(f"--node-blocks needs one value or one per --nodes entry "
                         f"({len(sizes)}); got {len(blocks)}")
    for n, nb in zip(sizes, blocks, strict=True):
        prof = cProfile.Profile(time.process_time) if args.profile else None
        rows.append(run(n, args.seconds, args.requests_per_node_s, nb, trace, prof,
                        separate=args.separate_calls))
        r = rows[-1]
        r["impl"] = args.impl
        r["separate_calls"] = args.separate_calls
        if prof is not None:
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
        g = r["gc_in_timed_calls"]
        print(f"nodes {n:,}: {r['master_cpu_s_per_s']:.3f} s/s ({r['by_rpc_cpu_s_per_s']}), "
              f"setup {r['setup_s']} s; GC in timed calls: collections by generation "
              f"{g['collections_by_generation']}, {g['cpu_s_per_s']:.4f} s/s", flush=True)
        gc.collect()
    print("\n| nodes | node LRU blocks | index replicas | hot-chain rows | master CPU s per s |"
          " x per 10x nodes | Heartbeat us/call | ReportEvents us/call | LookupPrefix us/call |"
          " events/s | lookups/s | hit fraction |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    prev = None
    for r in rows:
        grow = ""
        if prev is not None:
            f = r["nodes"] / prev["nodes"]
            grow = f"x{(r['master_cpu_s_per_s'] / prev['master_cpu_s_per_s']) ** (1 / math.log10(f)):.1f}"
        u = r["cpu_us_per_call"]
        print(f"| {r['nodes']:,} | {r['node_blocks']:,} | {r['index_replicas']:,} | "
              f"{r['hot_chain_rows']:,} | {r['master_cpu_s_per_s']:.4f} | {grow} | "
              f"{u['Heartbeat']:.0f} | {u['ReportEvents']:.0f} | {u['LookupPrefix']:.0f} | "
              f"{r['events_per_s']:,.0f} | {r['calls_per_s']['LookupPrefix']:,.0f} | "
              f"{r['hit_fraction']:.2f} |")
        prev = r
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows}, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
