"""Helpers of the scheduler unit tests: hand-made cost profiles and a fixed index (the clock
is kvstored.clock.FakeClock, started at 0 s by the ``clock`` fixture)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from kvstored.scheduler.costmodel import CostProfile


class DictIndex:
    """PrefixIndex answering from a fixed ``node -> (blocks, ssd_blocks)`` table."""

    def __init__(self, table: Mapping[str, tuple[int, int]]) -> None:
        self.table = dict(table)

    def match_prefix(
        self, keys: Sequence[Hashable], node_ids: Sequence[str]
    ) -> Mapping[str, tuple[int, int]]:
        return {n: (min(b, len(keys)), s) for n, (b, s) in self.table.items() if b}


def make_profile(**over: object) -> CostProfile:
    """Round numbers: prefill 0.1 + 1e-4*(n-p) + 1e-9*(n^2-p^2); 16-token blocks of 1000 B/token
    (16 kB per block); per block: local DRAM 10 us, local SSD 1 ms, remote DRAM 1 s, remote SSD
    2 s; TBT 0.01 + 0.001*b + 1e-6*ctx.

    Override a nested field with ``section__field=value``."""
    doc: dict[str, object] = {
        "name": "test",
        "kv_bytes_per_token": 1000,
        "prefill": {"base_s": 0.1, "per_token_s": 1e-4, "per_token_sq_s": 1e-9},
        "decode": {"base_s": 0.01, "per_request_s": 0.001, "per_context_token_s": 1e-6,
                   "kv_capacity_tokens": 0, "max_batch_requests": 0},
        "bandwidth_bytes_per_s": {"local_dram": 1.6e9, "local_ssd": 16e6,
                                  "remote_dram": 16_000.0, "remote_ssd": 8_000.0},
    }
    for key, value in over.items():
        section, _, field = key.partition("__")
        if field:
            doc[section][field] = value  # type: ignore[index]
        else:
            doc[key] = value
    return CostProfile.model_validate(doc)
