"""Measure a real model on this machine and fit a :class:`CostProfile` (``kvstored calibrate``).

The model is Llama-shaped, built from a ``transformers.LlamaConfig`` with random weights (no
download): the cost of a forward pass depends on the shapes, not on the weights. Measured:

- prefill: forward time of ``n - p`` new tokens on top of a cached prefix of ``p`` tokens, for a
  grid of ``n`` and ``p``; fitted to ``base + a*(n-p) + b*(n**2-p**2)``;
- decode: time of one decode step for ``b`` sequences of ``c`` context tokens each; fitted to
  ``base + a*b + k*(b*c)``;
- bandwidth: a large host memory copy (the "local DRAM" source on a CPU-only machine) and a
  sequential read of a temporary file after asking the kernel to drop it from the page cache
  ("local SSD"). Remote bandwidths cannot be measured on one host; they are copied from the base
  profile and marked as such in ``fit``.

Coefficients are fitted by least squares, constrained non-negative (a negative term is dropped
and the rest refitted). Residuals go into ``fit``.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kvstored.errors import InvalidArgument
from kvstored.scheduler.costmodel import (
    Bandwidths,
    CostProfile,
    DecodeCoefficients,
    PrefillCoefficients,
)

ProgressFn = Callable[[str], None]


def fit_nonnegative(features: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Least-squares coefficients >= 0 for ``features @ coef ~= target``.

    Args:
        features: shape (samples, terms).
        target: shape (samples,).

    Returns:
        shape (terms,), each >= 0.

    Raises:
        InvalidArgument: fewer samples than terms, or shapes that do not match.
    """
    if features.ndim != 2 or target.shape != (features.shape[0],):
        raise InvalidArgument(
            f"features must be (samples, terms) and target (samples,), got {features.shape} "
            f"and {target.shape}"
        )
    n, k = features.shape
    if n < k:
        raise InvalidArgument(f"need at least {k} samples to fit {k} terms, got {n}")
    active = list(range(k))
    coef = np.zeros(k)
    while active:
        sol, *_ = np.linalg.lstsq(features[:, active], target, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0
            coef[active] = sol
            return coef
        active.pop(int(np.argmin(sol)))  # drop the most negative term, refit the rest
    return coef


def fit_prefill(samples: Sequence[tuple[int, int, float]]) -> tuple[PrefillCoefficients, float]:
    """Fit prefill coefficients to ``(input_tokens, cached_tokens, seconds)`` samples.

    Returns:
        (coefficients, relative RMS residual).

    Raises:
        InvalidArgument: fewer than 3 samples.
    """
    arr = np.array(samples, dtype=float)
    if len(arr) < 3:
        raise InvalidArgument(f"need at least 3 prefill samples, got {len(arr)}")
    n, p, t = arr[:, 0], arr[:, 1], arr[:, 2]
    x = np.stack([np.ones_like(n), n - p, n * n - p * p], axis=1)
    c = fit_nonnegative(x, t)
    resid = float(np.sqrt(np.mean(((x @ c) - t) ** 2)) / max(np.mean(t), 1e-12))
    return PrefillCoefficients(base_s=c[0], per_token_s=c[1], per_token_sq_s=c[2]), resid


def fit_decode(
    samples: Sequence[tuple[int, int, float]],
) -> tuple[tuple[float, float, float], float]:
    """Fit ``(base_s, per_request_s, per_context_token_s)`` to ``(batch, context_tokens, s)``.

    ``context_tokens`` is the total over the batch.

    Raises:
        InvalidArgument: fewer than 3 samples.
    """
    arr = np.array(samples, dtype=float)
    if len(arr) < 3:
        raise InvalidArgument(f"need at least 3 decode samples, got {len(arr)}")
    b, c, t = arr[:, 0], arr[:, 1], arr[:, 2]
    x = np.stack([np.ones_like(b), b, c], axis=1)
    coef = fit_nonnegative(x, t)
    resid = float(np.sqrt(np.mean(((x @ coef) - t) ** 2)) / max(np.mean(t), 1e-12))
    if coef[0] <= 0:  # the step of an empty batch must be positive
        coef[0] = float(t.min()) * 1e-3
    return (float(coef[0]), float(coef[1]), float(coef[2])), resid


def measure_memcpy_bandwidth(size_bytes: int = 256 << 20, repeats: int = 3) -> float:
    """Bytes per second of one large host memory copy (best of ``repeats``)."""
    src = np.ones(size_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return size_bytes / best


def measure_file_read_bandwidth(directory: str | None = None, size_bytes: int = 128 << 20) -> float:
    """Bytes per second of reading a fresh temporary file sequentially, page cache dropped.

    Uses ``posix_fadvise(DONTNEED)`` after ``fsync``; where that is unavailable the figure is
    the page-cache speed (an upper bound).
    """
    chunk = np.random.default_rng(0).integers(0, 255, 1 << 20, dtype=np.uint8).tobytes()
    with tempfile.NamedTemporaryFile(dir=directory, prefix="kvstored-calibrate-") as fh:
        for _ in range(size_bytes // len(chunk)):
            fh.write(chunk)
        fh.flush()
        os.fsync(fh.fileno())
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        t0 = time.perf_counter()
        with open(fh.name, "rb", buffering=0) as rd:
            while rd.read(8 << 20):
                pass
        dt = time.perf_counter() - t0
    return size_bytes / dt


def calibrate(
    *,
    num_layers: int = 4,
    hidden_size: int = 512,
    num_heads: int = 8,
    num_kv_heads: int = 2,
    intermediate_size: int = 1408,
    prefill_lengths: Sequence[int] = (128, 256, 512, 1024, 1536),
    cached_fractions: Sequence[float] = (0.0, 0.5),
    decode_batches: Sequence[int] = (1, 4, 8),
    decode_contexts: Sequence[int] = (128, 512),
    repeats: int = 2,
    threads: int = 1,
    base: CostProfile | None = None,
    measure_io: bool = True,
    progress: ProgressFn | None = None,
) -> CostProfile:
    """Measure a random-weight Llama-shaped model with torch on the CPU and fit a profile.

    Args:
        num_layers / hidden_size / num_heads / num_kv_heads / intermediate_size: model shape.
        prefill_lengths: prompt lengths ``n`` to time.
        cached_fractions: cached prefix ``p = fraction * n`` for each ``n``.
        decode_batches / decode_contexts: decode batch sizes and per-sequence context lengths.
        repeats: timings per point (the minimum is kept).
        threads: torch intra-op threads (keep low on a shared machine).
        base: profile to copy what cannot be measured from (default: the shipped one).
        measure_io: measure memcpy and file-read bandwidth (else copy them from ``base``).
        progress: called with a short text per measured point.

    Raises:
        InvalidArgument: a shape that does not divide (hidden % heads, heads % kv heads) or an
            empty grid.
        ImportError: torch or transformers is not installed (the ``demo`` extra).
    """
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise InvalidArgument(
            f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads}) and "
            f"num_heads by num_kv_heads ({num_kv_heads})"
        )
    if not prefill_lengths or not decode_batches or not decode_contexts:
        raise InvalidArgument("prefill_lengths, decode_batches and decode_contexts must be set")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    base = base or CostProfile.default()
    say = progress or (lambda _msg: None)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        max_pos = max(max(prefill_lengths), max(decode_contexts)) + 16
        cfg = LlamaConfig(
            vocab_size=1024, hidden_size=hidden_size, intermediate_size=intermediate_size,
            num_hidden_layers=num_layers, num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads, max_position_embeddings=max_pos,
        )
        model = LlamaForCausalLM(cfg).eval()
        import inspect

        # transformers 5 renamed past_key_values to cache (argument and output field)
        cache_kw = ("cache" if "cache" in inspect.signature(model.forward).parameters
                    else "past_key_values")

        def forward(x: Any, cache: Any = None) -> Any:
            out = model(x, use_cache=True, **{cache_kw: cache})
            return getattr(out, "cache", None) or out.past_key_values

        head_dim = hidden_size // num_heads
        kv_bytes = 2 * num_layers * num_kv_heads * head_dim * 4  # float32 on the CPU
        gen = torch.Generator().manual_seed(0)

        def ids(b: int, n: int) -> Any:
            return torch.randint(0, cfg.vocab_size, (b, n), generator=gen)

        prefill: list[tuple[int, int, float]] = []
        with torch.inference_mode():
            forward(ids(1, 16))  # warm up
            for n in prefill_lengths:
                for frac in cached_fractions:
                    p = int(n * frac)
                    x = ids(1, n)
                    best = float("inf")
                    for _ in range(repeats):
                        cache = forward(x[:, :p]) if p else None
                        t0 = time.perf_counter()
                        forward(x[:, p:], cache)
                        best = min(best, time.perf_counter() - t0)
                    prefill.append((n, p, best))
                    say(f"prefill n={n} cached={p}: {best * 1000:.1f} ms")
            decode: list[tuple[int, int, float]] = []
            for b in decode_batches:
                for c in decode_contexts:
                    x = ids(b, c)
                    cache = forward(x)
                    step = ids(b, 1)
                    best = float("inf")
                    for _ in range(max(repeats, 3)):
                        t0 = time.perf_counter()
                        cache = forward(step, cache)
                        best = min(best, time.perf_counter() - t0)
                    decode.append((b, b * c, best))
                    say(f"decode batch={b} context={c}: {best * 1000:.2f} ms")
    finally:
        torch.set_num_threads(old_threads)

    pc, p_resid = fit_prefill(prefill)
    (d0, db, dc), d_resid = fit_decode(decode)
    bw = base.bandwidth_bytes_per_s.model_dump()
    io_note = "copied from the base profile"
    if measure_io:
        mem = measure_memcpy_bandwidth()
        disk = measure_file_read_bandwidth()
        bw["local_dram"] = mem
        bw["local_ssd"] = disk
        io_note = "local_dram: memcpy; local_ssd: file read; remote_*: copied from the base profile"
        say(f"memcpy {mem / 1e9:.1f} GB/s, file read {disk / 1e9:.2f} GB/s")
    try:
        phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        kv_capacity = int(phys * 0.5 / kv_bytes)
    except (ValueError, OSError):
        kv_capacity = 0
    return CostProfile(
        name=f"cpu-llama-{num_layers}l-{hidden_size}h",
        description=(f"Measured on this host ({os.cpu_count()} CPUs, torch {torch.__version__}, "
                     f"{threads} thread(s)): random-weight Llama-shaped model, float32."),
        source="kvstored calibrate",
        model={"shape": "llama", "num_layers": num_layers, "hidden_size": hidden_size,
               "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads,
               "intermediate_size": intermediate_size, "head_dim": head_dim,
               "dtype": "float32"},
        kv_bytes_per_token=kv_bytes,
        prefill=pc,
        decode=DecodeCoefficients(base_s=d0, per_request_s=db, per_context_token_s=dc,
                                  kv_capacity_tokens=kv_capacity),
        bandwidth_bytes_per_s=Bandwidths(**bw),
        fit={
            "prefill_samples": [list(s) for s in prefill],
            "decode_samples": [list(s) for s in decode],
            "prefill_relative_rms_residual": round(p_resid, 4),
            "decode_relative_rms_residual": round(d_resid, 4),
            "bandwidth": io_note,
            "kv_capacity": "half of physical memory",
        },
    )
