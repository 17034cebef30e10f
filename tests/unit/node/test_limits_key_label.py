"""A node's per-item put errors label their key fragment ``key <hex>`` (issue 17: a
BlockTooLarge read "block #0 (3f2a...) is ... bytes", the hex unlabelled)."""

from __future__ import annotations

from kvstored import BlockTooLarge

MIB = 1 << 20


def test_the_nodes_limit_check_labels_its_key() -> None:
    from kvstored.config import NodeConfig
    from kvstored.node.limits import RequestLimits

    limits = RequestLimits(NodeConfig(max_block_bytes=MIB), epoch=1, metrics=None)
    err = limits.put_item_error(0, bytes.fromhex("3f2a" * 8), 2 * MIB, b"")
    assert isinstance(err, BlockTooLarge)
    assert str(err).startswith("block #0 (key 3f2a3f2a3f2a3f2a) is 2097152 bytes"), err
    err = limits.put_item_error(1, bytes.fromhex("3f2a" * 8), 1, b"m" * (1 << 20))
    assert err is not None and "meta of block #1 (key 3f2a3f2a3f2a3f2a)" in str(err), err
