"""Calibrate the cost model on a real vLLM engine (``kvstored calibrate --engine vllm``).

The measurement runs in a Python that has vLLM (often its own virtualenv, e.g. the one
``scripts/setup-vllm-venv.sh`` builds): :func:`calibrate_vllm` starts
``<python> -m kvstored.scheduler.calibrate_vllm`` with a JSON spec on stdin, which loads the
model once in ``vllm.LLM`` (prefix caching on, greedy sampling) and prints JSON samples; the
fit and the profile are made here, with the same least squares as ``kvstored calibrate``.

Measured (every point once per round, ``repeats`` rounds, each round in a shuffled order so
that load from other processes falls on fitted and held-out points alike; the minimum over the
rounds is kept, since contention only adds time; fresh random token ids for every sample so
nothing is cached by accident). The fit minimises *relative* residuals (each sample weighted
by 1 / its time), matching the relative-error target:

- **prefill** at (prompt ``n`` tokens, cached prefix ``p``): the prefix is generated once first
  (so vLLM's prefix cache holds its full blocks), then the whole prompt with ``max_tokens=1``
  is timed: that is the engine's TTFT, overheads included. ``p`` is the
  ``num_cached_tokens`` vLLM reports. Fitted to ``base + a (n-p) + b (n^2-p^2)``.
- **decode step** at (batch ``b``, context ``c`` tokens per request): ``b`` distinct cached
  prompts of ``c`` tokens generated together with ``max_tokens = T2`` (``ignore_eos``); step =
  (last token - first token) / (tokens - 1) from the engine's per-request timestamps (median
  over the batch), or (wall(T2) - wall(T1)) / (T2 - T1) when the engine gives none. Fitted to
  ``base + a b + k (b c')`` with ``c'`` the mean context over the timed steps.

Held-out points (not used by the fit) are predicted and compared: the relative error per point
goes into the profile's ``fit.heldout`` (target: TTFT within 15%).

Scaling to another model (the trace's) is :func:`scale_profile`: a documented first-order
rule, see there.
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kvstored.errors import InvalidArgument
from kvstored.scheduler.calibrate import fit_nonnegative
from kvstored.scheduler.costmodel import (
    Bandwidths,
    CostProfile,
    DecodeCoefficients,
    PrefillCoefficients,
)

ProgressFn = Callable[[str], None]

PREFILL_TRAIN = [(128, 0), (384, 0), (768, 0), (1280, 0), (1536, 0), (512, 256), (1024, 512),
                 (1536, 768), (1536, 1280), (1280, 1024)]
PREFILL_HELDOUT = [(256, 0), (640, 0), (1024, 0), (896, 384), (1408, 640), (1152, 896)]
DECODE_TRAIN = [(1, 128), (1, 1024), (4, 128), (4, 1024), (8, 128), (8, 640)]
DECODE_HELDOUT = [(2, 512), (6, 384)]


# ---- inside the vLLM Python -----------------------------------------------------------
def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the measurements of ``spec`` on a vLLM engine (imports vllm).

    Args:
        spec: ``model`` (HF checkpoint dir), ``dtype``, ``block_size``, ``max_model_len``,
            ``prefill`` ([n, p] list), ``decode`` ([b, c] list), ``decode_tokens`` ([T1, T2]),
            ``repeats``, ``seed``, ``kv_cache_memory_bytes``.

    Returns:
        ``{"prefill": [[n, cached, s]], "decode": [[b, ctx_total, s]], "startup_s",
        "vllm_version", "vocab_size"}``.
    """
    import random

    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = LLM(model=spec["model"], dtype=spec.get("dtype", "float32"),
              block_size=spec.get("block_size", 128),
              max_model_len=spec.get("max_model_len", 4096), enforce_eager=True, seed=0,
              enable_prefix_caching=True, max_num_batched_tokens=8192,
              disable_log_stats=False,  # per-request token timestamps (decode step times)
              kv_cache_memory_bytes=int(spec.get("kv_cache_memory_bytes", 1 << 30)))
    startup_s = time.perf_counter() - t0
    vocab = int(llm.llm_engine.model_config.get_vocab_size())
    rng = random.Random(spec.get("seed", 0))
    repeats = int(spec.get("repeats", 2))

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, vocab - 100) for _ in range(n)]

    def run(prompts: Sequence[list[int]], max_tokens: int) -> tuple[float, list[Any]]:
        ps: list[Any] = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        t = time.perf_counter()
        out = llm.generate(ps, sp, use_tqdm=False)
        return time.perf_counter() - t, out

    run([ids(64)], 2)  # warm-up (first call compiles / allocates)
    t1, t2 = spec.get("decode_tokens", [4, 33])

    def prefill_once(n: int, p: int) -> tuple[float, int]:
        prefix = ids(p)
        if p:
            run([prefix], 1)
        wall, out = run([prefix + ids(n - p)], 1)
        return wall, int(out[0].num_cached_tokens or 0)

    def decode_once(b: int, c: int) -> float:
        prompts = [ids(c) for _ in range(b)]
        run(prompts, 1)  # cache the prompts: the timed run then prefills ~nothing
        w2, out = run(prompts, t2)
        per = [(o.metrics.last_token_ts - o.metrics.first_token_ts)
               / (o.metrics.num_generation_tokens - 1)
               for o in out if o.metrics is not None and o.metrics.num_generation_tokens > 1]
        if len(per) == b:  # the engine's own token timestamps
            return statistics.median(per)
        w1, _ = run(prompts, t1)  # else the difference of two runs
        return (w2 - w1) / (t2 - t1)

    # Every point once per round, in a shuffled order, so that load from other processes
    # hits fitted and held-out points alike; the minimum over rounds is kept per point.
    jobs = [("prefill", i) for i in range(len(spec["prefill"]))] + \
        [("decode", i) for i in range(len(spec["decode"]))]
    best: dict[tuple[str, int], float] = {}
    cached_of: dict[int, int] = {}
    for rnd in range(repeats):
        order = list(jobs)
        rng.shuffle(order)
        for kind, i in order:
            if kind == "prefill":
                n, p = spec["prefill"][i]
                t, cached_of[i] = prefill_once(n, p)
                label = f"prefill n={n} p={p} cached={cached_of[i]}: {t * 1e3:.1f} ms"
            else:
                b, c = spec["decode"][i]
                t = decode_once(b, c)
                label = f"decode b={b} c={c}: {t * 1e3:.2f} ms/step"
            best[(kind, i)] = min(t, best.get((kind, i), float("inf")))
            print(f"{label} (round {rnd + 1}/{repeats})", file=sys.stderr, flush=True)
    prefill = [[n, cached_of[i], best[("prefill", i)]]
               for i, (n, _) in enumerate(spec["prefill"])]
    decode = [[b, b * (c + t2 / 2.0), best[("decode", i)]]
              for i, (b, c) in enumerate(spec["decode"])]
    return {"prefill": prefill, "decode": decode, "startup_s": startup_s,
            "vllm_version": vllm.__version__, "vocab_size": vocab}


def main() -> None:
    """``python -m kvstored.scheduler.calibrate_vllm``: spec JSON on stdin, result on stdout."""
    spec = json.loads(sys.stdin.read())
    result = measure(spec)
    sys.stdout.write("KVSTORED-CALIBRATE-RESULT " + json.dumps(result) + "\n")


# ---- here ------------------------------------------------------------------------------
def _model_shape(model_dir: pathlib.Path) -> dict[str, Any]:
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"{model_dir} is not a Hugging Face checkpoint dir: {exc}") from None
    heads = int(cfg["num_attention_heads"])
    return {
        "num_layers": int(cfg["num_hidden_layers"]), "hidden_size": int(cfg["hidden_size"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(cfg.get("num_key_value_heads", heads)),
        "intermediate_size": int(cfg.get("intermediate_size", 4 * cfg["hidden_size"])),
        "head_dim": int(cfg.get("head_dim", cfg["hidden_size"] // heads)),
        "vocab_size": int(cfg.get("vocab_size", 0)),
    }


def _fit_relative_prefill(
    samples: Sequence[Sequence[float]],
) -> tuple[PrefillCoefficients, float]:
    """``base + a (n-p) + b (n^2-p^2)`` by non-negative least squares on relative residuals."""
    arr = np.array(samples, dtype=float)
    if len(arr) < 3:
        raise InvalidArgument(f"need at least 3 prefill samples, got {len(arr)}")
    n, p, t = arr[:, 0], arr[:, 1], arr[:, 2]
    x = np.stack([np.ones_like(n), n - p, n * n - p * p], axis=1)
    c = fit_nonnegative(x / t[:, None], np.ones_like(t))
    resid = float(np.sqrt(np.mean(((x @ c) / t - 1.0) ** 2)))
    return PrefillCoefficients(base_s=c[0], per_token_s=c[1], per_token_sq_s=c[2]), resid


def _fit_relative_decode(
    samples: Sequence[Sequence[float]],
) -> tuple[tuple[float, float, float], float]:
    """``base + a b + k ctx`` by non-negative least squares on relative residuals."""
    arr = np.array(samples, dtype=float)
    if len(arr) < 3:
        raise InvalidArgument(f"need at least 3 decode samples, got {len(arr)}")
    b, c, t = arr[:, 0], arr[:, 1], arr[:, 2]
    x = np.stack([np.ones_like(b), b, c], axis=1)
    coef = fit_nonnegative(x / t[:, None], np.ones_like(t))
    resid = float(np.sqrt(np.mean(((x @ coef) / t - 1.0) ** 2)))
    if coef[0] <= 0:  # the step of an empty batch must be positive
        coef[0] = float(t.min()) * 1e-3
    return (float(coef[0]), float(coef[1]), float(coef[2])), resid


def relative_errors(profile: CostProfile, prefill: Sequence[Sequence[float]],
                    decode: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Predicted vs measured per held-out point: ``{"prefill": [[n, p, measured_s,
    predicted_s, rel_err]], "decode": [[b, ctx, ...]], "prefill_max_abs_rel_err",
    "decode_max_abs_rel_err"}``."""
    pc, dc = profile.prefill, profile.decode
    rows_p = []
    for n, p, t in prefill:
        pred = pc.base_s + pc.per_token_s * (n - p) + pc.per_token_sq_s * (n * n - p * p)
        rows_p.append([n, p, round(t, 5), round(pred, 5), round((pred - t) / t, 4)])
    rows_d = []
    for b, c, t in decode:
        pred = dc.base_s + dc.per_request_s * b + dc.per_context_token_s * c
        rows_d.append([b, c, round(t, 6), round(pred, 6), round((pred - t) / t, 4)])
    return {
        "prefill": rows_p, "decode": rows_d,
        "prefill_max_abs_rel_err": max((abs(r[4]) for r in rows_p), default=0.0),
        "decode_max_abs_rel_err": max((abs(r[4]) for r in rows_d), default=0.0),
    }


def calibrate_vllm(
    model_dir: str | pathlib.Path,
    *,
    python: str = sys.executable,
    dtype: str = "float32",
    repeats: int = 2,
    prefill_train: Sequence[tuple[int, int]] = PREFILL_TRAIN,
    prefill_heldout: Sequence[tuple[int, int]] = PREFILL_HELDOUT,
    decode_train: Sequence[tuple[int, int]] = DECODE_TRAIN,
    decode_heldout: Sequence[tuple[int, int]] = DECODE_HELDOUT,
    cpus: str | None = None,
    timeout_s: float = 3600.0,
    progress: ProgressFn | None = None,
) -> CostProfile:
    """Measure a vLLM engine serving ``model_dir`` and fit a profile (module doc).

    Args:
        model_dir: Hugging Face checkpoint directory vLLM can load.
        python: a Python with vLLM installed (and this kvstored importable; its package root is
            put on PYTHONPATH).
        dtype: the engine's dtype.
        repeats: measurements per point (median).
        prefill_train / prefill_heldout: (n, p) points to fit / to check the fit on.
        decode_train / decode_heldout: (batch, context per request) points.
        cpus: ``VLLM_CPU_OMP_THREADS_BIND`` for the engine (None: the environment's, else "0":
            one core, since the machine may be shared).
        timeout_s: give up after this long.
        progress: called with each measurement line.

    Raises:
        InvalidArgument: not a checkpoint dir, vLLM cannot be run with ``python``, or the
            measurement failed (the message carries the engine's last output lines).
    """
    model_dir = pathlib.Path(model_dir)
    shape = _model_shape(model_dir)
    spec = {"model": str(model_dir), "dtype": dtype, "repeats": repeats,
            "prefill": [list(x) for x in (*prefill_train, *prefill_heldout)],
            "decode": [list(x) for x in (*decode_train, *decode_heldout)],
            "decode_tokens": [4, 33], "seed": 0}
    env = dict(os.environ)
    root = str(pathlib.Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpus or "0")
    if cpus:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpus
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        proc = subprocess.Popen(
            [python, "-m", "kvstored.scheduler.calibrate_vllm"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
    except OSError as exc:
        raise InvalidArgument(f"cannot run {python}: {exc.strerror}") from None
    assert proc.stdin is not None and proc.stderr is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(spec))
    proc.stdin.close()
    tail: list[str] = []
    deadline = time.monotonic() + timeout_s
    for line in proc.stderr:
        line = line.rstrip()
        tail = (tail + [line])[-20:]
        if progress is not None and (line.startswith("prefill ") or line.startswith("decode ")):
            progress(line)
        if time.monotonic() > deadline:
            proc.kill()
            break
    out = proc.stdout.read()
    rc = proc.wait()
    marker = "KVSTORED-CALIBRATE-RESULT "
    got = [ln for ln in out.splitlines() if ln.startswith(marker)]
    if rc != 0 and any("No module named 'vllm'" in ln for ln in tail):
        raise InvalidArgument(
            f"vLLM is not installed for {python}; pass the Python of a virtualenv that has it "
            "(kvstored calibrate --engine vllm --vllm-python /path/to/venv/bin/python)"
        )
    if rc != 0 or not got:
        raise InvalidArgument(
            f"the vLLM measurement failed (exit {rc}) with {python}; last output:\n"
            + "\n".join(tail)
        )
    res = json.loads(got[-1][len(marker):])
    n_pt, n_dt = len(prefill_train), len(decode_train)
    prefill = [tuple(x) for x in res["prefill"]]
    decode = [tuple(x) for x in res["decode"]]
    pc, p_resid = _fit_relative_prefill(prefill[:n_pt])
    (d0, db, dcx), d_resid = _fit_relative_decode(decode[:n_dt])
    kv_bytes = 2 * shape["num_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * (
        4 if dtype == "float32" else 2)
    base = CostProfile.default()
    prof = CostProfile(
        name=f"vllm-cpu-{model_dir.name}",
        description=(f"Measured on vLLM {res['vllm_version']} (CPU backend, {dtype}, "
                     f"threads bound to {env['VLLM_CPU_OMP_THREADS_BIND']}) serving "
                     f"{model_dir.name} on this host ({os.cpu_count()} CPUs)."),
        source="kvstored calibrate --engine vllm",
        model={"shape": "llama", **shape, "dtype": dtype},
        kv_bytes_per_token=kv_bytes,
        prefill=pc,
        decode=DecodeCoefficients(base_s=d0, per_request_s=db, per_context_token_s=dcx,
                                  kv_capacity_tokens=(1 << 30) // kv_bytes),
        bandwidth_bytes_per_s=Bandwidths(**base.bandwidth_bytes_per_s.model_dump()),
        fit={
            "prefill_samples": [list(s) for s in prefill[:n_pt]],
            "decode_samples": [list(s) for s in decode[:n_dt]],
            "prefill_relative_rms_residual": round(p_resid, 4),
            "decode_relative_rms_residual": round(d_resid, 4),
            "fit_weighting": "relative (each sample weighted by 1 / its time)",
            "rounds": repeats,
            "bandwidth": "copied from the base profile (not measured through vLLM)",
            "kv_capacity": "the engine's 1 GiB KV cache",
            "engine_startup_s": round(res["startup_s"], 1),
        },
    )
    prof.fit["heldout"] = relative_errors(prof, prefill[n_pt:], decode[n_dt:])
    return prof


def scale_profile(profile: CostProfile, target: CostProfile, *, compute_ratio: float,
                  bandwidth_ratio: float, name: str | None = None) -> CostProfile:
    """Carry a measured profile over to another model on other hardware (first-order rule).

    The rule, per coefficient (``P`` = parameters per token-forward ~ ``12 L d^2`` for a
    Llama-shaped model with its MLP, ``A`` = attention cost per token pair ~ ``L d``, ``K`` =
    KV bytes per token; subscript m = measured model, t = target):

    - prefill per-token (weights): ``x P_t / P_m / compute_ratio``;
    - prefill per-token-squared (attention): ``x A_t / A_m / compute_ratio``;
    - prefill base (launch/scheduling overhead): unchanged;
    - decode per-context-token (reading KV): ``x K_t / K_m / bandwidth_ratio``;
    - decode base (reading weights once per step): ``x P_t / P_m / bandwidth_ratio``;
    - decode per-request: ``x P_t / P_m / compute_ratio``.

    ``compute_ratio`` / ``bandwidth_ratio`` = how many times faster the target hardware
    computes / reads memory than the measured one. Capacities and transfer bandwidths are the
    target's. This keeps the *measured shape* of the curves (overheads, how attention and batch
    grow) and takes the sizes from the target; it is not a measurement of the target.

    Raises:
        InvalidArgument: a ratio that is not > 0, or a profile without model shape fields.
    """
    if not compute_ratio > 0 or not bandwidth_ratio > 0:
        raise InvalidArgument(
            f"compute_ratio and bandwidth_ratio must be > 0, got {compute_ratio}, "
            f"{bandwidth_ratio}"
        )

    def sizes(p: CostProfile) -> tuple[float, float, float]:
        try:
            layers, d = int(p.model["num_layers"]), int(p.model["hidden_size"])
        except (KeyError, TypeError, ValueError):
            raise InvalidArgument(
                f"profile {p.name!r} has no model num_layers/hidden_size to scale by"
            ) from None
        return 12.0 * layers * d * d, float(layers * d), float(p.kv_bytes_per_token)

    pm, am, km = sizes(profile)
    pt, at, kt = sizes(target)
    m, d = profile.prefill, profile.decode
    return CostProfile(
        name=name or f"{profile.name}-scaled-to-{target.name}",
        description=(f"{profile.name} scaled to {target.name}'s model by scale_profile "
                     f"(compute x{compute_ratio:g}, bandwidth x{bandwidth_ratio:g})."),
        source=f"scale_profile({profile.source or profile.name})",
        model=dict(target.model),
        kv_bytes_per_token=target.kv_bytes_per_token,
        prefill=PrefillCoefficients(
            base_s=m.base_s, per_token_s=m.per_token_s * pt / pm / compute_ratio,
            per_token_sq_s=m.per_token_sq_s * at / am / compute_ratio),
        decode=DecodeCoefficients(
            base_s=d.base_s * pt / pm / bandwidth_ratio,
            per_request_s=d.per_request_s * pt / pm / compute_ratio,
            per_context_token_s=d.per_context_token_s * kt / km / bandwidth_ratio,
            kv_capacity_tokens=target.decode.kv_capacity_tokens,
            max_batch_requests=target.decode.max_batch_requests),
        bandwidth_bytes_per_s=target.bandwidth_bytes_per_s,
        fit={"scaled_from": profile.name, "compute_ratio": compute_ratio,
             "bandwidth_ratio": bandwidth_ratio, "measured_fit": profile.fit},
    )


if __name__ == "__main__":
    main()
