"""``OffsetIndex.add_run`` (kvstored/tiers/offset_index.py) leaves exactly the list that one
``add`` per value leaves, with sortedcontainers' invariants kept (``_check``), on the same
random inputs: runs that fit in one place (at the start, the end, between neighbours, across
a sublist split), runs that do not (a present key inside them, ties with present keys), and
lists positionally indexed before the run (the index updated, not rebuilt)."""

from __future__ import annotations

import random
from operator import attrgetter

import pytest

from kvstored.tiers.offset_index import OffsetIndex


class _E:
    """An entry with an offset (identity matters: ties must land in the same order)."""

    __slots__ = ("offset",)

    def __init__(self, offset: int) -> None:
        self.offset = offset

    def __repr__(self) -> str:
        return f"_E({self.offset})@{id(self):x}"


_KEY = attrgetter("offset")


def _pair(load: int, offsets: list[int]) -> tuple[OffsetIndex, OffsetIndex]:
    a, b = OffsetIndex(key=_KEY), OffsetIndex(key=_KEY)
    a._reset(load)
    b._reset(load)
    for o in offsets:
        e = _E(o)
        a.add(e)
        b.add(e)
    return a, b


def test_the_private_layout_it_relies_on_is_there() -> None:
    idx = OffsetIndex(key=_KEY)
    for name in ("_lists", "_keys", "_maxes", "_index", "_offset", "_load", "_len", "_expand", "_check"):
        assert hasattr(idx, name), name


@pytest.mark.parametrize("load", [4, 8, 1000])
@pytest.mark.parametrize("seed", range(40))
def test_add_run_leaves_what_one_add_per_value_leaves(load: int, seed: int) -> None:
    rng = random.Random(seed * 7919 + load)
    present = sorted(rng.sample(range(0, 4000, 4), rng.randrange(0, 120)))
    a, b = _pair(load, present)
    for step in range(12):
        if rng.random() < 0.5 and len(a) > 2:
            _ = a[rng.randrange(len(a))], b[rng.randrange(len(b))]  # builds the positional index
        kind = rng.choice(["gap", "gap", "end", "start", "overlap", "tie"])
        n = rng.randrange(1, min(load, 40) + 1)
        keys = sorted(_KEY(e) for e in a)
        if kind == "gap" and len(keys) >= 2:  # between two neighbours
            i = rng.randrange(len(keys) - 1)
            lo, hi = keys[i], keys[i + 1]
            offs = [lo + 1 + rng.randrange(max(1, hi - lo - 1)) for _ in range(n)] if hi - lo > 1 else [lo] * n
        elif kind == "end":
            base = (keys[-1] if keys else 0) + rng.randrange(0, 3)
            offs = [base + k for k in range(n)]
        elif kind == "start":
            offs = [-(step + 1) * 1000 - k for k in range(n)]
        elif kind == "tie" and keys:
            offs = [rng.choice(keys) for _ in range(n)]
        else:  # spans present keys
            offs = [rng.randrange(-50, 4100) for _ in range(n)]
        run = [_E(o) for o in offs]
        rng.shuffle(run)
        a.add_run(run)
        for e in run:
            b.add(e)
        a._check()
        assert [id(e) for e in a] == [id(e) for e in b]
        assert len(a) == len(b)
        if len(a) > 2:  # the positional index agrees
            i = rng.randrange(len(a))
            assert a[i] is b[i]
            assert a.bisect_key_left(_KEY(a[i])) == b.bisect_key_left(_KEY(b[i]))


def test_the_comparison_sees_a_misplaced_run() -> None:
    """The equality can fail: a run sliced in one place past a present key is told apart."""
    a, b = _pair(1000, [0, 10, 20])
    run = [_E(5), _E(15)]
    lists, keys = a._lists, a._keys
    lists[0][1:1] = run  # wrong: 15 lands before 10
    keys[0][1:1] = [5, 15]
    a._len += 2
    for e in run:
        b.add(e)
    assert [id(e) for e in a] != [id(e) for e in b]
    with pytest.raises(AssertionError):
        a._check()
