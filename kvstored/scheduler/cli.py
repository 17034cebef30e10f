"""``kvstored replay`` and ``kvstored calibrate`` (click commands; kvstored/cli/main.py adds them).

replay: drive the scheduler core with a Mooncake trace in the discrete-event simulator and
compare prefill policies and admission modes. Writes a table (or JSON) on stdout, and
optionally a JSON file, a comparison plot and a load-over-time plot.

calibrate: measure a random-weight Llama-shaped model on this machine and write a cost profile
JSON that ``replay --profile`` and ``SchedulerConfig.profile_path`` accept.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import sys
from typing import Any

import click

from kvstored.errors import KvstoredError

_POLICIES = ["random", "load-balancing", "cache-aware", "kvcache-centric"]
_MODES = ["none", "reject-at-decode", "early", "predicted", "predicted-length",
          "predicted-adaptive", "predicted-quantile"]
_DEFAULT_MODES = ["reject-at-decode", "early", "predicted", "predicted-length",
                  "predicted-adaptive", "predicted-quantile"]

# The documented high-load cluster (docs/scheduler.md): see the defaults of the options below.
DEFAULT_CLUSTER = {
    "num_prefill": 8,
    "num_decode": 8,
    "cache_blocks": 10_000,
    "speed": 2.5,
    "decode_relative_speed": 1.0,
    "decode_kv_capacity_tokens": 120_000,
}


def _parse_choice_list(value: str, allowed: list[str], what: str,
                       all_means: list[str]) -> list[str]:
    if value == "all":
        return list(all_means)
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise click.BadParameter(
            f"unknown {what} {bad or value!r}; choose from {', '.join(allowed)}, a comma-separated "
            "list of them, or all"
        )
    return items


def _cache_blocks(value: str) -> int | None:
    if value.lower() in ("inf", "unlimited", "none"):
        return None
    try:
        n = int(value)
    except ValueError:
        raise click.BadParameter(f"must be a positive integer or 'inf', got {value!r}") from None
    if n < 1:
        raise click.BadParameter(f"must be >= 1 or 'inf', got {n}")
    return n


def _float_list(value: str, what: str, *, positive: bool, unique: bool = True) -> list[float]:
    out = []
    for item in (v.strip() for v in value.split(",")):
        if not item:
            continue
        try:
            x = float(item)
        except ValueError:
            raise click.BadParameter(
                f"{what} must be a number or a comma-separated list of numbers, got {item!r}"
            ) from None
        if not math.isfinite(x) or x < 0 or (positive and x == 0):
            raise click.BadParameter(f"{what} must be {'> 0' if positive else '>= 0'}, got {x}")
        out.append(x)
    if not out:
        raise click.BadParameter(f"{what}: no value in {value!r}")
    return list(dict.fromkeys(out)) if unique else out


def _int_list(value: str, what: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{what} must be an integer or a comma-separated list of integers, got {value!r}"
        ) from None
    if not out:
        raise click.BadParameter(f"{what}: no value in {value!r}")
    return list(dict.fromkeys(out))


def _check_output(path: pathlib.Path | None, option: str) -> None:
    """Fail before the replay (not after it) when an output file cannot be written."""
    if path is None:
        return
    if path.is_dir():
        raise click.BadParameter(f"{path} is a directory, need a file path", param_hint=option)
    parent = path.parent if str(path.parent) else pathlib.Path(".")
    if not parent.is_dir():
        raise click.BadParameter(f"directory {parent} does not exist (for {path})",
                                 param_hint=option)
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise click.BadParameter(f"{path} is not writable", param_hint=option)
    # root passes os.access everywhere (e.g. /proc): open the file for real, and remove it
    # again if it did not exist
    existed = path.exists()
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise click.BadParameter(f"{path} cannot be written: {exc.strerror}",
                                 param_hint=option) from None
    if not existed:
        path.unlink(missing_ok=True)


def _check_plot_format(path: pathlib.Path | None, option: str) -> None:
    """Fail before the replay when matplotlib cannot write ``path``'s format (its suffix)."""
    if path is None:
        return
    from matplotlib.figure import Figure

    formats = Figure().canvas.get_supported_filetypes()
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in formats:
        raise click.BadParameter(
            f"{path}: matplotlib cannot write {fmt or 'a file without a suffix'!r}; use one of "
            f"{', '.join('.' + f for f in sorted(formats))}",
            param_hint=option,
        )


@click.command("replay")
@click.argument("trace_arg", metavar="[TRACE]", required=False, default=None)
@click.option("--trace", "trace_opt", default=None,
              help="The trace: a shipped one by name (conversation, synthetic) or a .jsonl "
              "path. Default conversation. Same as the TRACE argument.")
@click.option("--prefill", "num_prefill", type=click.IntRange(min=1),
              default=DEFAULT_CLUSTER["num_prefill"], show_default=True,
              help="Prefill instances (each on its own node with its own block cache).")
@click.option("--decode", "num_decode", type=click.IntRange(min=1),
              default=DEFAULT_CLUSTER["num_decode"], show_default=True,
              help="Decode instances.")
@click.option("--cache-blocks", default=str(DEFAULT_CLUSTER["cache_blocks"]), show_default=True,
              help="Block cache capacity of each prefill node, blocks (or 'inf').")
@click.option("--cache-policy", type=click.Choice(["store", "lru", "lfu"]), default="store",
              show_default=True, help="Eviction policy of the node caches (store = chain-aware "
              "LRU, the store's).")
@click.option("--policy", "policy_arg", default="all", show_default=True,
              help=f"Prefill policy: {'|'.join(_POLICIES)}|all (or a comma-separated list).")
@click.option("--admission", "admission_arg", default="all", show_default=True,
              help=f"Admission mode: {'|'.join(_MODES)}|all (all = "
              f"{','.join(_DEFAULT_MODES)}).")
@click.option("--speed", "speed_arg", default=str(DEFAULT_CLUSTER["speed"]), show_default=True,
              help="Replay speed: arrival times are divided by this (a comma-separated list "
              "sweeps the load).")
@click.option("--decode-speed", type=click.FloatRange(min=0, min_open=True),
              default=DEFAULT_CLUSTER["decode_relative_speed"], show_default=True,
              help="Speed of a decode instance relative to the profile.")
@click.option("--decode-kv-tokens", type=click.IntRange(min=0),
              default=DEFAULT_CLUSTER["decode_kv_capacity_tokens"], show_default=True,
              help="KV capacity of a decode instance, tokens (0 = the profile's).")
@click.option("--ttft-slo-s", type=click.FloatRange(min=0, min_open=True), default=30.0,
              show_default=True)
@click.option("--tbt-slo-s", type=click.FloatRange(min=0, min_open=True), default=0.1,
              show_default=True)
@click.option("--profile", "profile_path", type=click.Path(exists=True, dir_okay=False,
              path_type=pathlib.Path), default=None,
              help="Cost profile JSON (default: the shipped 8x A800 / Llama-70B-shaped one).")
@click.option("--profile-scale", default=None, metavar="COMPUTE,BANDWIDTH",
              help="Scale --profile (e.g. one from calibrate --engine vllm) to the shipped "
              "profile's model (Llama-70B shape), on hardware COMPUTE times faster in compute "
              "and BANDWIDTH times in memory bandwidth (scale_profile in "
              "kvstored/scheduler/calibrate_vllm.py documents the rule).")
@click.option("--length-noise", "noise_arg", default="0", show_default=True,
              help="Sigma of a log-normal error on the expected output length the scheduler is "
              "told (0 = the true length); a comma-separated list sweeps it, e.g. 0,0.3,0.7,1.0.")
@click.option("--seed", "seed_arg", default="0", show_default=True,
              help="Seed of the length noise and the random policy; a comma-separated list "
              "repeats every run per seed (the tables then show mean (min-max)).")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Replay only the first N requests.")
@click.option("--output", type=click.Choice(["table", "json"]), default="table",
              show_default=True, help="What to print on stdout.")
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=pathlib.Path),
              default=None, help="Also write the JSON document (with load timelines) here.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=pathlib.Path), default=None,
              help="Write a PNG comparing policies and admission modes.")
@click.option("--timeline-plot", type=click.Path(dir_okay=False, path_type=pathlib.Path),
              default=None, help="Write a PNG of prefill and decode load over time per run.")
@click.option("--timeline-window-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Plot only the first this many simulated seconds of the timeline.")
@click.option("--noise-plot", type=click.Path(dir_okay=False, path_type=pathlib.Path),
              default=None, help="Write a PNG of rejected and completed-within-SLO against the "
              "length noise, per admission mode (and speed), error bars over the seeds.")
@click.option("--hit-curve", is_flag=True,
              help="Also report the trace's prefix-hit ratio against one cache's capacity "
              "(LRU vs the store's policy).")
@click.option("--copy-gbps", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Rate the planned fetches' copies really run at, GB/s (e.g. "
              "bench/bench_remote_get.py's remote_get_gbps): the prefill waits for the copy "
              "at that rate instead of the cost model's transfer time; 0 = the model's.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr (default: when stderr is a terminal).")
def replay(trace_arg: str | None, trace_opt: str | None, num_prefill: int, num_decode: int,
           cache_blocks: str, cache_policy: str, policy_arg: str, admission_arg: str,
           speed_arg: str, decode_speed: float, decode_kv_tokens: int, ttft_slo_s: float,
           tbt_slo_s: float, profile_path: pathlib.Path | None, profile_scale: str | None,
           noise_arg: str, seed_arg: str,
           limit: int | None, output: str, json_out: pathlib.Path | None,
           plot: pathlib.Path | None, timeline_plot: pathlib.Path | None,
           timeline_window_s: float | None, noise_plot: pathlib.Path | None, hit_curve: bool,
           copy_gbps: float, progress: bool | None) -> None:
    """Replay a Mooncake request TRACE through the scheduler in a simulated cluster.

    TRACE is a shipped trace by name (conversation, synthetic; default conversation) or a
    .jsonl file. Reports per policy and admission mode: average and P90 TTFT, TBT SLO
    attainment, completed, rejected and wasted prefills, and the cache hit ratio; with lists of
    --length-noise, --seed or --speed, also rejected and completed-within-SLO per sigma
    (mean and range over the seeds).
    """
    from rich.console import Console

    from kvstored.scheduler.cache import EvictionPolicy, hit_ratio_curve
    from kvstored.scheduler.config import AdmissionMode, Policy
    from kvstored.scheduler.costmodel import CostProfile
    from kvstored.scheduler.report import (
        hit_curve_table,
        plot_comparison,
        plot_timeline,
        results_document,
        results_table,
    )
    from kvstored.scheduler.robustness import (
        plot_robustness,
        robustness_table,
        summarize,
        sweep,
    )
    from kvstored.scheduler.sim import ClusterConfig
    from kvstored.scheduler.trace import load_trace, resolve_trace

    if trace_arg is not None and trace_opt is not None and trace_arg != trace_opt:
        raise click.UsageError(f"two traces given: {trace_arg!r} and --trace {trace_opt!r}")
    policies = _parse_choice_list(policy_arg, _POLICIES, "policy", _POLICIES)
    modes = _parse_choice_list(admission_arg, _MODES, "admission mode", _DEFAULT_MODES)
    speeds = _float_list(speed_arg, "--speed", positive=True)
    sigmas = _float_list(noise_arg, "--length-noise", positive=False)
    seeds = _int_list(seed_arg, "--seed")
    ratios = _float_list(profile_scale, "--profile-scale", positive=True,
                         unique=False) if profile_scale \
        else None
    if ratios is not None and (len(ratios) != 2 or profile_path is None):
        raise click.UsageError("--profile-scale needs --profile and two numbers: COMPUTE,BANDWIDTH")
    for path, opt in ((json_out, "--json-out"), (plot, "--plot"),
                      (timeline_plot, "--timeline-plot"), (noise_plot, "--noise-plot")):
        _check_output(path, opt)
    if plot or timeline_plot or noise_plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            raise click.UsageError(
                f"plots need matplotlib ({exc}); install the sim extra: pip install "
                "'kvstored[sim]', or drop --plot/--timeline-plot/--noise-plot"
            ) from None
        for path, opt in ((plot, "--plot"), (timeline_plot, "--timeline-plot"),
                          (noise_plot, "--noise-plot")):
            _check_plot_format(path, opt)
    try:
        trace = resolve_trace(trace_opt or trace_arg or "conversation")
        records = load_trace(trace, limit=limit)
        profile = CostProfile.load(profile_path) if profile_path else None
        if profile is not None and ratios is not None:
            from kvstored.scheduler.calibrate_vllm import scale_profile

            profile = scale_profile(profile, CostProfile.default(), compute_ratio=ratios[0],
                                    bandwidth_ratio=ratios[1])
        cluster = ClusterConfig(
            num_prefill=num_prefill, num_decode=num_decode,
            cache_blocks=_cache_blocks(cache_blocks), cache_policy=EvictionPolicy(cache_policy),
            decode_relative_speed=decode_speed, decode_kv_capacity_tokens=decode_kv_tokens,
            speed=speeds[0], ttft_slo_s=ttft_slo_s, tbt_slo_s=tbt_slo_s,
            length_noise=sigmas[0], seed=seeds[0], profile=profile,
            copy_bytes_per_s=copy_gbps * 1e9,
        )
        cluster.validate()
    except KvstoredError as exc:
        raise click.ClickException(str(exc)) from None
    if not records:
        raise click.ClickException(f"trace {trace} has no records")

    show = sys.stderr.isatty() if progress is None else progress
    bar: Any = None
    if show:
        from tqdm import tqdm

        bar = tqdm(total=None, unit="req", file=sys.stderr, desc="replay", leave=False)
    try:
        cells = sweep(records, [Policy(p) for p in policies], [AdmissionMode(m) for m in modes],
                      cluster, sigmas=sigmas, seeds=seeds, speeds=speeds,
                      progress=bar.update if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    results = [r for r, _ in cells]
    swept = len(sigmas) * len(seeds) * len(speeds) > 1
    summary = summarize(cells) if swept else None
    curve = None
    if hit_curve:
        curve = hit_ratio_curve(
            (r.hash_ids for r in records), [None, 100_000, 50_000, 30_000, 10_000, 1_000],
            [EvictionPolicy.LRU, EvictionPolicy.STORE, EvictionPolicy.LFU],
        )

    def document(include_timeline: bool) -> dict[str, Any]:
        doc = results_document(str(trace), cluster, results, hit_curve=curve,
                               include_timeline=include_timeline)
        for row, (_, reused) in zip(doc["results"], cells, strict=True):
            row["reused"] = reused
        if summary is not None:
            doc["robustness"] = summary
        return doc

    if output == "json":
        sys.stdout.write(json.dumps(document(False), indent=2, sort_keys=True) + "\n")
    else:
        con = Console(highlight=False, width=max(180, Console().width))
        c = cluster.describe()
        con.print(
            f"trace {trace.name}: {len(records)} requests at "
            f"{','.join(f'{s:g}' for s in speeds)}x; {num_prefill} prefill + "
            f"{num_decode} decode instances; cache {c['cache_blocks'] or 'unlimited'} blocks/node "
            f"({cache_policy}); profile {c['profile']}; SLOs TTFT {ttft_slo_s} s, TBT "
            f"{tbt_slo_s} s"
        )
        if summary is None:
            con.print(results_table(results))
        else:
            con.print(robustness_table(summary, "rejected"))
            con.print(robustness_table(summary, "completed_within_slo"))
        if curve is not None:
            con.print(hit_curve_table(curve))
    if json_out is not None:
        json_out.write_text(json.dumps(document(True), indent=1, sort_keys=True) + "\n",
                            encoding="utf-8")
    if plot is not None:
        plot_comparison(results, plot)
    if timeline_plot is not None:
        plot_timeline(results, timeline_plot, window_s=timeline_window_s)
    if noise_plot is not None:
        plot_robustness(summary or summarize(cells), noise_plot, title=trace.stem)


@click.command("calibrate")
@click.option("--engine", type=click.Choice(["torch", "vllm"]), default="torch",
              show_default=True, help="torch: a random-weight Llama-shaped model in this "
              "process; vllm: a real vLLM engine serving --model (see --vllm-python).")
@click.option("--output", "output_path", type=click.Path(dir_okay=False, path_type=pathlib.Path),
              default=pathlib.Path("kvstored-profile.json"), show_default=True,
              help="Where to write the profile JSON.")
@click.option("--layers", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--hidden-size", type=click.IntRange(min=8), default=512, show_default=True)
@click.option("--heads", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--kv-heads", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--intermediate-size", type=click.IntRange(min=8), default=1408,
              show_default=True)
@click.option("--max-tokens", type=click.IntRange(min=64), default=1536, show_default=True,
              help="Longest prompt timed (the grid is 5 lengths up to it).")
@click.option("--repeats", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="torch threads (the machine is shared: keep it low).")
@click.option("--no-io", is_flag=True, help="Do not measure memcpy and file-read bandwidth.")
@click.option("--model", "model_dir", type=click.Path(file_okay=False, path_type=pathlib.Path),
              default=None, help="vllm: Hugging Face checkpoint dir (default: the path in "
              "<venv of --vllm-python>/kvstored-model-path, which scripts/setup-vllm-venv.sh "
              "writes).")
@click.option("--vllm-python", default=None,
              help="vllm: a Python with vLLM installed (default: this one).")
@click.option("--dtype", default="float32", show_default=True, help="vllm: engine dtype.")
@click.option("--cpus", default=None,
              help="vllm: VLLM_CPU_OMP_THREADS_BIND for the engine (default: the "
              "environment's, else core 0 only).")
def calibrate(engine: str, output_path: pathlib.Path, layers: int, hidden_size: int,
              heads: int, kv_heads: int, intermediate_size: int, max_tokens: int,
              repeats: int, threads: int, no_io: bool, model_dir: pathlib.Path | None,
              vllm_python: str | None, dtype: str, cpus: str | None) -> None:
    """Measure a model on this machine and write a cost profile JSON.

    With --engine vllm the profile is fitted to a real vLLM engine's prefill (TTFT) and decode
    step times, and the fit is checked on held-out points (printed, and stored in the
    profile's fit.heldout).
    """
    _check_output(output_path, "--output")
    if engine == "vllm":
        _calibrate_vllm(output_path, model_dir, vllm_python, dtype, repeats, cpus)
        return
    from kvstored.scheduler.calibrate import calibrate as run

    lengths = sorted({max(16, int(max_tokens * f)) for f in (1 / 12, 1 / 6, 1 / 3, 2 / 3, 1.0)})
    try:
        prof = run(num_layers=layers, hidden_size=hidden_size, num_heads=heads,
                   num_kv_heads=kv_heads, intermediate_size=intermediate_size,
                   prefill_lengths=lengths, repeats=repeats, threads=threads,
                   measure_io=not no_io, progress=lambda m: click.echo(m, err=True))
    except KvstoredError as exc:
        raise click.ClickException(str(exc)) from None
    except ImportError as exc:
        raise click.ClickException(
            f"calibrate needs torch and transformers ({exc}); install the demo extra"
        ) from None
    prof.save(output_path)
    _say_profile(output_path, prof)


def _say_profile(output_path: pathlib.Path, prof: Any) -> None:
    p, d = prof.prefill, prof.decode
    click.echo(
        f"wrote {output_path}: prefill_s = {p.base_s:.4g} + {p.per_token_s:.4g}*(n-p) + "
        f"{p.per_token_sq_s:.4g}*(n^2-p^2); tbt_s = {d.base_s:.4g} + {d.per_request_s:.4g}*b + "
        f"{d.per_context_token_s:.4g}*ctx (residuals: prefill "
        f"{prof.fit['prefill_relative_rms_residual']}, decode "
        f"{prof.fit['decode_relative_rms_residual']})"
    )


def _calibrate_vllm(output_path: pathlib.Path, model_dir: pathlib.Path | None,
                    vllm_python: str | None, dtype: str, repeats: int, cpus: str | None) -> None:
    from kvstored.scheduler.calibrate_vllm import calibrate_vllm

    python = vllm_python or sys.executable
    if model_dir is None:
        hint = pathlib.Path(python).absolute().parent.parent / "kvstored-model-path"
        if not hint.is_file():
            raise click.UsageError(
                f"--engine vllm needs --model (no {hint} to read a default from)"
            )
        model_dir = pathlib.Path(hint.read_text().strip())
    try:
        prof = calibrate_vllm(model_dir, python=python, dtype=dtype, repeats=max(repeats, 3),
                              cpus=cpus, progress=lambda m: click.echo(m, err=True))
    except KvstoredError as exc:
        raise click.ClickException(str(exc)) from None
    prof.save(output_path)
    _say_profile(output_path, prof)
    h = prof.fit["heldout"]
    click.echo("held-out prefill (n, cached, measured s, predicted s, relative error):")
    for row in h["prefill"]:
        click.echo(f"  {row[0]:>5} {row[1]:>5} {row[2]:.4f} {row[3]:.4f} {row[4]:+.1%}")
    click.echo("held-out decode (batch, context tokens, measured s, predicted s, rel. error):")
    for row in h["decode"]:
        click.echo(f"  {row[0]:>5} {row[1]:>7.0f} {row[2]:.5f} {row[3]:.5f} {row[4]:+.1%}")
    click.echo(f"max |relative error|: TTFT {h['prefill_max_abs_rel_err']:.1%}, decode step "
               f"{h['decode_max_abs_rel_err']:.1%} (target TTFT within 15%)")
