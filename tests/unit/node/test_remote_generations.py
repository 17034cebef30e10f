"""RemoteReads against sources whose stores stamp their own generations (no test double).

The master is a dict the test controls, naming each replica under the generation the
source's store reported for it (what the real master indexes from the source's events and
inventory). Races are held at ``before_copy`` / ``before_verify``; nothing waits on a sleep.

- A copy is verified by the generation the source sends: one master lookup per read.
- A block replaced with other bytes between the lookup and the send (inside one heartbeat:
  the master still names the old replica) is dropped; with a source sending 0 (the old
  master-only check) its new bytes would be served.
- An SSD-only block, promoted by the copy's own pin, keeps its generation: copied at once.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
from helpers import key
from remote_helpers import DataPlanes, local_fixture, make_core
from remote_helpers import FakeMaster as _FakeMaster
from remote_helpers import local_bytes as _local_bytes
from remote_helpers import make_reads as _reads

from kvstored.node.core import NodeCore
from kvstored.transport.master_rpc import ClusterReplica
from kvstored.types import Tier

BLOCK = 32 << 10


def value(i: int, salt: int = 0) -> bytes:
    return bytes([(i + salt) % 251]) * BLOCK


def _core(node_id: str, *, dram_bytes: int = 4 << 20, ssd_dir: pathlib.Path | None = None
          ) -> NodeCore:
    return make_core(node_id, block_bytes=BLOCK, dram_bytes=dram_bytes, ssd_dir=ssd_dir)


def generation_of(core: NodeCore, k: bytes, tier: Tier) -> int:
    """The generation the source's store reported for its replica (events, inventory)."""
    blocks, _ = core.store.list_blocks(limit=1 << 20)
    b = next(b for b in blocks if b.key == k)
    return dict(zip(b.tiers, b.generations, strict=True))[tier]


class FakeMaster(_FakeMaster):
    """The helpers' master, naming replicas under the generation their source stamped."""

    def name(self, src: NodeCore, address: str, i: int, tier: Tier = Tier.DRAM) -> None:
        """Index the source's replica of block ``i`` as its events would."""
        self.replicas[key(i)] = ClusterReplica("src", 7, tier, BLOCK,
                                               generation_of(src, key(i), tier), address)


@pytest.fixture
def make_source(tmp_path: pathlib.Path) -> Iterator[object]:
    planes = DataPlanes()

    def factory(**kw: object) -> tuple[NodeCore, str]:
        core = _core("src", **kw)  # type: ignore[arg-type]
        return core, planes.serve(core)

    yield factory
    planes.close()


local = local_fixture(BLOCK)


def test_a_copy_is_verified_by_the_sources_generation_without_a_second_lookup(
    make_source: object, local: NodeCore
) -> None:
    src, address = make_source()  # type: ignore[operator]
    master = FakeMaster()
    for i in (1, 2, 3):
        src.put_inline([(key(i), value(i), b"m")], b"")
        master.name(src, address, i)
    reads = _reads(local, master)
    try:
        got = reads.fill([key(1), key(2), key(3)], b"")
        assert (got.num_fetched, got.num_dropped, got.num_failed) == (3, 0, 0)
        assert master.lookups == 1  # the read's lookup; the copies needed no master call
        assert _local_bytes(local, [1, 2, 3]) == [value(1), value(2), value(3)]
    finally:
        reads.close()


def test_a_block_replaced_with_other_bytes_before_the_send_is_dropped(
    make_source: object, local: NodeCore
) -> None:
    src, address = make_source()  # type: ignore[operator]
    master = FakeMaster()
    for i in (1, 2):
        src.put_inline([(key(i), value(i), b"m")], b"")
        master.name(src, address, i)
    named = master.replicas[key(2)].generation

    def replace_block_2() -> None:  # after the lookup, before the GET, inside one heartbeat:
        assert src.store.remove([key(2)]) == [True]  # the master never hears of it in time
        src.put_inline([(key(2), value(2, salt=9), b"m")], b"")  # same size, other bytes

    reads = _reads(local, master, before_copy=replace_block_2)
    try:
        got = reads.fill([key(1), key(2)], b"")
        assert generation_of(src, key(2), Tier.DRAM) != named  # a new replica, a new name
        assert (got.num_fetched, got.num_dropped) == (1, 1)
        assert _local_bytes(local, [1, 2]) == [value(1), None]  # never the replaced bytes
        assert local.store.stats().tiers[0].num_blocks == 1  # the dropped copy's space is back
    finally:
        reads.close()


def test_a_replaced_block_the_master_names_by_verification_time_is_served(
    make_source: object, local: NodeCore
) -> None:
    src, address = make_source()  # type: ignore[operator]
    master = FakeMaster()
    src.put_inline([(key(1), value(1), b"m")], b"")
    master.name(src, address, 1)

    def replace() -> None:
        src.store.remove([key(1)])
        src.put_inline([(key(1), value(1, salt=3), b"m")], b"")

    def master_heard() -> None:  # a heartbeat came between the send and the verification
        master.name(src, address, 1)

    reads = _reads(local, master, before_copy=replace, before_verify=master_heard)
    try:
        got = reads.fill([key(1)], b"")
        assert (got.num_fetched, got.num_dropped) == (1, 0)
        assert master.lookups == 2  # the generations differed: the master was asked
        assert _local_bytes(local, [1]) == [value(1, salt=3)]  # what the master names now
    finally:
        reads.close()


def test_an_ssd_block_promoted_by_the_copys_pin_keeps_its_generation(
    make_source: object, local: NodeCore, tmp_path: pathlib.Path
) -> None:
    src, address = make_source(dram_bytes=256 << 10, ssd_dir=tmp_path / "ssd")  # type: ignore[operator]
    master = FakeMaster()
    src.put_inline([(key(1), value(1), b"m")], b"")
    src.store.spill_to_ssd()
    for i in range(10, 20):  # 10 x 32 KiB through 256 KiB of DRAM: block 1 leaves DRAM
        src.put_inline([(key(i), value(i), b"m")], b"")
    blocks, _ = src.store.list_blocks(limit=100)
    assert next(b.tiers for b in blocks if b.key == key(1)) == (Tier.SSD,)
    master.name(src, address, 1, Tier.SSD)
    reads = _reads(local, master)
    try:
        got = reads.fill([key(1)], b"")
        assert (got.num_fetched, got.num_dropped) == (1, 0)
        assert master.lookups == 1  # no rename, no re-copy, no verification lookup
        assert _local_bytes(local, [1]) == [value(1)]
    finally:
        reads.close()
