"""README.md is executable documentation: its snippets are run, not just read.

Convention (for everyone adding README sections):

- Every fenced ```python block of README.md is run by ``test_python_block_runs`` as written,
  in a fresh interpreter, with ``KVSTORED_ADDRESS`` pointing at a real ``kvstored serve``
  started by this module (SSD tier on, as in production) and an empty temporary working
  directory. A block must therefore be self-contained: define every name it uses (token ids,
  buffers, values...) and talk to "the local daemon" through the default address.
- A block that cannot run here (it needs a GPU, RDMA, vLLM, a cluster...) is marked with an
  HTML comment on the line right before its fence, with a reason:

      <!-- readme-test: skip needs vLLM and a GPU -->
      ```python
      ...
      ```

  The comment is invisible on GitHub; a marker without a reason fails the test.
- The ```toml blocks must load with ``kvstored.config.load_config`` (keys and values valid).
- The first ```bash block holds the two setup commands: command 2 must be exactly what
  ``.ci/run`` runs, and command 1 must use the same environment setup before ``kvstored demo``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_helpers import ServeProcess

from kvstored.config import load_config

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"
SKIP_MARK = re.compile(r"^<!--\s*readme-test:\s*skip\b(?P<reason>.*?)-->\s*$")
FENCE_OPEN = re.compile(r"^```(?P<lang>[A-Za-z0-9_+-]*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a markdown file."""

    lang: str
    line: int  # 1-based line of the opening fence
    code: str
    skip_reason: str | None  # None: run it; "" would be a marker without a reason


def read_blocks(text: str) -> list[Block]:
    """The fenced blocks of a markdown text, with the skip marker right before each."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE_OPEN.match(lines[i])
        if m is None:
            i += 1
            continue
        start = i
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        prev = lines[start - 1].strip() if start > 0 else ""
        mark = SKIP_MARK.match(prev)
        blocks.append(Block(
            lang=m.group("lang").lower(), line=start + 1, code="\n".join(lines[start + 1 : j]) + "\n",
            skip_reason=mark.group("reason").strip() if mark else None,
        ))
        i = j + 1
    return blocks


BLOCKS = read_blocks(README.read_text())
PYTHON_BLOCKS = [b for b in BLOCKS if b.lang in ("python", "py")]


def test_the_readme_has_python_blocks_and_the_parser_finds_markers() -> None:
    assert PYTHON_BLOCKS, "README.md has no ```python block (the parser or the README changed)"
    sample = "text\n<!-- readme-test: skip needs a GPU -->\n```python\nx = 1\n```\n```python\ny\n```\n"
    got = read_blocks(sample)
    assert [(b.lang, b.line, b.code, b.skip_reason) for b in got] == [
        ("python", 3, "x = 1\n", "needs a GPU"), ("python", 6, "y\n", None)]


@pytest.fixture(scope="module")
def readme_daemon() -> Iterator[ServeProcess]:
    workdir = Path(tempfile.mkdtemp(prefix="kvrd", dir="/tmp"))  # short unix socket path
    node = ServeProcess(workdir, node_id="readme", dram_size="64MiB", ssd_size="256MiB").start()
    try:
        yield node
    finally:
        try:
            assert node.terminate() == 0
        finally:
            node.kill()
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[f"README.md:{b.line}" for b in PYTHON_BLOCKS])
def test_python_block_runs(block: Block, readme_daemon: ServeProcess, tmp_path: Path) -> None:
    if block.skip_reason is not None:
        assert block.skip_reason, f"README.md:{block.line}: a readme-test skip marker needs a reason"
        pytest.skip(f"README.md:{block.line}: {block.skip_reason}")
    env = {**os.environ, "KVSTORED_ADDRESS": readme_daemon.unix_address,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for attempt in range(2):  # twice: the second run finds the first run's blocks (hits)
        r = subprocess.run([sys.executable, "-c", block.code], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (
            f"README.md:{block.line} failed (run {attempt + 1}):\n{r.stderr[-3000:]}\n--- code ---\n{block.code}"
        )


def test_readme_client_snippet_reads_back_what_it_stored(readme_daemon: ServeProcess, tmp_path: Path) -> None:
    """The client snippet puts on its first run and gets on the next: both paths work."""
    (block,) = [b for b in PYTHON_BLOCKS if "kv.get_into(keys[:n]" in b.code]
    env = {**os.environ, "KVSTORED_ADDRESS": readme_daemon.unix_address}
    code = block.code.replace('model_id="HuggingFaceTB/SmolLM2-135M-Instruct"', 'model_id="readme-fresh"')
    outs = [subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300) for _ in range(2)]
    assert [o.returncode for o in outs] == [0, 0], outs[-1].stderr
    assert outs[0].stdout.strip() == "0 of 3 blocks were cached; now 3 are"
    assert outs[1].stdout.strip() == "3 of 3 blocks were cached; now 3 are"


def test_toml_blocks_load() -> None:
    tomls = [b for b in BLOCKS if b.lang == "toml" and b.skip_reason is None]
    assert tomls
    for block in tomls:
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write(block.code)
        try:
            load_config(f.name, environ={})
        finally:
            os.unlink(f.name)


def _commands(code: str) -> list[str]:
    return [ln.strip() for ln in code.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_first_two_bash_commands_are_what_ci_runs() -> None:
    first_bash = next(b for b in BLOCKS if b.lang == "bash")
    commands = _commands(first_bash.code)
    assert len(commands) == 2, commands
    ci = [c for c in _commands(CI_RUN.read_text())
          if not c.startswith(("set ", "cd ")) and not c.startswith("#!")]
    assert ci == [commands[1]], (ci, commands[1])
    setup_demo, run_demo = commands[0].rsplit(" && ", 1)
    # lint, types, then the tests on two workers (tests/conftest.py groups them)
    checks = " && ruff check . && mypy && python -m pytest -q -n 2 --dist loadgroup"
    assert commands[1].endswith(checks), commands[1]
    setup_test = commands[1].removesuffix(checks)
    assert run_demo == "kvstored demo"
    # same venv, same pinned torch, same model package; only the extras differ, and the tests
    # also build the vLLM virtualenv (tests/e2e/test_vllm_connector.py)
    vllm_step = " && bash scripts/setup-vllm-venv.sh .venv-vllm"
    assert setup_test.endswith(vllm_step), setup_test
    # and first install the system packages the tests need (etcd: scripts/setup-system.sh)
    system_step = "bash scripts/setup-system.sh && "
    assert setup_test.startswith(system_step), setup_test
    assert setup_demo.replace("'.[demo]'", "'.[test,demo,sim]'") == \
        setup_test.removesuffix(vllm_step).removeprefix(system_step)
