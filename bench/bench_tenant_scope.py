"""What tenancy costs a node request: the request's tenant resolved and its namespace id scoped
(kvstored/node/tenants.py, kvstored/tenancy.py), next to the core call it precedes.

Usage:
    python bench/bench_tenant_scope.py [--iters 200000]

Measured in the same run, per call (best of 5 rounds):
  * scope_shared   tenant resolution + scoping of a request that declares no tenant
  * scope_tenant   the same for a request declaring ``kvstored-tenant: team-a``
  * exists_1       NodeCore.exists of one key (a DRAM hit), the reference: the cheapest core
                   call a request makes after scoping
Printed: each figure in ns and as a ratio to exists_1 (the share scoping adds to the
cheapest request, before gRPC's own cost, which is 10-100x larger).
"""

from __future__ import annotations

import argparse
import timeit

from kvstored.clock import FakeClock
from kvstored.config import NodeConfig
from kvstored.node.core import NodeCore
from kvstored.node.tenants import declared_tenant, effective_tenant, request_principal
from kvstored.tenancy import scope_namespace
from kvstored.tiers.tiered import TieredStore


class _Ctx:
    def __init__(self, md: tuple[tuple[str, str], ...]) -> None:
        self._md = md

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._md


def _per_call_ns(fn: object, iters: int) -> float:
    return min(timeit.repeat(fn, number=iters, repeat=5)) / iters * 1e9  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iters", type=int, default=200_000)
    args = parser.parse_args()
    ns = bytes(16)
    shared = _Ctx((("user-agent", "grpc-python"),))
    tenant = _Ctx((("user-agent", "grpc-python"), ("kvstored-tenant", "team-a")))

    def scope(ctx: _Ctx) -> bytes:
        return scope_namespace(effective_tenant(request_principal(ctx), declared_tenant(ctx)), ns)

    cfg = NodeConfig(node_id="bench", dram_size_bytes=1 << 20, ssd_size_bytes=0)
    store = TieredStore(dram_size_bytes=cfg.dram_size_bytes, arena_dir=None)
    try:
        core = NodeCore(store, cfg, epoch=1, clock=FakeClock())
        key = bytes(range(16))
        store.put(key, bytes(4096), namespace_id=ns)
        ref = _per_call_ns(lambda: core.exists([key], ns), args.iters)
        rows = [("scope_shared", _per_call_ns(lambda: scope(shared), args.iters)),
                ("scope_tenant", _per_call_ns(lambda: scope(tenant), args.iters)),
                ("exists_1", ref)]
    finally:
        store.close()
    for name, value in rows:
        print(f"{name:14s} {value:9.0f} ns  {value / ref:5.2f}x exists_1")


if __name__ == "__main__":
    main()
