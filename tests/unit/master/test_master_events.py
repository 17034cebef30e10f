"""KV events for routers (kvstored/kv_events.py, master/observed.py, master/events.py):
the encoding, which index changes are reported, batching, seq numbers and replay."""

from __future__ import annotations

import inspect
from typing import Any

import msgspec
import pytest
from helpers import key
from master_helpers import LEASE_S, NS, spec

from kvstored.client.events import EventSubscriber
from kvstored.clock import FakeClock
from kvstored.errors import InvalidArgument
from kvstored.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
    removed_event,
    stored_event,
)
from kvstored.master.events import EventBatcher, KVEventPublisher, PublisherSettings, ReplayBuffer
from kvstored.master.index import BlockIndex
from kvstored.master.observed import UNOBSERVED_METHODS, ObservedBlockIndex
from kvstored.master.state import MasterState
from kvstored.master.types import BlockRef, ReplicaState
from kvstored.types import Tier

pytestmark = pytest.mark.timeout(60)


# ---- encoding ------------------------------------------------------------------------
class _VllmLikeStored(msgspec.Struct, omit_defaults=True, tag="BlockStored"):
    """vLLM's BlockStored as it declares it (no kvstored extensions)."""

    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class _VllmLikeBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[_VllmLikeStored]
    data_parallel_rank: int | None = None


def test_batch_is_an_array_and_events_are_tagged_maps_with_vllms_fields() -> None:
    ev = stored_event([key(1), key(2)], node_id="a", tier=Tier.SSD, namespace_id=NS)
    raw = msgspec.msgpack.decode(encode_batch(KVEventBatch(ts=1.5, events=[ev])))
    assert raw[0] == 1.5 and raw[2] is None  # [ts, events, data_parallel_rank]
    assert list(raw[1][0]) == ["type", "block_hashes", "parent_block_hash", "token_ids",
                               "block_size", "lora_id", "medium", "lora_name", "node_id",
                               "tier", "namespace_id"]
    assert raw[1][0]["type"] == "BlockStored" and raw[1][0]["medium"] == "STORAGE"


def test_a_decoder_without_the_extensions_ignores_them() -> None:
    ev = stored_event([key(1)], node_id="node-a", tier=Tier.DRAM, namespace_id=NS)
    got = msgspec.msgpack.Decoder(_VllmLikeBatch).decode(
        encode_batch(KVEventBatch(ts=2.0, events=[ev])))
    assert got.events[0].block_hashes == [key(1)] and got.events[0].medium == "CPU"
    assert not hasattr(got.events[0], "node_id")


def test_round_trip_and_a_bad_payload_is_named() -> None:
    batch = KVEventBatch(ts=3.0, events=[AllBlocksCleared(), removed_event(
        [key(3)], node_id="b", tier=Tier.DRAM, namespace_id=NS)])
    assert decode_batch(encode_batch(batch)) == batch
    with pytest.raises(InvalidArgument, match="not a KV event batch .3 bytes"):
        decode_batch(b"\x01\x02\x03")


# ---- which index changes are reported -------------------------------------------------
class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[bytes], int, Tier]] = []

    def replicas_changed(self, namespace_id: bytes, keys: Any, *, holder: int, tier: Tier,
                         visible: bool) -> None:
        self.calls.append(("+" if visible else "-", list(keys), holder, tier))


def test_visible_replica_changes_are_reported_exactly() -> None:
    rec = _Recorder()
    ix = ObservedBlockIndex(rec, 16)
    h = ix.add_holder()
    ix.add_replica(NS, key(1), holder=h, tier=Tier.DRAM, size_bytes=8, generation=1)
    assert rec.calls == []  # holder not readable yet
    ix.set_readable(h, True)
    assert rec.calls == [("+", [key(1)], h, Tier.DRAM)]
    ix.add_replica(NS, key(1), holder=h, tier=Tier.DRAM, size_bytes=8, generation=1)
    ix.add_replica(NS, key(2), holder=h, tier=Tier.SSD, size_bytes=8, generation=5,
                   state=ReplicaState.WRITING)
    assert len(rec.calls) == 1  # an idempotent re-add and a WRITING row: nothing visible
    assert ix.commit_generation(NS, key(2), 5) == 1
    assert rec.calls[-1] == ("+", [key(2)], h, Tier.SSD)
    ix.add_replicas_bulk(NS, [key(1), key(3), key(3)], holder=h, tiers=[int(Tier.DRAM)] * 3,
                         sizes=[8, 8, 8], generation=7)
    assert rec.calls[-1] == ("+", [key(3)], h, Tier.DRAM)  # key 1 was visible already
    assert ix.remove_replica(NS, key(1), holder=h, tier=Tier.DRAM)
    assert rec.calls[-1] == ("-", [key(1)], h, Tier.DRAM)
    ix.set_readable(h, False)
    assert sorted(rec.calls[-2:]) == [("-", [key(2)], h, Tier.SSD), ("-", [key(3)], h, Tier.DRAM)]
    n = len(rec.calls)
    ix.retire_holder(h)  # unreadable already: nothing more to remove
    assert len(rec.calls) == n


def test_every_mutating_index_method_is_observed_or_declared_unobserved() -> None:
    read_only = {"columns", "num_replicas", "num_blocks", "num_garbage_rows", "column_bytes",
                 "memory_bytes", "is_readable", "num_holder_replicas", "holder_keys",
                 "replicas", "replication_factor", "replication_factors",
                 "blocks_above_factor", "lookup_prefix", "lookup_each", "lookup_wire",
                     "copy_holders_to_promote"}
    observed = {n for n, v in vars(ObservedBlockIndex).items()
                if not n.startswith("_") and callable(v)}
    public = {n for n, _ in inspect.getmembers(BlockIndex) if not n.startswith("_")}
    unclassified = public - read_only - observed - UNOBSERVED_METHODS
    assert not unclassified, f"classify these BlockIndex methods in master/observed.py: " \
                             f"{sorted(unclassified)}"


def test_a_lapsed_lease_reports_removals_under_the_node_id() -> None:
    # regression: membership forgot the holder's node before the index retired it
    rec = _Recorder()
    clock = FakeClock()
    state = MasterState(epoch=100, clock=clock, node_lease_s=LEASE_S, initial_blocks=16,
                        observer=rec)
    names: list[str | None] = []
    state.membership.register(spec("a"))
    state.membership.sync_inventory("a", 1, sync_id=1, last_chunk=True, seq=0,
                                    blocks=[BlockRef(NS, key(i), Tier.DRAM, 8) for i in (1, 2)])
    holder = rec.calls[-1][2]
    assert rec.calls == [("+", [key(1), key(2)], holder, Tier.DRAM)]
    rec.replicas_changed = (lambda ns, keys, *, holder, tier, visible:  # type: ignore[method-assign]
                            names.append(state.node_of_holder(holder)))
    clock.advance(LEASE_S + 1)
    assert state.membership.expire_lapsed() == ["a"]
    assert names == ["a"]


# ---- batching -------------------------------------------------------------------------
def _st(*ids: int, node: str = "a") -> BlockStored:
    return stored_event([key(i) for i in ids], node_id=node, tier=Tier.DRAM, namespace_id=NS)


def test_batcher_merges_splits_and_seals_on_size_or_age() -> None:
    b = EventBatcher(max_events=3, batch_ms=10)
    assert b.add(_st(1), 0.0) == [] and b.due_in_s(0.004) == pytest.approx(0.006)
    assert b.take_due(0.009) is None
    full = b.add(_st(2, 3, 4, 5), 0.005)  # merged with the pending event, then split at 3
    assert [[e.block_hashes for e in batch] for batch in full] == [[[key(1), key(2), key(3)]]]
    assert b.due_in_s(0.006) == pytest.approx(0.009)  # keys 4-5 pending since 0.005
    full = b.add(_st(6, node="b"), 0.006)  # another node: a separate event; 3 blocks: full
    assert [[(e.node_id, e.block_hashes) for e in batch] for batch in full] == [
        [("a", [key(4), key(5)]), ("b", [key(6)])]]
    assert b.add(_st(7), 0.020) == [] and b.take_due(0.0299) is None
    due = b.take_due(0.030)
    assert due is not None and [e.block_hashes for e in due] == [[key(7)]]
    assert b.due_in_s(1.0) is None
    with pytest.raises(InvalidArgument, match="max_events must be >= 1, got 0"):
        EventBatcher(max_events=0)


def test_replay_buffer_is_bounded() -> None:
    buf = ReplayBuffer(2)
    for s in range(4):
        buf.append(s, b"%d" % s)
    assert list(buf.since(0)) == [(2, b"2"), (3, b"3")] and buf.oldest_seq == 2
    with pytest.raises(InvalidArgument, match="events_buffer_steps must be >= 1, got 0"):
        ReplayBuffer(0)


# ---- the publisher over real sockets ----------------------------------------------------
def test_publisher_numbers_batches_and_replays_from_a_seq() -> None:
    pub = KVEventPublisher(PublisherSettings(
        endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", buffer_steps=3,
        max_events=2, batch_ms=0), node_of=lambda h: f"n{h}")
    pub.start()
    try:
        pub.new_term()
        assert pub.flush()  # seq 0
        for i in range(4):  # one batch each (a flush seals the open batch): seq 1-4
            pub.replicas_changed(NS, [key(i)], holder=7, tier=Tier.SSD, visible=i != 3)
            assert pub.flush()
        with EventSubscriber(pub.endpoint, pub.replay_endpoint) as sub:
            got = list(sub.batches(from_seq=0, count=3, timeout_s=5))
            assert [s for s, _ in got] == [2, 3, 4]  # seq 0-1 fell out of the 3-batch buffer
            ev = got[-1][1].events[0]
            assert isinstance(ev, BlockRemoved) and ev.node_id == "n7" and ev.tier == "SSD"
            # a late subscriber missed the live batches: the gap is filled from the replay
            pub.replicas_changed(NS, [key(9)], holder=7, tier=Tier.DRAM, visible=True)
            assert pub.flush()
            later = list(sub.batches(from_seq=4, count=2, timeout_s=5))
            assert [s for s, _ in later] == [4, 5]
            assert later[1][1].events[0].block_hashes == [key(9)]
    finally:
        pub.stop()
    assert pub.num_batches == 6 and pub.num_dropped == 0


def test_first_event_of_a_term_is_all_blocks_cleared() -> None:
    pub = KVEventPublisher(PublisherSettings(endpoint="tcp://127.0.0.1:0",
                                             replay_endpoint="tcp://127.0.0.1:0", batch_ms=0))
    pub.start()
    try:
        state = MasterState(epoch=5, clock=FakeClock(), initial_blocks=16, observer=pub)
        pub.node_of = state.node_of_holder
        pub.new_term()
        assert pub.flush()  # seq 0; the sync's BlockStored is seq 1
        state.membership.register(spec("a"))
        state.membership.sync_inventory("a", 1, sync_id=1, last_chunk=True, seq=0,
                                        blocks=[BlockRef(NS, key(1), Tier.DRAM, 8)])
        assert pub.flush()
        with EventSubscriber(pub.endpoint, pub.replay_endpoint) as sub:
            events = [e for _, b in sub.batches(from_seq=0, count=2, timeout_s=5)
                      for e in b.events]
    finally:
        pub.stop()
    assert isinstance(events[0], AllBlocksCleared)
    assert isinstance(events[1], BlockStored) and events[1].node_id == "a"


def test_bad_endpoints_are_named() -> None:
    with pytest.raises(InvalidArgument, match="--endpoint must be a ZeroMQ address.*'localhost:1'"):
        EventSubscriber("localhost:1")
    from kvstored.errors import ConfigInvalid

    pub = KVEventPublisher(PublisherSettings(endpoint="tcp://no-such-host-x:1"))
    with pytest.raises(ConfigInvalid, match="cannot bind master.events_endpoint"):
        pub.start()


def test_kvstorectl_events_prints_json_lines_and_names_a_bad_endpoint() -> None:
    import json

    from click.testing import CliRunner

    from kvstored.cli.kvstorectl import main as kvstorectl

    pub = KVEventPublisher(PublisherSettings(endpoint="tcp://127.0.0.1:0",
                                             replay_endpoint="tcp://127.0.0.1:0"),
                           node_of=lambda h: "n1")
    pub.start()
    try:
        pub.new_term()
        assert pub.flush()  # seq 0
        pub.replicas_changed(NS, [key(1), key(2)], holder=0, tier=Tier.DRAM, visible=True)
        assert pub.flush()  # seq 1
        r = CliRunner().invoke(kvstorectl, [
            "--output", "json", "events", "--endpoint", pub.endpoint,
            "--replay-endpoint", pub.replay_endpoint, "--from-seq", "0", "--count", "2"])
    finally:
        pub.stop()
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.output.splitlines()]
    assert [(x["seq"], x["type"]) for x in lines] == [(0, "AllBlocksCleared"), (1, "BlockStored")]
    assert lines[1]["block_hashes"] == [key(1).hex(), key(2).hex()]
    assert (lines[1]["node_id"], lines[1]["tier"], lines[1]["medium"]) == ("n1", "DRAM", "CPU")
    bad = CliRunner().invoke(kvstorectl, ["events", "--endpoint", "127.0.0.1:1"])
    assert bad.exit_code == 2 and "must be a ZeroMQ address" in bad.output
    bad = CliRunner().invoke(kvstorectl, ["events", "--endpoint", "tcp://127.0.0.1:1",
                                          "--from-seq", "0"])
    assert bad.exit_code == 2 and "--from-seq needs --replay-endpoint" in bad.output


def test_a_replay_endpoint_without_an_endpoint_is_refused_at_load() -> None:
    from kvstored.config import load_config
    from kvstored.errors import ConfigInvalid

    with pytest.raises(ConfigInvalid, match="events_replay_endpoint needs master.events_endpoint"):
        load_config(None, overrides={"master": {"events_replay_endpoint": "tcp://127.0.0.1:1"}},
                    environ={})


def test_a_detached_index_of_an_ended_term_reports_nothing() -> None:
    rec = _Recorder()
    ix = ObservedBlockIndex(rec, 16)
    h = ix.add_holder()
    ix.set_readable(h, True)
    ix.detach()  # MasterDaemon._lead does it to the earlier term's index
    ix.add_replica(NS, key(1), holder=h, tier=Tier.DRAM, size_bytes=8, generation=1)
    ix.retire_holder(h)
    assert rec.calls == []
