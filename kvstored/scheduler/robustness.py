"""Robustness sweeps of the replay: admission modes against length noise, seeds and load.

``kvstored replay --length-noise 0,0.3,0.7,1.0 --seed 0,1,2 --speed 2,2.5,3`` and
``bench/bench_scheduler.py --sections robustness`` run the grid through :func:`sweep`,
summarise it over seeds with :func:`summarize` (mean, min, max) and plot it with
:func:`plot_robustness` (matplotlib, the ``sim`` extra).

A run is independent of the length noise and of the seed when neither is read: the seed feeds
the random policy and the noise; the noise only reaches the scheduler as the expected output
length, which only the length-aware modes (:data:`LENGTH_AWARE_MODES`) read. Such runs are
made once per speed and reused for every (noise, seed) cell, marked ``"reused": true`` in
the JSON rows (tests/unit/scheduler/test_robustness.py checks that rule).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

from rich.table import Table

from kvstored.scheduler.config import AdmissionMode, Policy
from kvstored.scheduler.sim import ClusterConfig, ProgressFn, ReplayResult, replay
from kvstored.scheduler.trace import TraceRecord

LENGTH_AWARE_MODES = frozenset({
    AdmissionMode.PREDICTED_LENGTH, AdmissionMode.PREDICTED_ADAPTIVE,
    AdmissionMode.PREDICTED_QUANTILE,
})
"""Admission modes that read the expected output length (so the length noise matters)."""


def depends_on_noise(policy: Policy, mode: AdmissionMode) -> bool:
    """Whether a run's outcome can change with ``length_noise`` or ``seed``."""
    return policy is Policy.RANDOM or mode in LENGTH_AWARE_MODES


def sweep(
    records: Sequence[TraceRecord],
    policies: Sequence[Policy],
    modes: Sequence[AdmissionMode],
    cluster: ClusterConfig,
    *,
    sigmas: Sequence[float] = (0.0,),
    seeds: Sequence[int] = (0,),
    speeds: Sequence[float] | None = None,
    progress: ProgressFn | None = None,
    on_run: Callable[[ReplayResult], None] | None = None,
) -> list[tuple[ReplayResult, bool]]:
    """Replay every (speed, policy, mode, sigma, seed) cell.

    Args:
        records: the trace.
        policies / modes: what to compare.
        cluster: the cluster; its ``length_noise``, ``seed`` and (when ``speeds`` is given)
            ``speed`` are replaced per cell.
        sigmas: length-noise sigmas; seeds: seeds; speeds: replay speeds (None = the cluster's).
        progress: arrivals callback passed to every replay that runs.
        on_run: called with each result that was actually replayed (for logging).

    Returns:
        ``(result, reused)`` per cell in loop order (speed, policy, mode, sigma, seed);
        ``reused`` is True for a copy of the same run at another (sigma, seed) (see module doc).

    Raises:
        InvalidArgument: a bad cluster setting (from :func:`replay`).
    """
    out: list[tuple[ReplayResult, bool]] = []
    for speed in (speeds if speeds is not None else [cluster.speed]):
        for pol in policies:
            for mode in modes:
                first: ReplayResult | None = None
                for sigma in sigmas:
                    for seed in seeds:
                        if first is not None and not depends_on_noise(pol, mode):
                            out.append((dataclasses.replace(first, length_noise=sigma,
                                                            seed=seed), True))
                            continue
                        cl = dataclasses.replace(cluster, speed=speed, length_noise=sigma,
                                                 seed=seed)
                        r = replay(records, pol, mode, cl, progress=progress)
                        if on_run is not None:
                            on_run(r)
                        if first is None:
                            first = r
                        out.append((r, False))
    return out


_METRICS = ("rejected", "completed_within_slo", "wasted_prefills", "completed")


def summarize(results: Sequence[tuple[ReplayResult, bool]]) -> list[dict[str, Any]]:
    """One row per (speed, policy, mode, sigma): mean / min / max over seeds.

    Row keys: ``speed``, ``policy``, ``admission``, ``length_noise``, ``seeds`` (list), and for
    each of rejected, completed_within_slo, wasted_prefills, completed: ``<m>_mean``,
    ``<m>_min``, ``<m>_max``.
    """
    groups: dict[tuple[float, str, str, float], list[ReplayResult]] = {}
    for r, _ in results:
        groups.setdefault((r.speed, r.policy, r.admission, r.length_noise), []).append(r)
    rows = []
    for (speed, pol, mode, sigma), rs in groups.items():
        row: dict[str, Any] = {"speed": speed, "policy": pol, "admission": mode,
                               "length_noise": sigma, "seeds": [r.seed for r in rs]}
        for m in _METRICS:
            vals = [getattr(r, m) for r in rs]
            row[f"{m}_mean"] = round(sum(vals) / len(vals), 1)
            row[f"{m}_min"] = min(vals)
            row[f"{m}_max"] = max(vals)
        rows.append(row)
    return rows


def cell(rows: Sequence[dict[str, Any]], *, admission: str, length_noise: float,
         speed: float | None = None, policy: str | None = None) -> dict[str, Any]:
    """The summary row of one cell.

    Raises:
        KeyError: no such row.
    """
    for r in rows:
        if (r["admission"] == admission and r["length_noise"] == length_noise
                and (speed is None or r["speed"] == speed)
                and (policy is None or r["policy"] == policy)):
            return r
    raise KeyError(f"no summary row for {admission} at sigma {length_noise}, speed {speed}")


def markdown_table(rows: Sequence[dict[str, Any]], metric: str = "rejected") -> str:
    """Markdown: one line per (speed, policy, mode), one column per sigma, ``mean (min-max)``."""
    sigmas = sorted({r["length_noise"] for r in rows})
    keys = list(dict.fromkeys((r["speed"], r["policy"], r["admission"]) for r in rows))
    lines = ["| speed | policy | admission | " + " | ".join(f"σ={s:g}" for s in sigmas) + " |",
             "|---:|---|---|" + "---:|" * len(sigmas)]
    for speed, pol, mode in keys:
        cells = []
        for s in sigmas:
            try:
                r = cell(rows, admission=mode, length_noise=s, speed=speed, policy=pol)
            except KeyError:
                cells.append("")
                continue
            lo, hi = r[f"{metric}_min"], r[f"{metric}_max"]
            mean = r[f"{metric}_mean"]
            cells.append(f"{mean:g}" if lo == hi else f"{mean:g} ({lo}–{hi})")
        lines.append(f"| {speed:g}× | {pol} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_robustness(rows: Sequence[dict[str, Any]], path: str | pathlib.Path,
                    title: str = "") -> None:
    """Rejected and completed-within-SLO against sigma, one line per mode, one row of panels
    per (speed, policy); error bars span the seeds (min to max).

    Raises:
        ImportError: matplotlib is not installed (``pip install kvstored[sim]``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((r["speed"], r["policy"]) for r in rows))
    fig, axes = plt.subplots(len(panels), 2, figsize=(13, 3.6 * len(panels) + 0.5),
                             squeeze=False)
    for (speed, pol), ax_row in zip(panels, axes, strict=True):
        sub = [r for r in rows if r["speed"] == speed and r["policy"] == pol]
        for mode in dict.fromkeys(r["admission"] for r in sub):
            pts = sorted((r for r in sub if r["admission"] == mode),
                         key=lambda r: r["length_noise"])
            xs = [r["length_noise"] for r in pts]
            for ax, m in zip(ax_row, ("rejected", "completed_within_slo"), strict=True):
                ys = [r[f"{m}_mean"] for r in pts]
                err = [[y - r[f"{m}_min"] for y, r in zip(ys, pts, strict=True)],
                       [r[f"{m}_max"] - y for y, r in zip(ys, pts, strict=True)]]
                ax.errorbar(xs, ys, yerr=err, marker="o", ms=4, capsize=3, label=mode,
                            lw=2.2 if mode == "predicted-quantile" else 1.2)
        for ax, ylabel in zip(ax_row, ("rejected requests", "completed within both SLOs"),
                              strict=True):
            ax.set_xlabel("length noise σ (log-normal error of the expected output length)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{title}{' ' if title else ''}{pol}, {speed:g}× speed", fontsize=9)
            ax.grid(alpha=0.3)
        ax_row[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def robustness_table(rows: Sequence[dict[str, Any]], metric: str = "rejected") -> Table:
    """The same as :func:`markdown_table`, as a rich table for the terminal."""
    sigmas = sorted({r["length_noise"] for r in rows})
    t = Table(title=f"{metric.replace('_', ' ')} by length noise σ: mean (min–max over seeds)",
              title_justify="left")
    for col in ("speed", "policy", "admission"):
        t.add_column(col, no_wrap=True)
    for s in sigmas:
        t.add_column(f"σ={s:g}", justify="right")
    md = markdown_table(rows, metric).splitlines()[2:]
    for line in md:
        cells = [c.strip() for c in line.strip("|").split("|")]
        t.add_row(*cells)
    return t
