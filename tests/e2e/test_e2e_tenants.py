"""Tenants with real processes (docs/tenants.md): a client of tenant B can neither read,
probe nor remove tenant A's blocks, over shared memory, the TCP data plane, inline gRPC and
through a cluster get on another node; a put over a tenant's DRAM quota is refused naming the
tenant, and nothing of another tenant is evicted for it.

Each client uses the same namespace and the same keys: only the tenant differs, so B knows
A's namespace id exactly and still addresses another key space.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import NodeProcess, _wait, start_each, start_master, wait_healthy
from e2e_helpers import ServeProcess, value_for

from kvstored import Client, Namespace
from kvstored.errors import TenantQuotaExceeded

NS = Namespace(model_id="tenants-e2e", block_size=16)
LONG = "tenant-b-" + "x" * 55  # 64 characters: its stored ids (82 bytes) pass every limit
QUOTA_BYTES = 256 << 10


def _keys(n: int) -> list[bytes]:
    return [bytes([i % 8]) + os.urandom(15) for i in range(n)]


def _serve(workdir: Path, procs: list[Any], node: str = "") -> ServeProcess:
    cfg = workdir / "kvstored.toml"
    cfg.write_text(f"[tenants.a]\ndram_quota_bytes = {QUOTA_BYTES}\n[tenants.b]\n{node}")
    node = ServeProcess(workdir, extra=["--config", str(cfg)])
    procs.append(node)
    return node.start()


@pytest.mark.parametrize("transport", ["shm", "tcp", "grpc"])
def test_tenant_b_cannot_read_probe_or_remove_tenant_a_blocks(
    workdir: Path, procs: list[Any], transport: str
) -> None:
    node = _serve(workdir, procs)
    keys = _keys(4)
    values = [value_for(k) for k in keys]
    with Client(node.unix_address, namespace=NS, tenant="a", transport=transport) as a, \
            Client(node.unix_address, namespace=NS, tenant=LONG, transport=transport) as b:
        assert a.describe().transport == transport and b.describe().transport == transport
        assert all(r.stored for r in a.put(keys, values))
        assert b.get(keys) == [None] * 4
        assert b.exists(keys) == [False] * 4
        assert b.lookup_prefix(keys) == 0
        assert b.remove(keys) == [False] * 4
        # b's own blocks under the same ids live beside a's, and never shadow them
        assert all(r.stored for r in b.put(keys[:2], [bytes(100)] * 2))
        assert a.get(keys) == values
        assert b.get(keys[:2]) == [bytes(100)] * 2
        with Client(node.unix_address, namespace=NS, transport=transport) as shared:
            assert shared.exists(keys) == [False] * 4  # the shared tenant is a tenant too
        assert a.lookup_prefix(keys) == 4 and a.remove(keys[:1]) == [True]
        assert b.get(keys[:1]) == [bytes(100)]  # a's remove removed only a's block


def test_a_put_over_the_dram_quota_is_refused_and_other_tenants_keep_their_blocks(
    workdir: Path, procs: list[Any]
) -> None:
    """Also: ``node.shm_tenants = ["a"]`` offers the arena to a only; b falls back to TCP."""
    node = _serve(workdir, procs, '[node]\nshm_tenants = ["a"]\n')
    with Client(node.unix_address, namespace=NS, tenant="a") as a, \
            Client(node.unix_address, namespace=NS, tenant="b") as b:
        assert a.describe().transport == "shm" and b.describe().transport == "tcp"
        theirs = _keys(8)
        assert all(r.stored for r in b.put(theirs, [value_for(k) for k in theirs]))
        block = bytes(64 << 10)
        mine = _keys(6)  # 6 x 64 KiB > 256 KiB: the last two are refused
        got = a.put(mine, [block] * 6)
        assert [r.ok for r in got] == [True] * 4 + [False] * 2
        err = got[4].error
        assert isinstance(err, TenantQuotaExceeded)
        assert "'a'" in str(err) and "DRAM" in str(err) and str(QUOTA_BYTES) in str(err)
        assert b.get(theirs) == [value_for(k) for k in theirs]  # nothing of b's was evicted
        assert a.exists(mine) == [True] * 4 + [False] * 2


def test_cluster_get_keeps_the_tenant(workdir: Path, procs: list[Any]) -> None:
    """A block put through n1 by tenant a is read through n2 by tenant a (a copy across the
    pool, the master's index under the stored id), and is a miss for tenant b on n2."""
    master = start_master(workdir, procs)
    nodes = [NodeProcess(workdir / name, master.address, name) for name in ("n1", "n2")]
    start_each(nodes, procs)
    wait_healthy(master.address, {"n1", "n2"})
    n1, n2 = nodes
    keys = _keys(3)
    values = [value_for(k) for k in keys]
    with Client(n1.unix_address, namespace=NS, tenant="a") as a1:
        assert all(r.stored for r in a1.put(keys, values))
    with Client(n2.unix_address, namespace=NS, tenant="b") as b2, \
            Client(n2.unix_address, namespace=NS, tenant="a") as a2:
        _wait("n1's blocks indexed", lambda: a2.exists(keys) == [True] * 3)
        assert b2.exists(keys) == [False] * 3
        assert b2.lookup_prefix(keys) == 0
        assert b2.get(keys) == [None] * 3
        assert a2.get(keys) == values  # copied from n1 into n2's DRAM, under a's scope
        assert b2.get(keys) == [None] * 3  # the copy on n2 is a's too
        assert b2.remove(keys) == [False] * 3
        assert a2.get(keys) == values
