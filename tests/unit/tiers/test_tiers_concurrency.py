"""Threads racing puts, prefix reads, removes and evictions (DRAM + SSD): never wrong bytes."""

from __future__ import annotations

import pathlib
import random
import threading

import pytest
from helpers import key

from kvstored.errors import NoCapacity
from kvstored.tiers.tiered import TieredStore
from kvstored.types import PinnedBlock

K = 4096
NUM_KEYS = 40


def value(i: int) -> bytes:
    # the only correct bytes for key i; sizes vary so blocks land at varied offsets
    size = K // 2 + (i * 977) % (3 * K)
    return bytes((i + j) % 256 for j in range(251)) * (size // 251) + b"\xee" * (size % 251)


@pytest.mark.parametrize("with_ssd", [False, True])
def test_racing_threads_never_see_wrong_bytes(tmp_path: pathlib.Path, with_ssd: bool) -> None:
    s = TieredStore(
        dram_size_bytes=12 * K, arena_dir=None,
        ssd_dir=tmp_path / "ssd" if with_ssd else None, ssd_size_bytes=40 * K,
    )
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            barrier.wait()
            for _ in range(150):
                op = rnd.random()
                i = rnd.randrange(NUM_KEYS)
                if op < 0.4:
                    try:
                        s.put(key(i), value(i))
                    except NoCapacity:
                        pass  # everything pinned by other readers at this instant
                elif op < 0.85:
                    chain = [key((i + d) % NUM_KEYS) for d in range(rnd.randrange(1, 4))]
                    got = s.pin_many(chain)
                    for k, p in zip(chain, got, strict=True):
                        if isinstance(p, PinnedBlock):
                            j = int.from_bytes(k, "big")
                            assert bytes(p.view) == value(j), "wrong bytes served"
                            s.unpin(p)
                        else:
                            assert p is None or isinstance(p, NoCapacity)
                else:
                    s.remove([key(i)])
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors[0]
        st = s.stats()
        assert st.pinned_blocks == 0 and st.checksum_failures == 0
        s._state.dram.allocator.check_invariants()
        assert len(s._state.dram.by_offset) == len(s._state.dram.entries)  # no orphaned block
        assert s._state.dram.allocator.used_bytes == sum(
            s._state.dram.round_up(e.size_bytes) for e in s._state.dram.entries.values()
        )
        for i in range(NUM_KEYS):
            got = s.get(key(i))
            assert got is None or got[0] == value(i)
    finally:
        s.close()
