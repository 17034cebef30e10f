"""Validating and pinning a read's keys (``NodeCore.pin_items``), apart from the lease and
session work of kvstored/node/core.py.

A batch whose keys are all well-formed (the common case: an engine's block hashes) goes to
the store in one call with no per-key Python here (issue 9: a 16-key PinBlocks costs ~40 us
of node CPU in all); a batch with bad keys gives each bad key its own error and pins the
good ones, as before. Counting is the same either way: item errors are counted once, and a
key cut at NoCapacity (the reader asks for it again) is neither pinned nor counted.

Thread-safe (the store is); called from the event loop and the store executor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvstored.errors import KvstoredError, NoCapacity
from kvstored.types import PinnedBlock

if TYPE_CHECKING:
    from kvstored.node.core import NodeCore


def keys_valid(keys: Sequence[bytes], min_key_bytes: int, max_key_bytes: int) -> bool:
    """True when every key is ``bytes`` of ``min_key_bytes..max_key_bytes`` (C-level checks
    only; False for an empty batch)."""
    if not keys or not set(map(type, keys)) <= {bytes}:
        return False
    lens = set(map(len, keys))
    return min(lens) >= max(min_key_bytes, 1) and max(lens) <= max_key_bytes


def own_pins_full(index: int) -> NoCapacity:
    """The error of the keys from ``index`` on, cut because this read's pins fill DRAM."""
    return NoCapacity(
        f"DRAM is full of this read's own pins at key #{index}; read again from there "
        "once they are released"
    )


def pin_items(
    core: NodeCore, keys: Sequence[bytes], namespace_id: bytes, *, may_block: bool, cut: bool
) -> list[PinnedBlock | None | KvstoredError]:
    """``NodeCore.pin_items`` (see its docstring): per key a PinnedBlock, None or an error."""
    cfg = core.cfg
    if keys_valid(keys, cfg.min_key_bytes, cfg.max_key_bytes):  # one store call, no lists
        got = core.store.pin_many(
            keys, namespace_id=namespace_id, may_block=may_block, cut_from=1 if cut else None
        )
        for x in got:
            if isinstance(x, KvstoredError):
                core._count_item_error(x)
        if len(got) < len(keys):
            got.extend([own_pins_full(len(got))] * (len(keys) - len(got)))
        return got
    errors = [core.key_error(i, k) for i, k in enumerate(keys)]
    good = [k for k, e in zip(keys, errors, strict=True) if e is None]
    cut_from = None if not cut else (1 if errors and errors[0] is None else 0)
    got_good = (
        core.store.pin_many(good, namespace_id=namespace_id, may_block=may_block, cut_from=cut_from)
        if good else []
    )
    end = len(keys)
    if len(got_good) < len(good):  # cut at the first good key the store did not return
        end = [i for i, e in enumerate(errors) if e is None][len(got_good)]
    pinned = iter(got_good)
    out: list[PinnedBlock | None | KvstoredError] = []
    for err in errors[:end]:
        item = next(pinned) if err is None else core._count_item_error(err)
        if isinstance(item, KvstoredError) and err is None:
            core._count_item_error(item)
        out.append(item)
    if end < len(keys):
        out.extend([own_pins_full(end)] * (len(keys) - end))
    return out
