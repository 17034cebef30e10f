"""Long real text available offline: pydoc's plain-text rendering of standard-library modules.

Each prompt length gets its own document (a different run of modules), so the first
question at every length is a genuine miss even though all documents come from one pool.

The text is the same in every process on a host (so are the prompts and their block hashes):
it is rendered once per process in a fresh interpreter, with object addresses removed, since
pydoc renders live values (``<object object at 0x7f...>`` defaults, logging's handlers and
root level, ``tempfile.tempdir``) that differ from process to process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from kvstored.errors import InternalError, InvalidArgument

MODULES = (
    "collections", "json", "pathlib", "functools", "itertools", "heapq", "textwrap",
    "argparse", "logging", "shutil", "datetime", "string", "fractions", "statistics",
    "csv", "enum", "dataclasses", "bisect", "contextlib", "difflib", "tempfile", "queue",
)

QUESTIONS = (
    "What is the capital of France?",
    "Which Python module does this document describe? Answer in one sentence.",
    "Name one class or function that the document describes.",
    "What is this document about? Answer in one sentence.",
)
"""The first question doubles as a sanity check that the model still knows general facts."""

QUESTION_ROOM_TOKENS = 64
"""Room left in the context after the shared part for a question and the chat template's tail."""


def fit_to_context(num_tokens: int, context_tokens: int, max_new_tokens: int,
                   block_size: int = 1) -> int:
    """The shared length to build for a target of ``num_tokens``, so that the prompt fits.

    A prompt is the shared part, a question and the chat template's tail (at most
    :data:`QUESTION_ROOM_TOKENS`), and its answer takes ``max_new_tokens`` more: the shared part
    is capped to what the model's context leaves and rounded down to whole blocks (at least one).

    Args:
        num_tokens: the target shared length in tokens.
        context_tokens: the model's context length in tokens (``max_position_embeddings``).
        max_new_tokens: the answer length in tokens.
        block_size: round down to a multiple of this many tokens (1: no rounding).

    Returns:
        The shared length in tokens: ``<= num_tokens``, a multiple of ``block_size``.
    """
    room = (context_tokens - max_new_tokens - QUESTION_ROOM_TOKENS) // block_size * block_size
    return max(block_size, min(num_tokens, room) // block_size * block_size)


_RENDER = """
import importlib, json, pydoc, re, sys
def render(name):
    text = pydoc.render_doc(importlib.import_module(name), renderer=pydoc.plaintext)
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)
sys.stdout.write(json.dumps({name: render(name) for name in json.loads(sys.argv[1])}))
"""
RENDER_TIMEOUT_S = 300.0


@cache
def _rendered_modules() -> dict[str, str]:
    """pydoc's text of every module of :data:`MODULES`, from a fresh interpreter (once).

    The child runs without site packages, user site or this process's ``PYTHON*`` variables,
    with a fixed hash seed, importing only the standard library.

    Raises:
        InternalError: the interpreter failed or ran past :data:`RENDER_TIMEOUT_S`.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONHASHSEED"] = "0"
    cmd = [sys.executable, "-S", "-s", "-P", "-c", _RENDER, json.dumps(list(MODULES))]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              timeout=RENDER_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise InternalError(
            f"rendering the demo documents took over {RENDER_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        raise InternalError(f"rendering the demo documents failed (exit {proc.returncode}): "
                            f"{proc.stderr[-2000:]}")
    texts: dict[str, str] = json.loads(proc.stdout)
    return texts


def module_text(name: str) -> str:
    """pydoc's plain-text help of a module of :data:`MODULES`, the same in every process.

    Raises:
        InvalidArgument: ``name`` is not in :data:`MODULES`.
        InternalError: the rendering interpreter failed.
    """
    if name not in MODULES:
        raise InvalidArgument(f"module_text renders the modules of MODULES; got {name!r}")
    return _rendered_modules()[name]


@dataclass(frozen=True, slots=True)
class Document:
    """A document truncated to a token budget.

    Attributes:
        title: which modules it renders, e.g. ``"pydoc: json, pathlib"``.
        text: the text (decoded back from the truncated tokens).
    """

    title: str
    text: str


def make_document(tokenizer: Any, num_tokens: int, index: int) -> Document:
    """A document of about ``num_tokens`` tokens, different for each ``index``.

    Args:
        tokenizer: the demo tokenizer (``encode``/``decode``).
        num_tokens: token budget of the document text alone.
        index: selects the first module (documents at different indexes differ from their
            first token on).
    """
    parts: list[str] = []
    names: list[str] = []
    total = 0
    for k in range(len(MODULES)):
        name = MODULES[(index + k) % len(MODULES)]
        text = module_text(name)
        parts.append(text)
        names.append(name)
        total += len(tokenizer.encode(text))
        if total >= num_tokens:
            break
    ids = tokenizer.encode("\n\n".join(parts))[:num_tokens]
    return Document("pydoc: " + ", ".join(names), tokenizer.decode(ids))


def user_message(document: Document, question: str) -> str:
    """The user turn: the document first (shared by every question), the question last."""
    return (
        "Read the document below, then answer the question.\n\n"
        f"Document:\n{document.text}\n\nQuestion: {question}"
    )


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def build_prompts(
    tokenizer: Any, shared_tokens: int, index: int, questions: Sequence[str]
) -> tuple[Document, list[list[int]]]:
    """One prompt per question over one document, sharing about ``shared_tokens`` tokens.

    The document is sized so that the prompts' common prefix (template, instructions,
    document) is ``shared_tokens`` plus a few tokens; each prompt then adds its question.
    With ``shared_tokens`` a multiple of the block size, a later question finds all of the
    shared blocks cached and prefills only its question and the chat template's tail.

    Returns:
        ``(document, prompts)``.
    """
    probe = [tokenizer.encode_prompt(user_message(Document("", ""), q)) for q in questions]
    header = _common_prefix(probe[0], probe[-1]) if len(probe) > 1 else len(probe[0]) // 2
    doc_tokens = max(shared_tokens - header + 4, 16)
    doc, prompts = Document("", ""), probe
    for _ in range(8):  # re-tokenising the truncated text can shift counts by a few tokens
        doc = make_document(tokenizer, doc_tokens, index)
        prompts = [tokenizer.encode_prompt(user_message(doc, q)) for q in questions]
        shared = min((_common_prefix(prompts[0], p) for p in prompts[1:]), default=len(prompts[0]))
        if shared < shared_tokens:
            doc_tokens += shared_tokens - shared + 2
        elif shared > shared_tokens + 16:
            doc_tokens -= shared - shared_tokens - 8
        else:
            break
    return doc, prompts
