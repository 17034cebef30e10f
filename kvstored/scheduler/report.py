"""Tables, JSON documents and plots of replay results (``kvstored replay``).

matplotlib is imported only by the plot functions (the ``sim`` extra); tables use rich.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

from kvstored.scheduler.sim import ClusterConfig, ReplayResult

RESULT_FIELDS = (
    "avg_ttft_s", "p90_ttft_s", "tbt_slo_attainment", "completed", "completed_within_slo",
    "rejected", "wasted_prefills", "hit_ratio",
)


def results_table(results: Sequence[ReplayResult], title: str = "replay") -> Table:
    """One row per (policy, admission mode)."""
    t = Table(title=title, title_justify="left")
    for col in ("policy", "admission", "avg TTFT s", "P90 TTFT s", "TBT SLO att.", "completed",
                "within SLO", "rejected", "wasted", "hit ratio", "decode load (mean±std)"):
        if col in ("policy", "admission"):
            t.add_column(col, justify="left", no_wrap=True, min_width=18)
        else:
            t.add_column(col, justify="right")
    for r in results:
        t.add_row(
            r.policy, r.admission, f"{r.avg_ttft_s:.2f}", f"{r.p90_ttft_s:.2f}",
            f"{r.tbt_slo_attainment:.3f}", str(r.completed), str(r.completed_within_slo),
            str(r.rejected), str(r.wasted_prefills), f"{r.hit_ratio:.3f}",
            f"{r.mean_decode_load:.2f}±{r.decode_load_std:.2f}",
        )
    return t


def results_document(
    trace: str,
    cluster: ClusterConfig,
    results: Sequence[ReplayResult],
    *,
    hit_curve: Mapping[str, Mapping[str, float]] | None = None,
    include_timeline: bool = False,
) -> dict[str, Any]:
    """The JSON document of a replay: configuration, one entry per run, optional curves.

    ``results`` entries carry ``policy``, ``admission``, ``avg_ttft_s``, ``p90_ttft_s``,
    ``tbt_slo_attainment``, ``completed``, ``rejected``, ``wasted_prefills``, ``hit_ratio`` and
    more (see :class:`ReplayResult`); ``by_policy[policy][admission]`` indexes the same.
    """
    runs = []
    by_policy: dict[str, dict[str, dict[str, object]]] = {}
    for r in results:
        d = r.summary()
        d["wall_s"] = round(r.wall_s, 3)
        if include_timeline:
            d["timeline"] = r.timeline
        runs.append(d)
        # a sweep has several runs per (policy, mode): index the first (speed, sigma, seed)
        by_policy.setdefault(r.policy, {}).setdefault(r.admission,
                                                      {k: d[k] for k in RESULT_FIELDS})
    doc: dict[str, Any] = {"trace": trace, "cluster": cluster.describe(), "results": runs,
                           "by_policy": by_policy}
    if hit_curve is not None:
        doc["hit_ratio_by_capacity"] = hit_curve
    return doc


def hit_curve_table(curve: Mapping[str, Mapping[str, float]]) -> Table:
    """Hit ratio per eviction policy (rows) and capacity in blocks (columns)."""
    caps = list(next(iter(curve.values())).keys()) if curve else []
    t = Table(title="prefix-hit ratio by cache capacity (blocks)", title_justify="left")
    t.add_column("policy")
    for c in caps:
        t.add_column(c, justify="right")
    for pol, row in curve.items():
        t.add_row(pol, *(f"{row[c]:.3f}" for c in caps))
    return t


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_comparison(results: Sequence[ReplayResult], path: str | pathlib.Path) -> None:
    """Bar charts: average TTFT per policy, and rejected / wasted per admission mode.

    Raises:
        ImportError: matplotlib is not installed (``pip install kvstored[sim]``).
    """
    plt = _pyplot()
    policies = list(dict.fromkeys(r.policy for r in results))
    modes = list(dict.fromkeys(r.admission for r in results))
    idx = {(r.policy, r.admission): r for r in results}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    width = 0.8 / max(1, len(modes))
    for j, m in enumerate(modes):
        xs = [i + j * width for i in range(len(policies))]
        axes[0].bar(xs, [idx[(p, m)].avg_ttft_s if (p, m) in idx else 0 for p in policies],
                    width, label=m)
    axes[0].set_xticks([i + width * (len(modes) - 1) / 2 for i in range(len(policies))])
    axes[0].set_xticklabels(policies, rotation=15)
    axes[0].set_ylabel("average TTFT (s)")
    axes[0].set_title("TTFT by prefill policy")
    axes[0].legend(fontsize=7)
    width = 0.8 / max(1, len(policies))
    for j, p in enumerate(policies):
        xs = [i + j * width for i in range(len(modes))]
        axes[1].bar(xs, [idx[(p, m)].rejected if (p, m) in idx else 0 for m in modes], width,
                    label=p)
        axes[2].bar(xs, [idx[(p, m)].completed_within_slo if (p, m) in idx else 0
                         for m in modes], width, label=p)
    for ax, ylabel, title in ((axes[1], "rejected requests", "rejections by admission mode"),
                              (axes[2], "completed within both SLOs", "goodput")):
        ax.set_xticks([i + width * (len(policies) - 1) / 2 for i in range(len(modes))])
        ax.set_xticklabels(modes, rotation=15)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_timeline(
    results: Sequence[ReplayResult], path: str | pathlib.Path, *, window_s: float | None = None
) -> None:
    """Prefill and decode load over time, one panel per run (oscillation of early rejection).

    Args:
        results: runs to plot (typically one policy, several admission modes).
        path: PNG to write.
        window_s: plot only the first ``window_s`` simulated seconds (None = all).

    Raises:
        ImportError: matplotlib is not installed.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(len(results), 1, figsize=(14, 2.3 * len(results) + 0.6),
                             sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], results, strict=True):
        rows = [row for row in r.timeline if window_s is None or row[0] <= window_s]
        ts = [row[0] for row in rows]
        ax.plot(ts, [row[1] for row in rows], label="prefill load (queue / TTFT SLO)", lw=1)
        ax.plot(ts, [row[2] for row in rows], label="decode load (TBT / SLO, KV / capacity)",
                lw=1)
        ax.axhline(1.0, color="grey", lw=0.6, ls="--")
        ax.set_ylabel("load")
        ax.set_title(f"{r.policy} / {r.admission}: prefill std {r.prefill_load_std:.2f}, "
                     f"decode std {r.decode_load_std:.2f}, corr {r.load_correlation:+.2f}",
                     fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("simulated time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
