"""kvstored.native: the C copy_many and its pure-Python fallback, on the same inputs."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import mmap
import os
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Callable
from types import ModuleType

import numpy as np
import pytest

from kvstored import native

ROOT = pathlib.Path(__file__).resolve().parents[2]
CopyMany = Callable[..., int]


def _build(tmp: pathlib.Path) -> ModuleType:
    """The extension built from native/copy.c into ``tmp`` (the shared test venv may hold a
    checkout where ``pip install -e`` has not built it)."""
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler: only the fallback can run here")
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp / "lib"),
         "--build-temp", str(tmp / "tmp")],
        cwd=ROOT, check=True, capture_output=True,
    )
    (so,) = (tmp / "lib" / "kvstored").glob("_native.*.so")
    loader = importlib.machinery.ExtensionFileLoader("kvstored._native", str(so))
    spec = importlib.util.spec_from_file_location("kvstored._native", so, loader=loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def c_copy_many(tmp_path_factory: pytest.TempPathFactory) -> CopyMany:
    if native.native_copy_many is not None:
        return native.native_copy_many
    return _build(tmp_path_factory.mktemp("native")).copy_many  # type: ignore[no-any-return]


SIZES = [0, 1, 4095, 4097, 256 << 10, (1 << 20) + 3, 5 << 20, (7 << 20) + 11, 9 << 20]  # 22+ MiB


def _inputs(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, n, dtype=np.uint8) for n in SIZES]


def _run(copy: CopyMany, threads: int, stream: bool = False) -> tuple[bytes, int]:
    srcs = _inputs(7)
    arena = mmap.mmap(-1, sum(SIZES) + 1)
    view = memoryview(arena)
    pairs, off = [], 0
    for s in srcs:  # dst: consecutive arena slices (as the client's puts), src: numpy arrays
        pairs.append((view[off : off + s.size], memoryview(s)))
        off += s.size  # (odd sizes: most destinations start unaligned, as streamed heads do)
    n = copy(pairs, threads=threads, stream=stream)
    return bytes(arena[:off]), n  # (the mapping goes with its last view)


@pytest.mark.parametrize("stream", [False, True], ids=["memcpy", "stream"])
@pytest.mark.parametrize("threads", [0, 1, 2, 3, 16])
def test_native_and_fallback_copy_the_same_bytes(c_copy_many: CopyMany, threads: int, stream: bool) -> None:
    """Both copies, and the C one with non-temporal stores (``stream=True``, what the put
    path asks), write the same bytes (threads >= 2: > 16 MiB runs the threaded path)."""
    want = b"".join(s.tobytes() for s in _inputs(7))
    got_c, n_c = _run(c_copy_many, threads, stream)
    got_py, n_py = _run(native.py_copy_many, threads, stream)
    assert n_c == n_py == len(want)
    assert got_c == want
    assert got_py == want


# (dst - src) % 4096 of the pairs below: 0, then 1..63 (the C copy's vector loop: see
# native/copy.c copy_bytes), the edges of that window and a few others (memcpy)
DISTANCES = [0, 1, 8, 15, 16, 17, 31, 32, 48, 63, 64, 65, 2048, 4032, 4080, 4095]
ALIAS_SIZES = [4095, 4096, 4096 + 63, 4096 + 64, (256 << 10) + 5]


@pytest.mark.parametrize("which", ["c", "py"])
def test_copies_at_every_distance_mod_4096_write_exactly_their_bytes(c_copy_many: CopyMany, which: str) -> None:
    """A page-aligned source (an arena block) into destinations 0..4095 bytes past a page:
    every byte copied, none beside the destination touched (the C copy takes its vector loop
    for distances 1..63 and pieces of 4 KiB and more, memcpy otherwise; both ends of the
    loop, its head and tail, are exercised by the odd sizes)."""
    copy = c_copy_many if which == "c" else native.py_copy_many
    rng = np.random.default_rng(18)
    src_map = mmap.mmap(-1, max(ALIAS_SIZES) + 4096)  # page-aligned
    src = np.frombuffer(src_map, dtype=np.uint8)
    src[:] = rng.integers(0, 256, src.size, dtype=np.uint8)
    dst_map = mmap.mmap(-1, 2 * (max(ALIAS_SIZES) + 8192))
    dst = np.frombuffer(dst_map, dtype=np.uint8)
    for size in ALIAS_SIZES:
        for d in DISTANCES:
            for s_off in (0, 4096 - 16):  # the source on a page, and 16 bytes before the next
                dst[:] = 0xA5
                d_off = 4096 + (s_off + d) % 4096  # (dst - src) % 4096 == d
                pairs = [(memoryview(dst)[d_off : d_off + size], memoryview(src)[s_off : s_off + size])]
                assert (dst.ctypes.data + d_off - src.ctypes.data - s_off) % 4096 == d
                assert copy(pairs) == size
                assert bytes(dst[d_off : d_off + size]) == bytes(src[s_off : s_off + size]), (size, d, s_off)
                assert not (dst[:d_off] != 0xA5).any() and not (dst[d_off + size :] != 0xA5).any(), (size, d)
    del pairs, src, dst


@pytest.mark.parametrize("which", ["c", "py"])
def test_bad_pairs_raise_before_any_byte_is_copied(c_copy_many: CopyMany, which: str) -> None:
    copy = c_copy_many if which == "c" else native.py_copy_many
    dst = bytearray(8)
    with pytest.raises(ValueError, match=r"pair #1: dst is 4 bytes but src is 5"):
        copy([(dst, b"abcdefgh"), (bytearray(4), b"12345")])
    assert dst == bytearray(8)  # pair #0 was not copied either
    with pytest.raises(ValueError, match=r"dst of pair #0 must be a writable"):
        copy([(b"readonly", b"abcdefgh")])
    with pytest.raises(TypeError, match=r"pair #0 must be a \(dst, src\) tuple, got list"):
        copy([[dst, b"abcdefgh"]])
    with pytest.raises(TypeError, match=r"src of pair #0 must be a C-contiguous buffer, got int"):
        copy([(dst, 5)])
    assert copy([]) == 0


def test_kvstored_native_0_forces_the_fallback() -> None:
    env = {**os.environ, "KVSTORED_NATIVE": "0", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", "import logging; logging.basicConfig(level=logging.INFO); "
         "import kvstored.native as n; d = bytearray(2); "
         "print(n.NATIVE, n.copy_many([(d, b'ab')]), n.copy_many([(d, b'cd')]), bytes(d))"],
        env=env, capture_output=True, text=True, check=True,
    )
    assert out.stdout.split() == ["False", "2", "2", "b'cd'"]  # stdout stays clean
    logged = [ln for ln in out.stderr.splitlines() if "native_copy_fallback" in ln]
    assert len(logged) == 1 and "KVSTORED_NATIVE=0" in logged[0]  # one line, saying why


def test_bench_native_rows_have_their_fields() -> None:
    """bench/bench_native.py (the native_copy rows of bench_blocks) runs; no timing asserted."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import bench_native
    finally:
        sys.path.remove(str(ROOT / "bench"))
    res = bench_native.bench_native_copy([4096, 1 << 20], batch=2, iters=2)
    assert res["native_built"] is native.NATIVE
    for size in ("4KiB", "1MiB"):
        row = res[size]
        assert isinstance(row, dict)
        assert {"memcpy_gbps", "fallback_gbps", "native_gbps", "native_1t_gbps",
                "native_vs_fallback", "native_vs_memcpy"} <= set(row)
        assert row["fallback_gbps"] > 0


def test_bench_commit_rows_have_their_fields() -> None:
    """bench/bench_commit.py (the node's CommitSlots, native and Python publish) runs and
    commits every write in both rows; no timing asserted."""
    if native.publish_many is None:
        pytest.skip("kvstored._native not built")
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import bench_commit
    finally:
        sys.path.remove(str(ROOT / "bench"))
    res = bench_commit.run(batch=4, size=8192, reps=3)
    assert res["native_built"] is True
    for row in ("native", "python"):
        assert {"call_p50_us", "call_p90_us", "call_per_block_us", "store_commit_p50_us",
                "publish_p50_us"} <= set(res[row])
        assert res[row]["publish_p50_us"] > 0
    assert res["python_vs_native_call"] > 0


# copy_at (a put's copy into its slots): C and fallback on the same inputs
CopyAt = Callable[..., int]
AT_SIZES = [0, 1, 4095, 4097, 256 << 10, (1 << 20) + 3, 5 << 20]


@pytest.fixture(scope="module")
def c_copy_at(tmp_path_factory: pytest.TempPathFactory) -> CopyAt:
    if native.native_copy_at is not None:
        return native.native_copy_at
    return _build(tmp_path_factory.mktemp("native_at")).copy_at  # type: ignore[no-any-return]


def _run_at(copy: CopyAt, stream: bool) -> tuple[bytes, int, bytes]:
    rng = np.random.default_rng(3)
    srcs: list[object] = [rng.integers(0, 256, n, dtype=np.uint8) for n in AT_SIZES]
    srcs[1] = bytes(srcs[1])  # type: ignore[arg-type]  # (an ndarray: any buffer is a value)
    gap = 7  # odd offsets: unaligned heads, as a streamed copy meets them
    offsets, off = [], gap
    for n in AT_SIZES:
        offsets.append(off)
        off += n + gap
    arena = mmap.mmap(-1, off)
    want = bytearray(off)
    for o, s in zip(offsets, srcs, strict=True):
        want[o : o + len(memoryview(s))] = memoryview(s)  # type: ignore[arg-type]  # buffers
    n = copy(memoryview(arena), offsets[::-1], srcs[::-1], stream=stream)  # (any order)
    return bytes(arena), n, bytes(want)


@pytest.mark.parametrize("stream", [False, True], ids=["memcpy", "stream"])
def test_copy_at_native_and_fallback_copy_the_same_bytes(c_copy_at: CopyAt, stream: bool) -> None:
    got_c, n_c, want = _run_at(c_copy_at, stream)
    got_py, n_py, _ = _run_at(native.py_copy_at, stream)
    assert n_c == n_py == sum(AT_SIZES)
    assert got_c == want
    assert got_py == want


@pytest.mark.parametrize("which", ["c", "py"])
def test_copy_at_bad_inputs_raise_before_any_byte_is_copied(c_copy_at: CopyAt, which: str) -> None:
    copy = c_copy_at if which == "c" else native.py_copy_at
    dst = bytearray(16)
    with pytest.raises(ValueError, match=r"item #1: range \[14, \+3\) is outside the 16-byte dst"):
        copy(dst, [0, 14], [b"abcd", b"xyz"])
    assert dst == bytearray(16)  # item #0 was not copied either
    with pytest.raises(ValueError, match=r"item #0: range \[-1, \+1\) is outside"):
        copy(dst, [-1], [b"a"])
    with pytest.raises(ValueError, match=r"dst must be a writable C-contiguous buffer, got bytes"):
        copy(b"readonly", [0], [b"a"])
    with pytest.raises(TypeError, match=r"src #1 must be a C-contiguous buffer, got int"):
        copy(dst, [0, 4], [b"abcd", 5])
    with pytest.raises(TypeError, match=r"offset #0 must be an int, got str"):
        copy(dst, ["0"], [b"a"])
    with pytest.raises(ValueError, match=r"2 offsets for 1 srcs"):
        copy(dst, [0, 1], [b"a"])
    assert dst == bytearray(16)
    assert copy(dst, [], []) == 0
