"""kvstored.client.torch: tensors of any dtype round-trip bit for bit; mismatches raise.

Most tests run against the in-process dict store of the demo (the client's shape, no
daemon); the last ones go through a real ``kvstored serve`` process.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch (the [torch] extra) is not installed")

from helpers import key  # noqa: E402

from kvstored.client.torch import (  # noqa: E402
    DTYPE_CODES,
    decode_tensor_meta,
    encode_tensor_meta,
    get_tensors,
    get_tensors_async,
    get_tensors_into,
    get_tensors_into_async,
    put_tensors,
    put_tensors_async,
    tensor_bytes,
)
from kvstored.demo.store import InProcessStore  # noqa: E402
from kvstored.errors import DtypeMismatch, InvalidArgument  # noqa: E402

DTYPES = [
    torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2,
    torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool, torch.float64,
]


def _random(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Random bit patterns of any dtype (bf16/fp8 included, NaN patterns too for floats)."""
    g = torch.Generator().manual_seed(seed)
    probe = torch.empty(shape, dtype=dtype)
    nbytes = probe.numel() * probe.element_size()
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def _bits(t: torch.Tensor) -> bytes:
    return tensor_bytes(t.contiguous()).tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_round_trip_is_bit_exact_for_every_dtype(dtype: torch.dtype) -> None:
    store = InProcessStore()
    tensors = [_random((3, 5, 7), dtype, seed=1), _random((64,), dtype, seed=2)]
    results = put_tensors(store, [key(1), key(2)], tensors)
    assert all(r.ok and r.stored for r in results)

    got = get_tensors(store, [key(1), key(2), key(3)], dtype=dtype)
    assert got[2] is None
    for want, have in zip(tensors, got[:2], strict=True):
        assert have is not None and have.dtype == dtype and have.shape == want.shape
        assert _bits(have) == _bits(want)

    outs = [torch.empty((3, 5, 7), dtype=dtype), torch.empty((64,), dtype=dtype)]
    assert get_tensors_into(store, [key(1), key(2)], outs) == [True, True]
    for want, have in zip(tensors, outs, strict=True):
        assert _bits(have) == _bits(want)


def test_get_into_writes_straight_into_the_tensor_memory() -> None:
    store = InProcessStore()
    src = _random((4, 256), torch.bfloat16)
    put_tensors(store, [key(1)], [src])
    out = torch.zeros((4, 256), dtype=torch.bfloat16)
    ptr = out.data_ptr()
    seen: list[int] = []
    real = store.get_into

    def spy(keys, buffers, *, return_meta=False):  # type: ignore[no-untyped-def]
        seen.extend(b.__array_interface__["data"][0] for b in buffers)
        return real(keys, buffers, return_meta=return_meta)

    store.get_into = spy  # type: ignore[method-assign]
    assert get_tensors_into(store, [key(1)], [out]) == [True]
    assert seen == [ptr]  # the client got the tensor's own memory: no staging copy
    assert torch.equal(out.view(torch.int16), src.view(torch.int16))


def test_non_contiguous_tensors_round_trip() -> None:
    store = InProcessStore()
    base = _random((8, 6), torch.float32)
    src = base.t()  # non-contiguous
    put_tensors(store, [key(1)], [src])
    (got,) = get_tensors(store, [key(1)])
    assert got is not None and got.shape == (6, 8) and _bits(got) == _bits(src)
    out_base = torch.zeros((8, 6))
    out = out_base.t()
    assert get_tensors_into(store, [key(1)], [out]) == [True]
    assert _bits(out) == _bits(src) and out.data_ptr() == out_base.data_ptr()


def test_miss_leaves_the_out_tensor_untouched() -> None:
    out = torch.full((4,), 7.0)
    assert get_tensors_into(InProcessStore(), [key(9)], [out]) == [False]
    assert torch.equal(out, torch.full((4,), 7.0))


@pytest.mark.parametrize(
    ("stored", "expected_dtype", "expected_shape"),
    [
        ((torch.float32, (2, 3)), torch.bfloat16, None),
        ((torch.bfloat16, (2, 3)), torch.float8_e4m3fn, None),
        ((torch.float32, (2, 3)), None, (3, 2)),
        ((torch.float16, (6,)), torch.float16, (2, 3)),
    ],
)
def test_get_tensors_mismatch_names_index_expected_and_found(  # type: ignore[no-untyped-def]
    stored, expected_dtype, expected_shape
) -> None:
    dtype, shape = stored
    store = InProcessStore()
    put_tensors(store, [key(1), key(2)], [_random(shape, dtype), _random(shape, dtype)])
    with pytest.raises(DtypeMismatch) as info:
        get_tensors(store, [key(5), key(2)], dtype=expected_dtype, shape=expected_shape)
    msg = str(info.value)
    assert "key 1" in msg
    assert f"found dtype={str(dtype).removeprefix('torch.')} shape={shape}" in msg
    if expected_dtype is not None:
        assert f"expected dtype={str(expected_dtype).removeprefix('torch.')}" in msg


def test_get_into_same_size_other_dtype_raises_not_garbage() -> None:
    """float32 (2,2) and int32 (2,2) and bfloat16 (2,4) all have 16 bytes: must still raise."""
    store = InProcessStore()
    put_tensors(store, [key(1)], [torch.arange(4, dtype=torch.float32).reshape(2, 2)])
    for out in (torch.empty((2, 2), dtype=torch.int32), torch.empty((2, 4), dtype=torch.bfloat16),
                torch.empty((4,), dtype=torch.float32)):
        with pytest.raises(DtypeMismatch, match=r"key 0: expected dtype=\w+ shape=\(.*\); found "
                                                r"dtype=float32 shape=\(2, 2\)"):
            get_tensors_into(store, [key(1)], [out])


def test_get_into_buffer_too_small_becomes_a_dtype_mismatch() -> None:
    store = InProcessStore()
    put_tensors(store, [key(1)], [torch.zeros((4, 4), dtype=torch.float32)])
    with pytest.raises(DtypeMismatch, match=r"key 0: expected dtype=float16 shape=\(4, 4\); found "
                                            r"dtype=float32 shape=\(4, 4\)"):
        get_tensors_into(store, [key(1)], [torch.empty((4, 4), dtype=torch.float16)])


def test_block_without_tensor_header_is_refused() -> None:
    store = InProcessStore()
    store.put([key(1), key(2)], [b"\x00" * 16, b"\x00" * 16], metas=[b"", b"something else"])
    with pytest.raises(DtypeMismatch, match="key 0: the block carries no tensor metadata"):
        get_tensors(store, [key(1)])
    with pytest.raises(DtypeMismatch, match="key 0: .*not a tensor header"):
        get_tensors_into(store, [key(2)], [torch.empty((4,), dtype=torch.float32)])


def test_meta_encoding_is_small_versioned_and_stable() -> None:
    meta = encode_tensor_meta(torch.bfloat16, (30, 2, 3, 256, 64))
    # golden bytes: magic, version 1, dtype code 3 (bfloat16), ndim 5, reserved, u64 dims
    assert meta.hex() == (
        "6b7654" "01" "03" "05" "0000"
        "1e00000000000000" "0200000000000000" "0300000000000000" "0001000000000000"
        "4000000000000000"
    )
    assert len(meta) == 8 + 8 * 5
    decoded = decode_tensor_meta(meta)
    assert decoded.dtype == "bfloat16" and decoded.shape == (30, 2, 3, 256, 64)
    assert decoded.num_bytes == 30 * 2 * 3 * 256 * 64 * 2
    newer = meta[:3] + bytes([2]) + meta[4:]
    with pytest.raises(DtypeMismatch, match="version 2"):
        decode_tensor_meta(newer, index=4)
    with pytest.raises(DtypeMismatch, match="truncated"):
        decode_tensor_meta(meta[:-1])
    assert len(set(DTYPE_CODES.values())) == len(DTYPE_CODES)
    assert DTYPE_CODES["bfloat16"] == 3 and DTYPE_CODES["float8_e4m3fn"] == 5


def test_bad_arguments_raise_invalid_argument() -> None:
    store = InProcessStore()
    with pytest.raises(InvalidArgument, match="same length"):
        put_tensors(store, [key(1)], [])
    with pytest.raises(InvalidArgument, match="torch.Tensor"):
        put_tensors(store, [key(1)], [b"raw"])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match="same length"):
        get_tensors_into(store, [key(1), key(2)], [torch.empty(1)])
    with pytest.raises(InvalidArgument, match="no tensor-header code"):
        encode_tensor_meta(torch.complex32, (1,))


def test_async_helpers_round_trip() -> None:
    class AsyncStore:
        def __init__(self) -> None:
            self.inner = InProcessStore()

        async def put(self, keys, values, *, metas=None):  # type: ignore[no-untyped-def]
            return self.inner.put(keys, values, metas=metas)

        async def get_blocks(self, keys):  # type: ignore[no-untyped-def]
            return self.inner.get_blocks(keys)

        async def get_into(  # type: ignore[no-untyped-def]
            self, keys, buffers, *, return_meta=False
        ):
            return self.inner.get_into(keys, buffers, return_meta=return_meta)

    async def main() -> None:
        store = AsyncStore()
        src = _random((5, 5), torch.float8_e4m3fn)
        await put_tensors_async(store, [key(1)], [src])
        (got,) = await get_tensors_async(store, [key(1)], dtype=torch.float8_e4m3fn)
        assert got is not None and _bits(got) == _bits(src)
        out = torch.empty((5, 5), dtype=torch.float8_e4m3fn)
        assert await get_tensors_into_async(store, [key(1)], [out]) == [True]
        assert _bits(out) == _bits(src)
        with pytest.raises(DtypeMismatch):
            await get_tensors_into_async(store, [key(1)], [torch.empty((5, 5), dtype=torch.int8)])

    asyncio.run(main())


def test_importing_kvstored_does_not_import_torch() -> None:
    code = (
        "import sys, kvstored, kvstored.client, kvstored.demo, kvstored.demo.cli; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


# ---- against a real daemon --------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from kvstored.demo.daemon import ManagedDaemon

    d = ManagedDaemon(tmp_path_factory.mktemp("torchd"), dram_size="64MiB", ssd_size="64MiB")
    d.start()
    yield d
    d.stop()


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_real_daemon_round_trip_and_mismatch(  # type: ignore[no-untyped-def]
    daemon, transport: str
) -> None:
    from kvstored import Client, Namespace, block_hashes

    ns = Namespace("test/torch", kv_dtype="bfloat16", block_size=4, tenant_salt=transport)
    keys = block_hashes(ns, list(range(12)))
    tensors = [_random((2, 3, 64), torch.bfloat16, seed=i) for i in range(2)]
    tensors.append(_random((1024,), torch.float8_e4m3fn, seed=9))
    with Client(daemon.address, namespace=ns, transport=transport) as client:
        results = put_tensors(client, keys, tensors)
        assert [r.ok for r in results] == [True, True, True]
        got = get_tensors(client, keys[:2], dtype=torch.bfloat16, shape=(2, 3, 64))
        assert all(g is not None and _bits(g) == _bits(t) for g, t in zip(got, tensors, strict=False))
        outs = [torch.empty((2, 3, 64), dtype=torch.bfloat16) for _ in range(2)]
        outs.append(torch.empty((1024,), dtype=torch.float8_e4m3fn))
        assert get_tensors_into(client, keys, outs) == [True, True, True]
        assert all(_bits(o) == _bits(t) for o, t in zip(outs, tensors, strict=True))
        # same byte size, other dtype: refused, never reinterpreted
        with pytest.raises(DtypeMismatch, match="key 1: expected dtype=float16"):
            get_tensors_into(
                client, keys[:2],
                [torch.empty((2, 3, 64), dtype=torch.bfloat16),
                 torch.empty((2, 3, 64), dtype=torch.float16)],
            )
        with pytest.raises(
            DtypeMismatch, match=r"key 0: expected dtype=bfloat16 shape=\(3, 2, 64\)"
        ):
            get_tensors(client, keys[:1], shape=(3, 2, 64))


def test_put_tensors_passes_replicas_to_the_client_only_when_named() -> None:
    seen: list[dict[str, object]] = []

    class Recording:
        def put(self, keys, values, **kw):  # type: ignore[no-untyped-def]
            seen.append(kw)
            return InProcessStore().put(keys, values, metas=kw.get("metas"))

    rec = Recording()
    t = torch.zeros(4)
    put_tensors(rec, [key(1)], [t])
    put_tensors(rec, [key(2)], [t], replicas=2)

    class Async:
        async def put(self, keys, values, **kw):  # type: ignore[no-untyped-def]
            return rec.put(keys, values, **kw)

    asyncio.run(put_tensors_async(Async(), [key(3)], [t], replicas=3))
    assert [("replicas" in s, s.get("replicas")) for s in seen] == [
        (False, None), (True, 2), (True, 3)]  # a client without replicas= still works
