"""The vLLM connector's engine-agnostic core (kvstored.integrations.blockio) against a node.

No vLLM needed: the paged KV cache is a list of uint8 (num_blocks, block_bytes) arrays, as the
connector maps vLLM's per-layer tensors. The real-vLLM tests are tests/e2e/test_vllm_connector.py.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from kvstored import Client
from kvstored.errors import InvalidArgument
from kvstored.integrations.blockio import (
    BlockIO,
    ClientPool,
    ConnectorConfig,
    ConnectorStats,
    block_keys,
)
from kvstored.keys import Namespace

NUM_LAYERS, NUM_BLOCKS, BLOCK_BYTES = 3, 8, 4096
NS_FIELDS = {"model_id": "test/model", "kv_dtype": "float32", "kv_layout": "test", "block_size": 16}


def _layers(seed: int | None) -> list[np.ndarray]:
    if seed is None:
        return [np.zeros((NUM_BLOCKS, BLOCK_BYTES), np.uint8) for _ in range(NUM_LAYERS)]
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (NUM_BLOCKS, BLOCK_BYTES), np.uint8) for _ in range(NUM_LAYERS)]


def _io(address: str, layers: list[np.ndarray], fields: dict | None = None,
        replicas: int | None = None, **kw) -> BlockIO:
    cfg = ConnectorConfig(address=address, timeout_ms=2000, replicas=replicas)
    f = fields or NS_FIELDS
    pool = ClientPool(lambda salt: Namespace(**f, tenant_salt=salt), cfg)
    return BlockIO(layers, pool, timeout_s=2.0, stats=ConnectorStats(), **kw)


H = [bytes([i]) * 32 for i in range(1, 5)]


def test_a_save_short_of_its_replicas_is_counted_not_silent(node) -> None:
    # a node without a master keeps one replica: the save succeeds and says so
    saver = _io(node.unix_address, _layers(3), replicas=2)
    saver.submit_save("r1", "", [(H[2], 1), (H[3], 2)])
    saver.wait_for_saves(["r1"])
    assert (saver.stats.blocks_saved, saver.stats.blocks_short_of_replicas,
            saver.stats.save_errors) == (2, 2, 0)
    saver.close()


def test_block_keys_are_block_major_and_padded() -> None:
    keys = block_keys([b"\x01" * 32, b"\x02" * 4], 2)
    assert keys == [b"\x00\x00" + b"\x01" * 32, b"\x00\x01" + b"\x01" * 32,
                    b"\x00\x00" + b"\x00" * 10 + b"\x02" * 4, b"\x00\x01" + b"\x00" * 10 + b"\x02" * 4]
    with pytest.raises(InvalidArgument, match="block hash 0"):
        block_keys(["abc"], 1)  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match="num_layers"):
        block_keys([b"x" * 32], 0)


def test_save_then_load_into_other_blocks_is_byte_exact(node) -> None:
    src = _layers(1)
    saver = _io(node.unix_address, src)
    saver.submit_save("r1", "", [(H[0], 1), (H[1], 2)])
    saver.wait_for_saves(["r1"])
    assert saver.stats.blocks_saved == 2 and saver.stats.save_errors == 0
    assert saver.stats.bytes_saved == 2 * NUM_LAYERS * BLOCK_BYTES

    dst = _layers(None)
    loader = _io(node.unix_address, dst)
    assert loader.load("", [(H[0], 5), (H[1], 6)]) == set()
    for layer in range(NUM_LAYERS):
        assert np.array_equal(dst[layer][5], src[layer][1])
        assert np.array_equal(dst[layer][6], src[layer][2])
    assert not dst[0][0].any() and not dst[0][7].any()  # other blocks untouched
    assert loader.stats.blocks_loaded == 2
    # lookup over the block-major keys counts whole blocks x layers
    with Client(node.unix_address, namespace=Namespace(**NS_FIELDS)) as kv:
        assert kv.lookup_prefix(block_keys(H[:3], NUM_LAYERS)) == 2 * NUM_LAYERS
    saver.close()
    loader.close()


def test_missing_block_and_other_tenant_are_load_errors(node) -> None:
    saver = _io(node.unix_address, _layers(2))
    saver.submit_save("r1", "", [(H[0], 0)])
    saver.wait_for_saves(["r1"])
    loader = _io(node.unix_address, _layers(None))
    assert loader.load("", [(H[0], 3), (H[1], 4)]) == {4}
    assert loader.load("tenant-b", [(H[0], 3)]) == {3}
    other_model = _io(node.unix_address, _layers(None), {**NS_FIELDS, "model_id": "test/other"})
    assert other_model.load("", [(H[0], 3)]) == {3}
    assert loader.stats.load_errors == 2 and loader.stats.blocks_loaded == 1
    # a block present on some layers only, or of the wrong size, is a load error too
    with Client(node.unix_address, namespace=Namespace(**NS_FIELDS)) as kv:
        k = block_keys([H[2], H[3]], NUM_LAYERS)
        kv.put(k[:1], [bytes(BLOCK_BYTES)])  # H[2]: layer 0 only
        kv.put(k[NUM_LAYERS:], [bytes(BLOCK_BYTES // 2)] * NUM_LAYERS)  # H[3]: short blocks
    assert loader.load("", [(H[2], 3)]) == {3}
    assert loader.load("", [(H[3], 4)]) == {4}


def test_dead_node_fails_loads_within_the_deadline(start_node) -> None:
    n = start_node()
    io = _io(n.unix_address, _layers(None))
    assert io.load("", [(H[0], 1)]) == {1}  # connected (a miss), then the daemon dies
    n.stop()
    t0 = time.monotonic()
    assert io.load("", [(H[0], 1), (H[1], 2)]) == {1, 2}
    assert time.monotonic() - t0 < 2.0 + 1.0
    assert io.stats.load_errors == 3
    io.submit_save("r", "", [(H[2], 3)])  # a save to a dead node is a counted error, no raise
    io.wait_for_saves(["r"])
    assert io.stats.save_errors == 1


def test_finished_request_is_reported_only_after_its_save_ran(node) -> None:
    """vLLM frees a finished request's blocks when get_finished reports it: that must not
    happen while a save still reads them (the hook holds the save at its start)."""
    entered, release = threading.Event(), threading.Event()

    def hold(req_id: str) -> None:
        entered.set()
        assert release.wait(30)

    io = _io(node.unix_address, _layers(3), before_save=hold)
    io.submit_save("r1", "", [(H[0], 1)])
    io.submit_save("r0", "", [])  # a request whose saves were all empty is reported at once
    io.mark_finished({"r1", "r0", "never-saved"})
    assert entered.wait(30)
    assert io.poll_finished() == {"r0"}
    waiter = threading.Thread(target=io.wait_for_saves, args=(["r1"],))
    waiter.start()
    waiter.join(timeout=0.3)
    assert waiter.is_alive(), "wait_for_saves (preemption barrier) returned while the save ran"
    assert io.poll_finished() == set()
    release.set()
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    assert io.poll_finished() == {"r1"}
    assert io.poll_finished() == set()  # exactly once
    assert io.stats.blocks_saved == 1
    io.close()


def test_config_rejects_unknown_keys_and_bad_values() -> None:
    with pytest.raises(InvalidArgument, match="adress"):
        ConnectorConfig.from_extra({"adress": "unix:/x"})
    with pytest.raises(InvalidArgument, match="timeout_ms"):
        ConnectorConfig.from_extra({"timeout_ms": 0})
    assert ConnectorConfig.from_extra(None).lookup_timeout_ms == 50
    assert ConnectorConfig.from_extra({"replicas": 2}).replicas == 2
    with pytest.raises(InvalidArgument, match=r"replicas: Input should be less than or equal to 8"):
        ConnectorConfig.from_extra({"replicas": 9})


def test_blockio_rejects_mismatched_layers(node) -> None:
    layers = _layers(None)
    layers[1] = np.zeros((NUM_BLOCKS, BLOCK_BYTES + 1), np.uint8)
    with pytest.raises(InvalidArgument, match="KV layer 1"):
        _io(node.unix_address, layers)
    io = _io(node.unix_address, _layers(None))
    with pytest.raises(InvalidArgument, match="block id"):
        io.load("", [(H[0], NUM_BLOCKS)])
