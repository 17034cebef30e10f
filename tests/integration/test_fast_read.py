"""The sync client's one-call path for DRAM hits (kvstored/client/_fastread.py).

Checked: it answers get / get_into / lookup_prefix / lookup_prefix_tiers / exists of DRAM
blocks with no round trip and no op driver (its ``FAST_STATS`` counter), and each case it
must not answer goes through the general path with the general path's result: a miss, a
version check failing mid-read (the block removed and re-put with other bytes between the
plan and the copy: the new bytes come back, never the old), a session that ended, an
SSD-only block, one-sided reads switched off, a bad key and a bad buffer.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from it_helpers import random_keys, value_for
from test_one_sided_reads import _calls, _metric, _pin_calls

from kvstored import Client, Tier
from kvstored.client import _fastread
from kvstored.errors import InvalidArgument, KeyInvalid

MIB = 1 << 20


def _taken() -> tuple[int, int]:
    return _fastread.FAST_STATS["taken"], _fastread.FAST_STATS["passed"]


def test_dram_hits_are_answered_in_one_call(start_node: Any) -> None:
    node = start_node(dram_size_bytes=16 * MIB, ssd_size_bytes=0, ssd_dir=None)
    keys = random_keys(4)
    values = [value_for(k, 50_000 + i) for i, k in enumerate(keys)]
    with Client(node.unix_address) as c:
        assert all(r.stored for r in c.put(keys, values, metas=[b"m%d" % i for i in range(4)]))
        asked = _pin_calls(node) + _calls(node, "Exists") + _calls(node, "LookupPrefix")
        taken, passed = _taken()
        assert c.get(keys) == values
        bufs = [bytearray(60_000) for _ in keys]
        assert c.get_into(keys, bufs) == [len(v) for v in values]
        assert [bytes(b[: len(v)]) for b, v in zip(bufs, values, strict=True)] == values
        arrs = [np.zeros(60_000, dtype=np.uint8) for _ in keys]
        assert c.get_into(keys, arrs, return_meta=True) == [(len(v), b"m%d" % i) for i, v in enumerate(values)]
        assert c.lookup_prefix(keys) == 4
        assert c.lookup_prefix_tiers(keys[:2]) == [Tier.DRAM] * 2
        assert c.exists(keys) == [True] * 4
        assert _taken() == (taken + 6, passed)
        assert _pin_calls(node) + _calls(node, "Exists") + _calls(node, "LookupPrefix") == asked
        st = c.stats()  # the hits were reported to the node, once each
        assert st["hits"] >= 12


def test_a_miss_goes_through_the_general_path(start_node: Any) -> None:
    node = start_node(dram_size_bytes=16 * MIB, ssd_size_bytes=0, ssd_dir=None)
    keys = random_keys(3)
    values = [value_for(k, 10_000) for k in keys[:2]]
    with Client(node.unix_address) as c:
        c.put(keys[:2], values)
        c.get(keys[:1])  # the session is open from here on
        taken, passed = _taken()
        pins = _pin_calls(node)
        assert c.get([keys[0], keys[2], keys[1]]) == [values[0], None, values[1]]
        assert _pin_calls(node) == pins + 1
        bufs = [bytearray(10_000) for _ in range(3)]
        assert c.get_into([keys[2], keys[0], keys[1]], bufs) == [None, 10_000, 10_000]
        assert bytes(bufs[1]) == values[0] and bytes(bufs[2]) == values[1]
        assert c.lookup_prefix(keys) == 2
        assert c.lookup_prefix_tiers([keys[2]]) == []
        assert c.exists(keys) == [True, True, False]
        assert _taken() == (taken, passed + 5)


def test_a_failed_version_check_reads_the_new_bytes_through_the_general_path(
    start_node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The block is removed and re-put with other bytes between the fast path's plan and
    its copy (``MID``, read_keys' seam): the check fails, and the general path returns the
    bytes stored now."""
    node = start_node(dram_size_bytes=16 * MIB, ssd_size_bytes=0, ssd_dir=None)
    key = random_keys(1)
    old, new = b"o" * 100_000, b"n" * 100_000
    with Client(node.unix_address) as c, Client(node.unix_address) as writer:
        c.put(key, [old])
        assert c.get(key) == [old]
        fired = []

        def mid() -> None:
            if not fired:
                fired.append(1)
                assert writer.remove(key) == [True]
                assert writer.put(key, [new])[0].stored

        monkeypatch.setattr(_fastread, "MID", mid)
        taken, passed = _taken()
        buf = [bytearray(100_000)]
        assert c.get_into(key, buf) == [100_000]
        assert fired and bytes(buf[0]) == new
        assert _taken() == (taken, passed + 1)
        monkeypatch.setattr(_fastread, "MID", None)
        assert c.get(key) == [new]
        assert _taken() == (taken + 1, passed + 1)


def test_an_ended_session_goes_through_the_general_path(start_node: Any) -> None:
    node = start_node(dram_size_bytes=16 * MIB, ssd_size_bytes=0, ssd_dir=None)
    keys = random_keys(2)
    values = [b"a" * 1000, b"b" * 2000]
    with Client(node.unix_address) as c:
        c.put(keys, values)
        assert c.get(keys) == values
        session = c._session
        session._call.cancel()  # the OpenSession stream ends (as when the node goes)
        assert session._ended.wait(10)
        taken, passed = _taken()
        assert not session.is_live()
        assert c.lookup_prefix(keys) == 2  # the general path opens a new session
        assert _taken() == (taken, passed)
        assert session.is_live()
        assert c.get(keys) == values
        assert _taken() == (taken + 1, passed)


def test_ssd_only_blocks_go_through_the_general_path(start_node: Any) -> None:
    node = start_node(dram_size_bytes=4 * MIB, ssd_size_bytes=64 * MIB)
    keys = random_keys(40)
    values = [value_for(k, 256 << 10) for k in keys]
    with Client(node.unix_address) as c:
        for i in range(0, 40, 4):  # fills DRAM several times over: the first ones demoted
            c.put(keys[i : i + 4], values[i : i + 4])
        tiers = c.where(keys[:4])
        assert Tier.SSD in tiers and None not in tiers, tiers
        ssd_only = [k for k, t in zip(keys[:4], tiers, strict=True) if t == Tier.SSD]
        taken, passed = _taken()
        assert c.exists(ssd_only) == [True] * len(ssd_only)
        assert c.get(ssd_only) == [values[keys.index(k)] for k in ssd_only]
        assert _taken()[0] == taken  # none of them answered by the fast path


def test_switched_off_bad_keys_and_bad_buffers_take_the_general_path(
    start_node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = start_node(dram_size_bytes=16 * MIB, ssd_size_bytes=0, ssd_dir=None)
    keys = random_keys(2)
    with Client(node.unix_address) as c:
        c.put(keys, [b"x" * 4096] * 2)
        assert c.get(keys) == [b"x" * 4096] * 2
        taken, passed = _taken()
        with pytest.raises(KeyInvalid, match="#1"):
            c.get([keys[0], b""])
        with pytest.raises(InvalidArgument, match="read-only"):
            c.get_into(keys, [bytearray(4096), b"\0" * 4096])
        with pytest.raises(InvalidArgument, match="buffer too small"):
            c.get_into(keys, [bytearray(4096), bytearray(100)])
        f32 = [np.zeros(1024, dtype=np.float32) for _ in keys]  # cast by the general path
        assert c.get_into(keys, f32) == [4096, 4096]
        assert f32[0].tobytes() == b"x" * 4096
        monkeypatch.setenv("KVSTORED_ONE_SIDED", "0")
        pins = _pin_calls(node)
        assert c.get(keys) == [b"x" * 4096] * 2
        assert _pin_calls(node) == pins + 1
        assert _taken()[0] == taken


def test_get_into_without_a_list_of_buffers_is_never_answered_as_a_get(start_node: Any) -> None:
    """get_into(keys, None) is a bad argument (the general path names it), not a get: the
    hit path once read ``buffers=None`` as get's "new bytes objects" and returned them."""
    node = start_node(dram_size_bytes=16 * MIB, ssd_size_bytes=0, ssd_dir=None)
    keys = random_keys(2)
    with Client(node.unix_address) as c:
        c.put(keys, [b"x" * 4096] * 2)
        assert c.get(keys) == [b"x" * 4096] * 2  # the session is open
        taken, passed = _taken()
        with pytest.raises(InvalidArgument, match="buffers"):
            c.get_into(keys, None)  # type: ignore[arg-type]
        bufs = (bytearray(4096), bytearray(4096))  # a tuple: the general path reads it
        assert c.get_into(keys, bufs) == [4096, 4096] and bytes(bufs[1]) == b"x" * 4096
        assert _taken() == (taken, passed)


def test_hits_after_the_first_pending_one_are_reported_with_it(start_node: Any) -> None:
    """The hit path wakes the idle flusher only for the count that made some pending; the
    hits after it (before any request carries them) reach the node in the same report."""
    node = start_node(dram_size_bytes=16 * MIB, ssd_size_bytes=0, ssd_dir=None)
    keys = random_keys(3)
    values = [value_for(k, 8000) for k in keys]
    with Client(node.unix_address) as c:
        c.put(keys, values)
        assert c.get(keys[:1]) == values[:1]  # the session opens (a small put needs none)
        base = c.stats()["hits"]  # a gRPC call: nothing pending after it
        taken, _ = _taken()
        for k, v in zip(keys, values, strict=True):
            assert c.get([k]) == [v]
        bufs = [bytearray(8000) for _ in keys]
        assert c.get_into(keys, bufs) == [8000] * 3
        assert _taken()[0] == taken + 4
        deadline = time.monotonic() + 30  # the idle flusher's report (REPORT_IDLE_S after the first)
        while _metric(node, "kvstored_one_sided_blocks_total", outcome="hit") < 7:
            assert time.monotonic() < deadline, "the idle flusher did not report the hits"
            time.sleep(0.05)
        assert c.stats()["hits"] - base == 6
