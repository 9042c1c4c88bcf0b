"""PNG plots of benchmark runs (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from styx_py.benchmarks.driver import RunResult


def plot_run(result: RunResult, stem: Path, title: str) -> list[Path]:
    """``<stem>-cdf.png`` (latency CDF, log x) and ``<stem>-time.png`` (throughput, latency per second)."""
    paths: list[Path] = []
    h = result.hist
    if h.get_total_count():
        xs, ys = [], []
        for item in h.get_recorded_iterator():
            xs.append(item.value_iterated_to / 1000)
            ys.append(item.total_count_to_this_value / h.get_total_count())
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(xs, ys, drawstyle="steps-post")
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms, from scheduled send)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{title}: latency CDF")
        for q in (0.5, 0.99):
            ax.axhline(q, color="grey", lw=0.5, ls="--")
        ax.grid(True, which="both", lw=0.3)
        path = stem.parent / f"{stem.name}-cdf.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)

    series = result.series()
    secs = [s["second"] for s in series]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.plot(secs, [s["replies_arrived"] for s in series], label="replies/s")
    top.plot(secs, [s["committed"] for s in series], label="committed/s (by send second)")
    top.axhline(result.rate, color="grey", lw=0.8, ls="--", label="requested rate")
    top.set_ylabel("per second")
    top.legend(loc="lower right", fontsize=8)
    top.set_title(f"{title}: throughput and latency over time")
    for key, label in (("p50_ms", "p50"), ("p99_ms", "p99"), ("max_ms", "max")):
        bottom.plot(secs, [s[key] if s[key] is not None else float("nan") for s in series], label=label)
    bottom.set_yscale("log")
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel("second of the measured window (by scheduled send time)")
    bottom.legend(loc="upper left", fontsize=8)
    bottom.grid(True, which="both", lw=0.3)
    path = stem.parent / f"{stem.name}-time.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    paths.append(path)
    return paths


def plot_sweep(results: list[RunResult], stem: Path, title: str) -> Path:
    """Latency percentiles against achieved throughput, one point per run."""
    ordered = sorted(results, key=lambda r: r.rate)
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [r.throughput for r in ordered]
    for key in ("p50", "p99", "p99.9"):
        ax.plot(xs, [r.percentiles_ms()[key] for r in ordered], marker="o", label=key)
    ax.set_yscale("log")
    ax.set_xlabel("achieved throughput (requests/s)")
    ax.set_ylabel("latency (ms)")
    ax.axhline(1000, color="red", lw=0.6, ls="--", label="1 s")
    ax.set_title(f"{title}: latency vs throughput")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", lw=0.3)
    path = stem.parent / f"{stem.name}-sweep.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
