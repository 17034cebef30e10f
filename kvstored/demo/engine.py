"""A minimal prefix-caching engine around a transformers decoder: the demo's model side.

One block is the KV of ``block_size`` consecutive tokens for *all* layers, one tensor::

    block = (num_layers, 2 [key, value], num_kv_heads, block_size, head_dim)   kv dtype

stored under its chained block hash (kvstored.keys.block_hashes) with a tensor header
(kvstored.client.torch) in the block's meta. Keys hold rotary embeddings already applied,
so a block is only valid at its own position: a prefix of ``n`` blocks is exactly tokens
``[0, n * block_size)``.

Miss path (request without a cached prefix): hash, lookup (0 blocks), full prefill with a
transformers ``DynamicCache``; afterwards (off the TTFT path) the full blocks are copied out
of the cache and put into the store.

Hit path, kept lean::

    hash the prompt -> lookup_prefix -> n blocks (capped so >= 1 token is left to prefill)
    get_into straight into preallocated block tensors   (the only copy out of the store)
    one strided copy blocks -> per-layer KV buffers      (the layout change every engine needs)
    grouped KV heads attended in place (no repeat_kv copy of the prefix per layer)
    prefill only the suffix, positions P..T-1, cache holding exactly the P prefix tokens
    the suffix's KV is written in place into the same preallocated buffers (no torch.cat)

Pitfalls this code guards (transformers 5.x): the suffix's ``position_ids`` must continue
after the prefix (a wrong position gives plausible wrong output, no error); the cache must
hold exactly the matched prefix (``PreallocatedLayer`` exposes only the filled part).
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from kvstored.client.torch import encode_tensor_meta, get_tensors_into, put_tensors
from kvstored.errors import InvalidArgument
from kvstored.keys import Namespace, block_hashes

KV_LAYOUT = "layers,kv,heads,tokens,dim"


class PreallocatedLayer(DynamicLayer):
    """A cache layer whose keys/values live in a preallocated ``(1, heads, capacity, dim)`` buffer.

    ``keys``/``values`` are views of the filled part, so attention and the causal mask see
    exactly ``length`` tokens. ``update`` writes new tokens in place (no ``torch.cat``);
    past the capacity it falls back to growing like ``DynamicLayer``.
    """

    # DynamicLayer declares both Optional (unset until its lazy initialisation); here
    # __init__ sets them from the buffers, so they are never None.
    keys: torch.Tensor
    values: torch.Tensor

    def __init__(self, k_buf: torch.Tensor, v_buf: torch.Tensor, length: int) -> None:
        super().__init__()
        self._k_buf = k_buf
        self._v_buf = v_buf
        self.dtype = k_buf.dtype
        self.device = k_buf.device
        self.keys = k_buf[:, :, :length]
        self.values = v_buf[:, :, :length]
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Already initialised from the buffers."""

    def get_seq_length(self) -> int:
        """Tokens held (the matched prefix plus what was prefilled/decoded since)."""
        return int(self.keys.shape[-2])

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``key_states``/``value_states`` (``(1, heads, new, dim)``) in place."""
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end <= self._k_buf.shape[-2]:
            self._k_buf[:, :, start:end].copy_(key_states)
            self._v_buf[:, :, start:end].copy_(value_states)
            self.keys = self._k_buf[:, :, :end]
            self.values = self._v_buf[:, :, :end]
        else:
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
        return self.keys, self.values


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """Shape of one stored block for a model.

    Attributes:
        num_layers: decoder layers.
        num_kv_heads: key/value heads.
        head_dim: per-head dimension.
        block_size: tokens per block.
        dtype: KV element type.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @classmethod
    def from_config(cls, config: Any, block_size: int, dtype: torch.dtype) -> KVGeometry:
        """Read layers, KV heads and head dim from a transformers config."""
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        return cls(config.num_hidden_layers, kv_heads, head_dim, block_size, dtype)

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        """``(layers, 2, kv_heads, block_size, head_dim)``."""
        return (self.num_layers, 2, self.num_kv_heads, self.block_size, self.head_dim)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block."""
        itemsize = torch.empty(0, dtype=self.dtype).element_size()
        return int(np.prod(self.block_shape)) * itemsize

    @property
    def meta(self) -> bytes:
        """The tensor header every block of this geometry carries."""
        return encode_tensor_meta(self.dtype, self.block_shape)


@dataclass(slots=True)
class Prefill:
    """Result of one prefill (the time-to-first-token step).

    Attributes:
        logits: ``(vocab,)`` float32 logits of the last prompt token (the first new token's).
        cache: the model cache holding the whole prompt afterwards.
        num_tokens: prompt length.
        num_cached_tokens: tokens loaded from the store (0 on a miss).
        ttft_s: seconds from the prompt's token ids to the first token's logits, including
            hashing, lookup and loading on the hit path.
        timings_s: breakdown (``hash``, ``lookup``, ``load``, ``scatter``, ``prefill``).
    """

    logits: torch.Tensor
    cache: Any
    num_tokens: int
    num_cached_tokens: int
    ttft_s: float
    timings_s: dict[str, float] = field(default_factory=dict)


class PrefixCacheEngine:
    """Prefill a decoder with its prompt's prefix KV loaded from a kvstored store.

    Args:
        model: a transformers causal LM (Llama/Qwen2/Mistral-style cache layout), in eval mode.
        namespace: the key namespace; its ``block_size`` is the block size in tokens.
        max_tokens: longest prompt plus generated tokens the engine will see; sizes the
            preallocated block and KV buffers (allocated and touched here, not on the hit path).

    Not thread-safe: one hit-path cache is live at a time (each :meth:`prefill_cached`
    reuses the preallocated buffers, invalidating the previous one).
    """

    def __init__(self, model: Any, namespace: Namespace, *, max_tokens: int) -> None:
        self.model = model
        self.namespace = namespace
        dtype = next(model.parameters()).dtype
        self.geometry = KVGeometry.from_config(model.config, namespace.block_size, dtype)
        if namespace.kv_dtype != str(dtype).removeprefix("torch."):
            raise InvalidArgument(
                f"namespace kv_dtype {namespace.kv_dtype} differs from the model dtype {dtype}"
            )
        g = self.geometry
        self.max_tokens = max_tokens
        self.max_blocks = max_tokens // g.block_size
        # zeros(), not empty(): the pages are touched now, not on the first hit.
        self._blocks = torch.zeros((max(self.max_blocks, 1), *g.block_shape), dtype=dtype)
        self._kv = torch.zeros(
            (g.num_layers, 2, g.num_kv_heads, max_tokens, g.head_dim), dtype=dtype
        )
        params = inspect.signature(type(model.model).forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        # With a mask (a suffix attending to a cached prefix), transformers' SDPA path expands
        # grouped KV heads with repeat_kv (a copy of the whole prefix KV per layer) unless told
        # that the kernel handles GQA itself; torch's CPU kernel does, with identical results
        # (measured: bit-identical logits, half the hit prefill time at 8k tokens). Process-wide;
        # the unmasked full prefill already takes this path.
        os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")

    # ---- forward helpers --------------------------------------------------------------------
    def _forward(
        self, ids: torch.Tensor, cache: Any, start: int, logits_to_keep: int = 1
    ) -> torch.Tensor:
        positions = torch.arange(start, start + ids.shape[1], dtype=torch.long).unsqueeze(0)
        out = self.model(
            input_ids=ids, position_ids=positions, use_cache=True,
            logits_to_keep=logits_to_keep, **{self._cache_kw: cache},
        )
        return out.logits[0, -1].float()

    def new_cache(self) -> Any:
        """An empty transformers ``DynamicCache`` (what the model uses without a store)."""
        return DynamicCache()

    def _preallocated_cache(self, num_tokens: int) -> Any:
        cache = DynamicCache()
        cache.layers[:] = [
            PreallocatedLayer(self._kv[i, 0].unsqueeze(0), self._kv[i, 1].unsqueeze(0), num_tokens)
            for i in range(self.geometry.num_layers)
        ]
        return cache

    def hashes(self, token_ids: Sequence[int]) -> list[bytes]:
        """Block hashes of the prompt's full blocks."""
        return block_hashes(self.namespace, token_ids)

    # ---- the two paths ----------------------------------------------------------------------
    @torch.inference_mode()
    def prefill_full(self, token_ids: Sequence[int], store: Any | None = None) -> Prefill:
        """Full prefill (a miss): what a request costs without the store.

        Args:
            token_ids: the prompt.
            store: when given, its ``lookup_prefix`` is called first (and timed) as a real
                engine would before deciding to recompute.
        """
        t0 = time.perf_counter()
        if store is not None:
            store.lookup_prefix(self.hashes(token_ids))
        ids = torch.tensor([list(token_ids)], dtype=torch.long)
        cache = self.new_cache()
        logits = self._forward(ids, cache, 0)
        ttft = time.perf_counter() - t0
        return Prefill(logits, cache, len(token_ids), 0, ttft, {"prefill": ttft})

    @torch.inference_mode()
    def prefill_cached(self, token_ids: Sequence[int], store: Any) -> Prefill:
        """Prefill with the longest cached prefix loaded from ``store`` (the hit path).

        Looks up the longest run of leading blocks present, loads them with ``get_into``
        straight into preallocated block tensors, builds a cache holding exactly those
        ``P`` tokens and prefills tokens ``P..T-1`` at positions ``P..T-1``. With no block
        present this is a full prefill. A block that vanished between lookup and load
        shortens the prefix to the blocks actually loaded.

        Raises:
            InvalidArgument: the prompt is longer than ``max_tokens``.
            DtypeMismatch: a stored block has another dtype/shape than this model's blocks.
        """
        num_tokens = len(token_ids)
        if num_tokens > self.max_tokens:
            raise InvalidArgument(
                f"prompt of {num_tokens} tokens exceeds the engine's max_tokens={self.max_tokens}"
            )
        g = self.geometry
        t0 = time.perf_counter()
        keys = self.hashes(token_ids)
        t1 = time.perf_counter()
        # keep >= 1 token to prefill: the first new token needs the last prompt token's logits
        keys = keys[: (num_tokens - 1) // g.block_size]
        n = store.lookup_prefix(keys) if keys else 0
        t2 = time.perf_counter()
        if n:
            hits = get_tensors_into(store, keys[:n], list(self._blocks[:n]))
            n = hits.index(False) if False in hits else n
        t3 = time.perf_counter()
        prefix = n * g.block_size
        if n:
            # blocks (n, L, 2, H, bs, D) -> KV buffers (L, 2, H, n*bs, D): one strided copy
            dst = self._kv[:, :, :, :prefix].unflatten(3, (n, g.block_size))
            dst.copy_(self._blocks[:n].permute(1, 2, 3, 0, 4, 5))
        cache = self._preallocated_cache(prefix)
        t4 = time.perf_counter()
        ids = torch.tensor([list(token_ids[prefix:])], dtype=torch.long)
        logits = self._forward(ids, cache, prefix)
        t5 = time.perf_counter()
        return Prefill(
            logits, cache, num_tokens, prefix, t5 - t0,
            {"hash": t1 - t0, "lookup": t2 - t1, "load": t3 - t2, "scatter": t4 - t3,
             "prefill": t5 - t4},
        )

    # ---- storing ----------------------------------------------------------------------------
    @torch.inference_mode()
    def store_prompt(self, token_ids: Sequence[int], cache: Any, store: Any) -> tuple[int, int]:
        """Put the prompt's full blocks (from a cache holding at least the prompt) into ``store``.

        Blocks already present are skipped by the store (idempotent puts). Off the TTFT path.

        Returns:
            ``(blocks stored now, bytes stored now)``.

        Raises:
            KvstoredError: a block's put failed (the first error is raised after all
            puts were attempted).
        """
        g = self.geometry
        keys = self.hashes(token_ids)
        if not keys:
            return 0, 0
        present = store.lookup_prefix(keys)
        todo = list(range(present, len(keys)))
        if not todo:
            return 0, 0
        staging = torch.empty((len(todo), *g.block_shape), dtype=g.dtype)
        for layer_idx, layer in enumerate(cache.layers):
            for kv_idx, src in enumerate((layer.keys, layer.values)):
                lo, hi = todo[0] * g.block_size, (todo[-1] + 1) * g.block_size
                # (1, H, tokens, D) -> (blocks, H, bs, D)
                chunk = src[0, :, lo:hi].unflatten(1, (len(todo), g.block_size))
                staging[:, layer_idx, kv_idx].copy_(chunk.permute(1, 0, 2, 3))
        results = put_tensors(store, [keys[i] for i in todo], list(staging))
        errors = [r.error for r in results if r.error is not None]
        if errors:
            raise errors[0]
        stored = sum(1 for r in results if r.stored)
        return stored, stored * g.block_bytes

    # ---- decoding ---------------------------------------------------------------------------
    @torch.inference_mode()
    def greedy(
        self, prefill: Prefill, max_new_tokens: int, eos_token_ids: Sequence[int] = ()
    ) -> tuple[list[int], list[torch.Tensor]]:
        """Greedy decoding after a prefill.

        Returns:
            ``(new token ids, logits of each step)``; the first step's logits are the
            prefill's. Stops after an EOS token or ``max_new_tokens`` tokens.
        """
        tokens: list[int] = []
        step_logits = [prefill.logits]
        logits = prefill.logits
        pos = prefill.num_tokens
        for step in range(max_new_tokens):
            tok = int(torch.argmax(logits))
            tokens.append(tok)
            if tok in eos_token_ids or step == max_new_tokens - 1:
                break
            logits = self._forward(torch.tensor([[tok]]), prefill.cache, pos)
            step_logits.append(logits)
            pos += 1
        return tokens, step_logits
