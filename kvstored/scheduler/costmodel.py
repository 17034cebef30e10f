"""Cost model of the scheduler: prefill time, KV transfer time, decode step time (TBT).

All three are closed-form functions of a :class:`CostProfile`, a small JSON document either
shipped with the package (``profiles/*.json``), written by ``kvstored calibrate`` from
measurements on this machine, or written by hand from a GPU's published figures.

Prefill (``n`` prompt tokens, ``p`` of them already cached, so ``n - p`` are computed; each new
token attends to every earlier one, so the attention work is proportional to ``n**2 - p**2``)::

    prefill_s(n, p) = base_s + per_token_s * (n - p) + per_token_sq_s * (n**2 - p**2)

Decode step (one token for each of ``b`` running requests holding ``c`` context tokens in all;
weights are read once per step, KV once per context token)::

    tbt_s(b, c) = base_s + per_request_s * b + per_context_token_s * c

Transfer of ``k`` blocks from a tier (``local_dram``, ``local_ssd``, ``remote_dram``,
``remote_ssd``): ``k * block_bytes / bandwidth``, ``block_bytes = block_tokens *
kv_bytes_per_token``. Fetch-versus-recompute compares ``transfer_s`` with the prefill time saved.

Source: Mooncake (arXiv 2407.00079 §6, FAST'25 §5): TTFT from a polynomial fitted over
(prompt length, prefix hit length) and the KV transfer time; the feature set is ours.
"""

from __future__ import annotations

import json
import pathlib
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvstored.errors import ConfigInvalid, InvalidArgument

DEFAULT_PROFILE_NAME = "a800x8-llama70b.json"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PrefillCoefficients(_Strict):
    """``prefill_s(n, p) = base_s + per_token_s*(n-p) + per_token_sq_s*(n**2-p**2)``."""

    base_s: float = Field(ge=0)
    """Fixed cost of one prefill, seconds."""
    per_token_s: float = Field(ge=0)
    """Seconds per computed token (weights: MLP and projections)."""
    per_token_sq_s: float = Field(ge=0)
    """Seconds per unit of ``n**2 - p**2`` (attention over the context)."""


class DecodeCoefficients(_Strict):
    """``tbt_s(b, c) = base_s + per_request_s*b + per_context_token_s*c`` plus capacity limits."""

    base_s: float = Field(gt=0)
    """Step time of an empty batch (reading the weights once), seconds."""
    per_request_s: float = Field(ge=0)
    """Extra seconds per running request per step (its share of the weight compute)."""
    per_context_token_s: float = Field(ge=0)
    """Extra seconds per context token held by the batch (reading its KV once per step)."""
    kv_capacity_tokens: int = Field(default=0, ge=0)
    """KV-cache capacity of one decode instance, tokens; 0 = unlimited."""
    max_batch_requests: int = Field(default=0, ge=0)
    """Most running requests of one decode instance; 0 = unlimited."""


class Bandwidths(_Strict):
    """Bytes per second of moving KV into the GPU of a prefill instance, by source."""

    local_dram: float = Field(gt=0)
    """Host DRAM of the same node to GPU."""
    local_ssd: float = Field(gt=0)
    """SSD of the same node to GPU."""
    remote_dram: float = Field(gt=0)
    """DRAM of another node over the network."""
    remote_ssd: float = Field(gt=0)
    """SSD of another node over the network."""


class CostProfile(_Strict):
    """One hardware + model profile (JSON on disk).

    Attributes are documented on the fields. Load with :meth:`load` / :meth:`default`, write with
    :meth:`save`.
    """

    name: str
    """Short name shown in reports."""
    description: str = ""
    """What hardware and model it describes."""
    source: str = ""
    """Where the numbers come from (measured, derived from datasheets, ...)."""
    model: dict[str, Any] = Field(default_factory=dict)
    """Model shape it was measured or derived for (free-form, informational)."""
    kv_bytes_per_token: int = Field(gt=0)
    """KV bytes of one token, all layers (2 * layers * kv_heads * head_dim * dtype bytes)."""
    prefill: PrefillCoefficients
    decode: DecodeCoefficients
    bandwidth_bytes_per_s: Bandwidths
    fit: dict[str, Any] = Field(default_factory=dict)
    """Calibration details (samples, residuals), when measured."""

    @classmethod
    def load(cls, path: str | pathlib.Path) -> CostProfile:
        """Read a profile JSON file.

        Raises:
            ConfigInvalid: the file cannot be read, is not JSON, or a field is missing or invalid
                (the message names the field and the value received).
        """
        try:
            text = pathlib.Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigInvalid(f"cannot read cost profile {path}: {exc.strerror}") from None
        return cls.from_json(text, origin=str(path))

    @classmethod
    def from_json(cls, text: str, *, origin: str = "<string>") -> CostProfile:
        """Parse a profile from JSON text.

        Raises:
            ConfigInvalid: not JSON, or a field is missing or invalid.
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigInvalid(f"cost profile {origin} is not valid JSON: {exc}") from None
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']} (got {err.get('input')!r})"
                for err in exc.errors()
            )
            raise ConfigInvalid(f"invalid cost profile {origin}: {problems}") from None

    @classmethod
    def default(cls) -> CostProfile:
        """The shipped profile (8x A800-80GB serving a Llama-70B-shaped model, derived)."""
        ref = resources.files("kvstored.scheduler").joinpath("profiles", DEFAULT_PROFILE_NAME)
        return cls.from_json(ref.read_text(encoding="utf-8"), origin=DEFAULT_PROFILE_NAME)

    def save(self, path: str | pathlib.Path) -> None:
        """Write the profile as indented JSON (overwrites)."""
        pathlib.Path(path).write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")


class CostModel:
    """Predicted durations for one profile and block size. Pure arithmetic; thread-safe.

    Args:
        profile: the hardware/model profile.
        block_tokens: tokens per block, to turn cached blocks into tokens and bytes.

    Raises:
        InvalidArgument: ``block_tokens`` is not positive.
    """

    __slots__ = (
        "profile", "block_tokens", "block_bytes", "_p0", "_p1", "_p2", "_d0", "_db", "_dc",
        "_blk_s",
    )

    def __init__(self, profile: CostProfile, block_tokens: int) -> None:
        if block_tokens <= 0:
            raise InvalidArgument(f"block_tokens must be > 0, got {block_tokens}")
        self.profile = profile
        self.block_tokens = block_tokens
        self.block_bytes = block_tokens * profile.kv_bytes_per_token
        p, d, bw = profile.prefill, profile.decode, profile.bandwidth_bytes_per_s
        self._p0, self._p1, self._p2 = p.base_s, p.per_token_s, p.per_token_sq_s
        self._d0, self._db, self._dc = d.base_s, d.per_request_s, d.per_context_token_s
        # seconds to move one block, by (remote, ssd)
        self._blk_s = {
            (False, False): self.block_bytes / bw.local_dram,
            (False, True): self.block_bytes / bw.local_ssd,
            (True, False): self.block_bytes / bw.remote_dram,
            (True, True): self.block_bytes / bw.remote_ssd,
        }

    # ---- prefill ---------------------------------------------------------------------
    def cached_tokens(self, input_tokens: int, num_blocks: int) -> int:
        """Tokens covered by ``num_blocks`` cached leading blocks of an ``input_tokens`` prompt.

        At least one token is always computed (it yields the first output token), so the result
        is at most ``input_tokens - 1``.
        """
        return max(0, min(num_blocks * self.block_tokens, input_tokens - 1))

    def prefill_s(self, input_tokens: int, cached_tokens: int = 0) -> float:
        """Predicted prefill time of a prompt with a cached prefix, seconds.

        Args:
            input_tokens: prompt length ``n`` (> 0).
            cached_tokens: tokens whose KV is reused ``p`` (0 <= p < n; larger is clamped).

        Raises:
            InvalidArgument: ``input_tokens`` <= 0 or ``cached_tokens`` < 0.
        """
        if input_tokens <= 0:
            raise InvalidArgument(f"input_tokens must be > 0, got {input_tokens}")
        if cached_tokens < 0:
            raise InvalidArgument(f"cached_tokens must be >= 0, got {cached_tokens}")
        n = input_tokens
        p = min(cached_tokens, n - 1)
        return self._p0 + self._p1 * (n - p) + self._p2 * (n * n - p * p)

    # ---- transfer --------------------------------------------------------------------
    def transfer_s(self, num_blocks: int, *, remote: bool, ssd: bool = False) -> float:
        """Seconds to bring ``num_blocks`` blocks of KV into a prefill instance's GPU.

        Args:
            num_blocks: blocks to move (>= 0).
            remote: the blocks live on another node (network) rather than this one.
            ssd: they live on that node's SSD rather than its DRAM.
        """
        if num_blocks <= 0:
            return 0.0
        return num_blocks * self._blk_s[(remote, ssd)]

    def is_fetch_faster(self, input_tokens: int, local_tokens: int, remote_blocks: int,
                        remote_tokens: int, *, ssd: bool = False) -> bool:
        """Whether fetching ``remote_blocks`` more blocks beats recomputing them.

        Compares ``prefill_s(n, local) `` with ``prefill_s(n, local + remote) + transfer``.
        """
        recompute = self.prefill_s(input_tokens, local_tokens)
        fetch = self.prefill_s(input_tokens, remote_tokens) + self.transfer_s(
            remote_blocks, remote=True, ssd=ssd
        )
        return fetch < recompute

    # ---- decode ----------------------------------------------------------------------
    @property
    def decode_coefficients(self) -> tuple[float, float, float]:
        """(base_s, per_request_s, per_context_token_s) of :meth:`tbt_s`, for vectorised use."""
        return self._d0, self._db, self._dc

    def tbt_s(self, num_requests: int, context_tokens: float) -> float:
        """Predicted decode step time (time between tokens), seconds.

        Args:
            num_requests: running requests in the batch (>= 0).
            context_tokens: KV tokens the batch holds in all (>= 0).
        """
        return self._d0 + self._db * num_requests + self._dc * context_tokens

    def decode_load(self, num_requests: int, context_tokens: float, tbt_slo_s: float) -> float:
        """Load of a decode instance: the largest of TBT / SLO, KV / capacity, batch / max.

        1.0 means exactly at the objective or capacity. Unlimited capacities are skipped.
        """
        load = self.tbt_s(num_requests, context_tokens) / tbt_slo_s
        d = self.profile.decode
        if d.kv_capacity_tokens:
            load = max(load, context_tokens / d.kv_capacity_tokens)
        if d.max_batch_requests:
            load = max(load, num_requests / d.max_batch_requests)
        return load
