"""Run by tests/e2e/test_e2e_kv_events.py with the vLLM venv's python: read the master's
KV events with vLLM's own classes and route with them.

argv: REPLAY_ENDPOINT REQUEST_KEYS_HEX (comma-separated). Prints one JSON object:
``vllm_decoded`` (per event: type, medium, block hashes hex, as vLLM's
``msgspec.msgpack.Decoder(KVEventBatch)`` read them), ``pick`` (the router's node and
prefix length), ``same_bytes`` (vLLM's encoder and kvstored's encode a BlockStored without
extensions to the same bytes).
"""

from __future__ import annotations

import json
import sys

import msgspec
import zmq
from vllm.distributed import kv_events as vk

from kvstored.integrations.router import PrefixRouter
from kvstored.kv_events import BlockStored, KVEventBatch, encode_batch


class NodeBlockStored(vk.BlockStored, tag="BlockStored"):
    """vLLM's BlockStored with kvstored's extension fields (a router built on vLLM's
    classes that wants to know the node)."""

    node_id: str | None = None
    tier: str | None = None
    namespace_id: bytes | None = None


class NodeBlockRemoved(vk.BlockRemoved, tag="BlockRemoved"):
    node_id: str | None = None
    tier: str | None = None
    namespace_id: bytes | None = None


class NodeKVEventBatch(vk.EventBatch):
    events: list[NodeBlockStored | NodeBlockRemoved | vk.AllBlocksCleared]


def replay_all(endpoint: str) -> list[bytes]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send_multipart((b"", (0).to_bytes(8, "big")))
    payloads = []
    while True:
        if not sock.poll(10_000):
            raise SystemExit("no END_SEQ from the replay socket within 10 s")
        _, _, seq, payload = sock.recv_multipart()
        if seq == vk.ZmqEventPublisher.END_SEQ:
            return payloads
        payloads.append(payload)


def main() -> None:
    endpoint, keys_hex = sys.argv[1], sys.argv[2]
    request = [bytes.fromhex(k) for k in keys_hex.split(",")]
    payloads = replay_all(endpoint)
    plain = msgspec.msgpack.Decoder(vk.KVEventBatch)
    extended = msgspec.msgpack.Decoder(NodeKVEventBatch)
    decoded = []
    router = PrefixRouter()
    for p in payloads:
        for ev in plain.decode(p).events:
            decoded.append({"type": type(ev).__name__, "medium": getattr(ev, "medium", None),
                            "block_hashes": [h.hex() for h in getattr(ev, "block_hashes", [])]})
        router.apply_batch(extended.decode(p))
    pick = router.pick(request)
    ours = BlockStored(block_hashes=[b"k" * 16], parent_block_hash=None, token_ids=[],
                       block_size=0, lora_id=None, medium="CPU", lora_name=None)
    theirs = vk.BlockStored(block_hashes=[b"k" * 16], parent_block_hash=None, token_ids=[],
                            block_size=0, lora_id=None, medium="CPU", lora_name=None)
    same = encode_batch(KVEventBatch(ts=1.0, events=[ours])) == msgspec.msgpack.encode(
        vk.KVEventBatch(ts=1.0, events=[theirs]))
    print(json.dumps({"vllm_decoded": decoded, "pick": [pick.node_id, pick.num_blocks],
                      "same_bytes": same}))


if __name__ == "__main__":
    main()
