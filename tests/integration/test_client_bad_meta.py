"""A str meta in a put batch is that item's InvalidArgument; the good items are stored."""

from __future__ import annotations

import pytest
from it_helpers import NodeFactory, random_keys, value_for

from kvstored import Client
from kvstored.errors import InvalidArgument


@pytest.mark.parametrize("transport", ["shm", "tcp", "grpc"])
def test_str_meta_fails_only_its_item(start_node: NodeFactory, transport: str) -> None:
    node = start_node()
    keys = random_keys(3)
    values = [value_for(k, 8 << 10) for k in keys]
    with Client(node.address_for(transport), transport=transport) as c:
        results = c.put(keys, values, metas=[b"ok", "text", None])
        assert results[0].stored and results[2].stored
        assert not results[1].stored and isinstance(results[1].error, InvalidArgument)
        assert "meta #1 must be bytes" in str(results[1].error) and "got str 'text'" in str(results[1].error)
        assert c.get(keys) == [values[0], None, values[2]]
        blocks = c.get_blocks([keys[0]])
        assert blocks[0] is not None and blocks[0].meta == b"ok"
