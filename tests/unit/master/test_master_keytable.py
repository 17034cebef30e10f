"""KeyTable (numpy open addressing) against a dict model: inserts, deletes, growth, probes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from master_helpers import NS

from kvstored.master.index import BlockIndex
from kvstored.master.keytable import KeyTable, key_digest, keys_to_words
from kvstored.types import Tier

# few distinct low words force long probe runs and collisions of home positions
KEYS = st.builds(lambda lo, hi: lo.to_bytes(8, "little") + hi.to_bytes(8, "little"),
                 st.sampled_from([0, 1, 2, 2**63, 2**64 - 1]), st.integers(0, 40))
OPS = st.lists(st.tuples(st.sampled_from(["put", "put_many", "del"]),
                         st.lists(KEYS, min_size=1, max_size=12, unique=True)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_table_matches_a_dict(ops: list) -> None:  # type: ignore[type-arg]
    t = KeyTable(16)
    model: dict[bytes, int] = {}
    next_slot = 0
    for op, keys in ops:
        if op == "del":
            for k in keys:
                w = keys_to_words([k])[0]
                assert t.delete_words(int(w[0]), int(w[1])) == (k in model)
                model.pop(k, None)
            continue
        new = [k for k in keys if k not in model]
        if op == "put":
            for k in new:
                t.insert(k, next_slot)
                model[k] = next_slot
                next_slot += 1
        else:
            slots = np.arange(next_slot, next_slot + len(new))
            t.insert_many(keys_to_words(new), slots)
            model.update(zip(new, slots.tolist(), strict=True))
            next_slot += len(new)
    assert len(t) == len(model)
    probe = sorted({k for _, ks in ops for k in ks}) or [bytes(16)]
    got = t.get_many(keys_to_words(probe)).tolist()
    assert got == [model.get(k, -1) for k in probe]
    assert [t.get(k) for k in probe] == [model.get(k, -1) for k in probe]


def test_table_grows_and_keeps_every_key() -> None:
    rng = np.random.default_rng(3)
    t = KeyTable(16)
    words = rng.integers(0, 2**63, size=(5000, 2), dtype=np.uint64)
    t.insert_many(words[:2500], np.arange(2500))
    t.insert_many(words[2500:], np.arange(2500, 5000))
    assert len(t) == 5000 and t.nbytes >= 2 * 5000 * 20
    assert (t.get_many(words) == np.arange(5000)).all()
    for lo, hi in words[:4000:2].tolist():
        assert t.delete_words(lo, hi)
    got = t.get_many(words)
    assert (got[:4000:2] == -1).all() and (got[1:4000:2] == np.arange(1, 4000, 2)).all()
    assert (got[4000:] == np.arange(4000, 5000)).all()


def test_keys_of_other_lengths_are_digested_and_listed_as_themselves() -> None:
    ix = BlockIndex(16)
    h = ix.add_holder()
    ix.set_readable(h, True)
    short, long = b"k" * 8, b"L" * 40
    assert len(key_digest(long)) == 16 and key_digest(b"x" * 16) == b"x" * 16
    for k in (short, long):
        ix.add_replica(NS, k, holder=h, tier=Tier.DRAM, size_bytes=1, generation=1)
    assert len(ix.lookup_prefix(NS, [short, long])) == 2
    assert len(ix.lookup_prefix(NS, [key_digest(long)])) == 1  # the digest is the identity
    assert sorted(k for _, k, _ in ix.holder_keys(h)) == sorted([short, long])
    assert ix.remove_replica(NS, long, holder=h, tier=Tier.DRAM)
    assert [k for _, k, _ in ix.holder_keys(h)] == [short]
