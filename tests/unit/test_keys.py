"""Key scheme: golden vectors pin hash scheme v1; properties of the chain."""

from __future__ import annotations

import os
import subprocess
import sys

import blake3
import numpy as np
import pytest

from kvstored.errors import InvalidArgument
from kvstored.keys import HASH_BYTES, Namespace, block_hashes, hash_block

NS = Namespace(
    model_id="HuggingFaceTB/SmolLM2-135M-Instruct", revision="main", kv_dtype="bfloat16", block_size=4
)

# Golden vectors for hash scheme v1. If these change, every stored block in every deployment
# becomes unreachable: bump HASH_SCHEME_VERSION instead of editing them.
GOLDEN_NS_ID = "580ba0c539829b52aae171ef7b6c4a9a"
GOLDEN_ROOT = "237899e26987611a5802cca5f34a2874"
GOLDEN_PLAIN = ["062236abf6e19d192f4d81c0de81a5bd", "069f09c184e6cb616a886c31629c3c95"]
GOLDEN_LORA = ["b01bec432e335ef11d82098d56e6d514", "53d6e6748be1c54181136503372ad8f9"]
GOLDEN_EXTRA = ["7efdb9baa8899d871140d2ea7654dff4"]

_SCRIPT = """
from kvstored.keys import Namespace, block_hashes
ns = Namespace(model_id="HuggingFaceTB/SmolLM2-135M-Instruct", revision="main",
               kv_dtype="bfloat16", block_size=4)
print(",".join(h.hex() for h in block_hashes(ns, list(range(10)))))
print(",".join(h.hex() for h in block_hashes(ns, list(range(8)), lora="sql-adapter")))
"""


def _u32le(n: int) -> bytes:
    return n.to_bytes(4, "little")


def _documented_ns_id(fields: list[object]) -> bytes:
    """The namespace id as kvstored/keys.py's module docstring defines it, assembled here."""
    raw = b"kvstored/ns/v1" + _u32le(1)
    for value in fields:
        text = str(value).encode("utf-8")
        raw += _u32le(len(text)) + text
    return blake3.blake3(raw).digest()[:16]


def _documented_block(parent: bytes, tokens: list[int], extras: list[tuple[bytes, bytes]]) -> bytes:
    raw = b"kvstored/block/v1" + parent + _u32le(len(tokens)) + b"".join(_u32le(t) for t in tokens)
    raw += _u32le(len(extras)) + b"".join(tag + _u32le(len(p)) + p for tag, p in extras)
    return blake3.blake3(raw).digest()[:16]


def test_golden_vectors_follow_the_documented_encoding() -> None:
    """Recompute every golden vector from the module docstring's encoding, independently of
    the code: the docstring, the vectors and the code must all agree."""
    ns_id = _documented_ns_id(["HuggingFaceTB/SmolLM2-135M-Instruct", "main", "bfloat16",
                               "layers,kv,heads,tokens,dim", 4, 1, 0, ""])
    assert ns_id.hex() == GOLDEN_NS_ID
    root = blake3.blake3(b"kvstored/root/v1" + ns_id).digest()[:16]
    assert root.hex() == GOLDEN_ROOT
    plain, parent = [], root
    for i in range(2):
        parent = _documented_block(parent, list(range(4 * i, 4 * i + 4)), [])
        plain.append(parent.hex())
    assert plain == GOLDEN_PLAIN
    lora, parent = [], root
    for i in range(2):
        parent = _documented_block(parent, list(range(4 * i, 4 * i + 4)), [(b"s", b"lora:sql-adapter")])
        lora.append(parent.hex())
    assert lora == GOLDEN_LORA
    extra = _documented_block(root, [2**32 - 1] * 4, [(b"s", b"img:abc"), (b"b", b"\x00\x01"), (b"i", b"7")])
    assert [extra.hex()] == GOLDEN_EXTRA
    # a field the golden namespace leaves at its default is still part of the encoding
    salted = Namespace(model_id=NS.model_id, block_size=4, tp_size=2, tp_rank=1, tenant_salt="t")
    assert salted.id == _documented_ns_id([NS.model_id, "main", "bfloat16", "layers,kv,heads,tokens,dim",
                                           4, 2, 1, "t"])


def test_golden_vectors() -> None:
    assert NS.id.hex() == GOLDEN_NS_ID
    assert NS.root_hash.hex() == GOLDEN_ROOT
    assert [h.hex() for h in block_hashes(NS, list(range(10)))] == GOLDEN_PLAIN
    assert [h.hex() for h in block_hashes(NS, list(range(8)), lora="sql-adapter")] == GOLDEN_LORA
    extra = block_hashes(NS, [2**32 - 1] * 4, extra_keys=[["img:abc", b"\x00\x01", 7]])
    assert [h.hex() for h in extra] == GOLDEN_EXTRA


@pytest.mark.parametrize("seed", ["0", "12345"])
def test_identical_keys_across_processes_and_hash_seeds(seed: str) -> None:
    env = dict(os.environ, PYTHONHASHSEED=seed)
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0].split(",") == GOLDEN_PLAIN
    assert out[1].split(",") == GOLDEN_LORA


def test_trailing_partial_block_gets_no_hash() -> None:
    assert len(block_hashes(NS, list(range(11)))) == 2
    assert len(block_hashes(NS, list(range(3)))) == 0
    assert block_hashes(NS, list(range(11))) == block_hashes(NS, list(range(8)))


def test_one_changed_token_changes_hashes_from_that_block_on() -> None:
    tokens = list(range(100, 132))  # 8 blocks
    base = block_hashes(NS, tokens)
    for pos in (0, 5, 17, 31):
        changed = list(tokens)
        changed[pos] += 1
        other = block_hashes(NS, changed)
        blk = pos // NS.block_size
        assert other[:blk] == base[:blk]
        assert all(a != b for a, b in zip(other[blk:], base[blk:], strict=True))


@pytest.mark.parametrize(
    "field,value",
    [("model_id", "other"), ("revision", "v2"), ("kv_dtype", "float16"), ("tp_size", 2),
     ("kv_layout", "kv,layers"), ("tenant_salt", "tenant-b")],
)
def test_namespace_change_changes_every_hash(field: str, value: object) -> None:
    tokens = list(range(16))
    other_ns = Namespace(**{**NS.to_dict(), field: value})
    assert all(
        a != b for a, b in zip(block_hashes(NS, tokens), block_hashes(other_ns, tokens), strict=True)
    )


def test_lora_and_extra_keys_change_hashes() -> None:
    tokens = list(range(16))
    plain = block_hashes(NS, tokens)
    assert all(a != b for a, b in zip(plain, block_hashes(NS, tokens, lora="a"), strict=True))
    assert block_hashes(NS, tokens, lora="a") != block_hashes(NS, tokens, lora="b")
    # an extra key on block 2 only changes blocks 2.. (the chain carries it forward)
    mm = block_hashes(NS, tokens, extra_keys=[None, None, ["img:1"]])
    assert mm[:2] == plain[:2] and mm[2] != plain[2] and mm[3] != plain[3]


def test_numpy_and_list_inputs_agree() -> None:
    tokens = list(range(40))
    for dtype in (np.int32, np.int64, np.uint32):
        assert block_hashes(NS, np.array(tokens, dtype=dtype)) == block_hashes(NS, tokens)
    assert all(len(h) == HASH_BYTES for h in block_hashes(NS, tokens))


@pytest.mark.parametrize(
    "tokens,match",
    [([-1, 0, 0, 0], "token ids must be in"), ([2**32, 0, 0, 0], "token ids must be in"),
     ([[1, 2], [3, 4]], "one-dimensional"), ([1.5, 2.0, 3.0, 4.0], "integers")],
)
def test_bad_tokens_rejected(tokens: object, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        block_hashes(NS, tokens)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs,match",
    [({"model_id": ""}, "model_id"), ({"model_id": "a b"}, "model_id"),
     ({"model_id": "m", "block_size": 0}, "block_size"),
     ({"model_id": "m", "tp_size": 2, "tp_rank": 2}, "tp_rank"),
     ({"model_id": "m", "kv_dtype": "float64"}, "kv_dtype")],
)
def test_bad_namespace_rejected(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        Namespace(**kwargs)  # type: ignore[arg-type]


def test_bad_parent_and_extra_keys() -> None:
    with pytest.raises(InvalidArgument, match="parent hash"):
        hash_block(b"short", [1, 2])
    with pytest.raises(InvalidArgument, match="extra key"):
        hash_block(NS.root_hash, [1], [3.5])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match="extra_keys has"):
        block_hashes(NS, list(range(4)), extra_keys=[[1], [2]])


def test_namespace_dict_round_trip() -> None:
    assert Namespace.from_dict(NS.to_dict()) == NS
    with pytest.raises(InvalidArgument, match="unknown Namespace field"):
        Namespace.from_dict({"model_id": "m", "colour": "red"})
