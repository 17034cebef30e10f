"""Type stub of the optional C extension built from native/master.c (see kvstored/native.py
``master_index``): the master block index's loops over its numpy columns' buffers."""

from typing import Any

def keytable_get_many(lo: Any, hi: Any, sl: Any, over: Any, bits: int, words: Any, out: Any) -> int:
    """``out[i]`` = the slot of key ``i`` (``words``: ``(n, 2)`` u64) in a KeyTable's buckets,
    or -1; returns the leading count found.

    Raises:
        ValueError: a buffer of the wrong kind or size, or ``bits`` outside 1..40.
    """

def best_rows(head: Any, next: Any, holder: Any, state: Any, tier: Any, readable: Any, load: Any,
              slots: Any, local_holder: int, out_rows: Any, out_holders: Any, committed: int,
              state_mask: int, copy_bit: int, ssd: int, rank_score: float, load_clip: float,
              max_ranked: int) -> None:
    """kvstored/master/ranking.py ``best_rows``: per slot the best row (-1: none readable)
    and its holder, into the int64 outputs.

    Raises:
        ValueError: a buffer of the wrong kind or size, or a slot, row or holder outside
            its columns.
    """

def find_rows(head: Any, next: Any, holder: Any, tier: Any, slots: Any, holder_id: int, tiers: Any,
              hot: dict[int, Any], max_depth: int, out: Any) -> int:
    """Per slot the row of (``holder_id``, ``tiers[i]``) (-1 none; -2: a chain longer than
    ``max_depth`` without hot maps); returns the count of -2.

    Raises:
        ValueError: a buffer of the wrong kind or size, or a slot or row outside its columns.
        TypeError: a hot chain's ``rows`` is not a dict.
    """

def unlink_rows(head: Any, next: Any, block: Any, holder: Any, state: Any, hnext: Any, hprev: Any,
                holder_head: Any, rows: Any, emptied: Any) -> int:
    """Unlink distinct live rows of chains without hot maps from their chains and holder
    lists (state 0, no links); ``emptied[i]`` = row ``i`` was its block's last. Returns the
    count of emptied blocks.

    Raises:
        ValueError: a buffer of the wrong kind or size, or a row not live or repeated
            (nothing changed then).
    """

def parse_events(data: bytes, max_key_bytes: int, max_replicas: int, kind_a: int, kind_b: int,
                 tier_a: int, tier_b: int, field: int = 3,
                 ) -> tuple[list[int], list[int], list[bytes], list[bytes], bytes, bytes, bytes, bytes,
                            bytes, bool, bool, bool] | None:
    """A serialized ReportEventsRequest's events (its field 3, or ``field``: a
    HeartbeatRequest's are field 7) as columns (tiers, sizes, generations, copies, replicas
    as the bytes of int64 / int64 / uint64 / bool / int64 arrays), whether every value passed
    the checks, whether the seqs are consecutive (each the one before + 1) and whether the
    (namespace_id, key) pairs are distinct; None for bytes not in the canonical form."""

def apply_events(cols: Any, table: Any, hot_cls: Any, ns: int, holder: int, idx: Any, kinds: list[int],
                 keys: list[bytes], tiers: Any, sizes: Any, gens: Any, copies: Any, reps: Any, gen_next: int,
                 codes: Any, consts: tuple[int, int, int, int, int, int, int, int, int]
                 ) -> tuple[int, int, int, int, list[tuple[int, int]]] | None:
    """kvstored/master/index.py ``BlockIndex.apply_events_native``: events ``idx`` of a
    ReportEvents batch's columns applied to ``holder``'s rows of namespace ``ns`` of the
    IndexColumns ``cols`` and its KeyTable ``table``, as the batch methods would; ``codes``
    (int8, one per idx entry) gets their codes. Returns (fresh rows, fresh slots,
    generations taken, key-table live delta, [(event, holder to promote)]), or None with
    nothing changed when the run is not one it applies.

    Raises:
        ValueError: a buffer of the wrong kind or size.
        TypeError: a hot chain's maps, the free lists or factor maps of the wrong type.
        RuntimeError: a block slot not in its key table (inconsistent columns).
    """

def ranked_rows(cols: tuple[Any, ...], consts: tuple[int | float, ...], slots: Any, local_holder: int,
                avoid: Any, width: int, out_rows: Any, out_holders: Any) -> None:
    """native/master_lookup.c: kvstored/master/ranking.py ``ranked_rows`` (``cols`` and
    ``consts`` from ``ranking.native_args``): per slot up to ``width`` readable rows on
    distinct holders, best first, and their holders, into the ``(n, width)`` int64 outputs
    (-1 padded).

    Raises:
        ValueError: a buffer of the wrong kind or size, ``width`` outside 1..max_ranked, or a
            slot, row or holder outside its columns.
    """

def lookup_wire(table: tuple[Any, Any, Any, Any, int], cols: tuple[Any, ...], consts: tuple[int | float, ...],
                request: bytes, local_holder: int, avoid: Any, alternates: int, ranked: bool,
                every_key: bool) -> tuple[bytes, list[int], int, bytes, bytes] | None:
    """native/master_lookup.c: a serialized MasterLookupPrefixRequest's keys looked up in a
    KeyTable (``table``: ``KeyTable.probe_buffers()``) and ranked (best_rows' walk, or
    ranked_rows' with ``ranked`` or ``alternates`` > 0): ``(wire, holders, num_blocks,
    best_holders, positions)``, ``wire`` the response's packed columns (see
    kvstored/master/index.py ``WireHit``). None when a key is not exactly 16 bytes or the
    bytes are malformed.

    Raises:
        ValueError: a buffer of the wrong kind or size, or a slot, row or holder outside its
            columns.
    """
