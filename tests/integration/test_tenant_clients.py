"""Clients and kvstorectl with a tenant (docs/tenants.md). ``kvstorectl --tenant``: a
tenant's view of a node is its own blocks; the shared tenant (an admin without TLS) lists
every tenant's, naming each block's tenant."""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner
from it_helpers import NodeFactory, random_keys, value_for

from kvstored import AsyncClient, Client
from kvstored.cli.ctl_common import EXIT_OK
from kvstored.cli.kvstorectl import main
from kvstored.errors import InvalidArgument


def _ctl(address: str, *args: str) -> dict:  # type: ignore[type-arg]
    r = CliRunner().invoke(main, ["--address", address, "--timeout-s", "30", "--output", "json", *args])
    assert r.exit_code == EXIT_OK, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_blocks_and_where_are_scoped_by_tenant(start_node: NodeFactory) -> None:
    node = start_node()
    ka, kb = random_keys(2)
    with Client(node.unix_address, tenant="a") as a, Client(node.unix_address, tenant="b") as b:
        assert a.put([ka], [value_for(ka, 4096)])[0].stored
        assert b.put([kb], [value_for(kb, 4096)])[0].stored
    mine = _ctl(node.unix_address, "--tenant", "a", "blocks")["blocks"]
    assert [(x["key"], x["tenant"], x["namespace_id"]) for x in mine] == [(ka.hex(), "a", "")]
    every = {x["key"]: x["tenant"] for x in _ctl(node.unix_address, "blocks")["blocks"]}
    assert every == {ka.hex(): "a", kb.hex(): "b"}
    assert _ctl(node.unix_address, "--tenant", "b", "where", ka.hex())["num_leading_hits"] == 0
    assert _ctl(node.unix_address, "where", "--tenant", "a", ka.hex())["num_leading_hits"] == 1


def test_the_async_client_declares_its_tenant_too(start_node: NodeFactory) -> None:
    node = start_node()
    (k,) = random_keys(1)

    async def run() -> None:
        async with AsyncClient(node.unix_address, tenant="a") as a, \
                AsyncClient(node.unix_address, tenant="b") as b:
            assert (await a.put([k], [value_for(k, 4096)]))[0].stored
            assert await b.exists([k]) == [False]
            assert await b.get([k]) == [None]
            assert await a.get([k]) == [value_for(k, 4096)]

    asyncio.run(run())
    with Client(node.unix_address, tenant="a") as sync_a:
        assert sync_a.exists([k]) == [True]


def test_a_bad_tenant_name_is_refused_at_construction() -> None:
    with pytest.raises(InvalidArgument, match=r"Client\(tenant=...\) 'a b' is not a tenant name"):
        Client("unix:/nonexistent", tenant="a b")
