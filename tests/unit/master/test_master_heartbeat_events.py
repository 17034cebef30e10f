"""A heartbeat carrying its round's events (one RPC per node per round) gives the master the
same index, answers and errors as ReportEvents followed by a plain Heartbeat (what a node of
the previous version sends; both stay accepted)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from helpers import ServicerContextStub

from kvstored.clock import FakeClock
from kvstored.master.service import MasterServicer
from kvstored.master.state import MasterState
from kvstored.v1 import master_pb2 as pb

NS = b"\x07" * 16
LEASE_S = 10.0




def _master() -> tuple[MasterServicer, FakeClock]:
    clock = FakeClock()
    return MasterServicer(MasterState(epoch=1, clock=clock, node_lease_s=LEASE_S, initial_blocks=16,
                                      first_generation=10, rng=random.Random(1))), clock


async def _call(servicer: MasterServicer, name: str, req: Any) -> Any:
    try:
        return await getattr(servicer, name)(req, ServicerContextStub())
    except RuntimeError as exc:  # an abort: the same status and text from both
        return str(exc)


def _answer(resp: Any) -> Any:
    if isinstance(resp, str):
        return resp
    return (resp.action, resp.applied_seq if hasattr(resp, "applied_seq") else None,
            resp.node_lease_ms if hasattr(resp, "node_lease_ms") else None)


def _where(servicer: MasterServicer, keys: list[bytes]) -> list[tuple[str, int, int]]:
    out = []
    for k in keys:
        for r in servicer.index.replicas(NS, k, readable_only=True):
            rec = servicer.membership.record_of_holder(r.holder)
            out.append((rec.spec.node_id if rec else "?", int(r.tier), r.generation))
    return sorted(out)


@pytest.mark.parametrize("seed", range(4))
def test_events_in_the_heartbeat_match_report_events_then_heartbeat(seed: int) -> None:
    rng = random.Random(900 + seed)
    keys = [bytes([i]) * 16 for i in range(30)]
    nodes = [f"n{i}" for i in range(4)]

    async def main() -> None:
        one, clock1 = _master()  # heartbeats carrying the events
        two, clock2 = _master()  # ReportEvents, then Heartbeat
        seqs = dict.fromkeys(nodes, 0)
        for n in nodes:
            for m in (one, two):
                info = pb.NodeInfo(node_id=n, epoch=5, grpc_address="127.0.0.1:1",
                                   data_address="127.0.0.1:2")
                await _call(m, "RegisterNode", pb.RegisterNodeRequest(node=info))
                await _call(m, "SyncInventory", pb.SyncInventoryRequest(
                    node_id=n, epoch=5, sync_id=1, last_chunk=True, seq=0))
        for step in range(120):
            n = rng.choice(nodes + ["ghost"])  # "ghost": never registered
            epoch = 5 if rng.random() < 0.95 else 6  # a wrong epoch now and then
            events = []
            for _ in range(rng.randint(0, 12)):
                q = seqs.get(n, 0) + 1
                r = rng.random()
                if r < 0.05:
                    q += rng.randint(1, 3)  # a gap: the node lost track
                elif r < 0.12 and q > 1:
                    q -= rng.randint(1, q - 1)  # an old seq, resent
                seqs[n] = max(seqs.get(n, 0), q)
                kind = rng.choice([1, 1, 2]) if rng.random() > 0.01 else 7  # 7: refused
                events.append(pb.BlockEvent(seq=q, kind=kind, block=pb.BlockRef(
                    namespace_id=NS, key=rng.choice(keys), tier=rng.choice([1, 2]),
                    size_bytes=4096, generation=rng.choice([0, 0, rng.getrandbits(40)]),
                    copy=rng.random() < 0.2)))
            if rng.random() < 0.08 and n != "ghost":  # a chunked sync under way: events refused
                for m in (one, two):
                    await _call(m, "SyncInventory", pb.SyncInventoryRequest(
                        node_id=n, epoch=5, sync_id=1000 + step, last_chunk=False))
            hb = dict(node_id=n, epoch=epoch, tiers=[pb.TierCapacity(tier=1, capacity_bytes=1 << 30,
                                                                      used_bytes=rng.randint(0, 1 << 29))],
                      load=rng.random() * 4, last_seq=seqs.get(n, 0),
                      coldest_age_ms=rng.randint(0, 10_000))
            got1 = await _call(one, "Heartbeat", pb.HeartbeatRequest(**hb, events=events))
            got2 = []
            if events:
                got2.append(await _call(two, "ReportEvents", pb.ReportEventsRequest(
                    node_id=n, epoch=epoch, events=events)))
            if not got2 or not isinstance(got2[0], str):  # a refused ReportEvents ends the round
                got2.append(await _call(two, "Heartbeat", pb.HeartbeatRequest(**hb)))
            if isinstance(got1, str) or any(isinstance(g, str) for g in got2):
                assert got1 == next(g for g in got2 if isinstance(g, str)), step
            else:
                actions = [g.action for g in got2]
                worst = (pb.NODE_ACTION_REREGISTER if pb.NODE_ACTION_REREGISTER in actions
                         else pb.NODE_ACTION_RESYNC if pb.NODE_ACTION_RESYNC in actions
                         else pb.NODE_ACTION_UNSPECIFIED)
                assert got1.action == worst, step
                if events:
                    assert got1.applied_seq == got2[0].applied_seq, step
                assert got1.node_lease_ms == got2[-1].node_lease_ms
            if got1 == pb.NODE_ACTION_RESYNC or (not isinstance(got1, str)
                                                  and got1.action != pb.NODE_ACTION_UNSPECIFIED):
                for m in (one, two):  # the node resyncs (an empty inventory), as MasterLink would
                    await _call(m, "SyncInventory", pb.SyncInventoryRequest(
                        node_id=n, epoch=5, sync_id=step + 2, last_chunk=True, seq=seqs.get(n, 0)))
            assert _where(one, keys) == _where(two, keys), step
            for n2 in nodes:
                r1, r2 = one.membership.node(n2), two.membership.node(n2)
                assert (r1 is None) == (r2 is None)
                if r1 is not None and r2 is not None:
                    assert (r1.applied_seq, r1.gap, r1.synced, r1.load, r1.last_heartbeat_s,
                            r1.coldest_age_s, sorted(r1.tiers.items())) == \
                        (r2.applied_seq, r2.gap, r2.synced, r2.load, r2.last_heartbeat_s,
                         r2.coldest_age_s, sorted(r2.tiers.items())), step
            clock1.advance(0.5)
            clock2.advance(0.5)

    asyncio.run(main())


def test_a_master_says_it_takes_events_in_heartbeats() -> None:
    async def main() -> None:
        m, _ = _master()
        resp = await _call(m, "RegisterNode", pb.RegisterNodeRequest(node=pb.NodeInfo(
            node_id="n", epoch=1, grpc_address="127.0.0.1:1", data_address="127.0.0.1:2")))
        assert resp.heartbeat_carries_events

    asyncio.run(main())


def test_events_before_the_first_sync_completes_are_answered_resync_as_report_events_is() -> None:
    """A node registered whose first inventory is still coming in chunks: a plain heartbeat
    is answered NONE, but its events are refused (RESYNC); the heartbeat that carries them
    answers the stronger action, as the two calls would together."""
    async def main() -> None:
        got = []
        for carried in (True, False):
            m, _ = _master()
            await _call(m, "RegisterNode", pb.RegisterNodeRequest(node=pb.NodeInfo(
                node_id="n", epoch=1, grpc_address="127.0.0.1:1", data_address="127.0.0.1:2")))
            await _call(m, "SyncInventory", pb.SyncInventoryRequest(
                node_id="n", epoch=1, sync_id=1, last_chunk=False))
            ev = [pb.BlockEvent(seq=1, kind=1, block=pb.BlockRef(namespace_id=NS, key=b"k" * 16,
                                                                 tier=1, size_bytes=1))]
            if carried:
                resp = await _call(m, "Heartbeat", pb.HeartbeatRequest(
                    node_id="n", epoch=1, last_seq=1, events=ev))
                got.append(resp.action)
            else:
                r1 = await _call(m, "ReportEvents", pb.ReportEventsRequest(node_id="n", epoch=1,
                                                                           events=ev))
                r2 = await _call(m, "Heartbeat", pb.HeartbeatRequest(node_id="n", epoch=1,
                                                                     last_seq=1))
                assert r2.action == pb.NODE_ACTION_UNSPECIFIED
                got.append(r1.action)
            assert _where(m, [b"k" * 16]) == []
        assert got == [pb.NODE_ACTION_RESYNC, pb.NODE_ACTION_RESYNC]

    asyncio.run(main())
