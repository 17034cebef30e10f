"""The demo's documents and prompts are the same in every process (no per-process state).

pydoc renders live values: ``<object object at 0x7f...>`` defaults, logging's handlers and
root level, ``tempfile.tempdir``. Rendered in the demo's own process, the documents (and so
the prompts and their block hashes) differed from run to run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, sys
if sys.argv[1] == "busy":  # state a demo process really has by the time it builds prompts
    import logging, tempfile
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("kvstored").addHandler(logging.NullHandler())
    tempfile.gettempdir()
    kept = [object() for _ in range(1000)]  # shifts later allocations

from kvstored.demo.corpus import MODULES, QUESTIONS, build_prompts


class Utf8Tokenizer:
    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(ids).decode(errors="replace")

    def encode_prompt(self, user):
        return self.encode("<user>" + user + "</user><assistant>")


tok = Utf8Tokenizer()
out = []
for index in range(len(MODULES)):  # every module leads one document
    doc, prompts = build_prompts(tok, 20000, index, QUESTIONS[:2])
    out.append({"title": doc.title, "text": doc.text, "prompts": prompts})
sys.stdout.write(json.dumps(out))
"""


def _build(state: str) -> list[dict[str, object]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", CHILD, state], capture_output=True, text=True,
                          env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def test_documents_and_prompts_are_the_same_in_two_processes() -> None:
    plain, busy = _build("plain"), _build("busy")
    assert len(plain) == len(busy) > 0
    for a, b in zip(plain, busy, strict=True):
        assert a["title"] == b["title"]
        assert a["text"] == b["text"], f"{a['title']}: the document differs between processes"
        assert a["prompts"] == b["prompts"]
    assert not any(" at 0x" in str(d["text"]) for d in plain)
