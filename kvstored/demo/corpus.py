"""Long real text available offline: pydoc's plain-text rendering of standard-library modules.

Each prompt length gets its own document (a different run of modules), so the first
question at every length is a genuine miss even though all documents come from one pool.
"""

from __future__ import annotations

import importlib
import pydoc
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

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


@lru_cache(maxsize=None)
def module_text(name: str) -> str:
    """pydoc's plain-text help of a standard-library module."""
    return pydoc.render_doc(importlib.import_module(name), renderer=pydoc.plaintext)


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


def build_prompts(
    tokenizer: Any, target_tokens: int, index: int, questions: Sequence[str]
) -> tuple[Document, list[list[int]]]:
    """Token ids of one prompt per question over a document sized so prompts are ~target long.

    Returns:
        ``(document, prompts)``; prompts share every token up to the question.
    """
    overhead = max(len(tokenizer.encode_prompt(user_message(Document("", ""), q))) for q in questions)
    doc = make_document(tokenizer, max(target_tokens - overhead, 16), index)
    return doc, [tokenizer.encode_prompt(user_message(doc, q)) for q in questions]
