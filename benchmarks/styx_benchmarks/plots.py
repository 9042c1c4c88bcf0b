"""PNG plots of benchmark runs (matplotlib, headless), drawn from the result JSON documents.

* ``<run>-latency.png`` — latency by percentile, HDR style: x is the percentile on a "nines" scale
  (0, 90, 99, 99.9, 99.99: each step ten times rarer), y the latency in plain milliseconds;
* ``<run>-time.png`` — what was committed each second (by reply arrival) against the offered rate,
  and latency per second (by scheduled send time);
* ``<sweep>-sweep.png`` — latency percentiles against the **offered** rate (the x axis a run is
  chosen by, so an overloaded run stays to the right of the others), with the achieved rate beside it.
* ``scaling-sim.png`` — the scaling simulation (``styx_benchmarks.scaling_sim``): one epoch's latency,
  epochs per second and report messages per epoch against workers, per model and topology.

Every plot is drawn from what a result file holds, so ``python -m styx_benchmarks.plots
benchmarks/results/*.json`` redraws them without running anything again. Files written before the
percentile curve was stored (``latency_curve_ms``) are drawn from their stored percentiles (p50, p90,
p99, p99.9 and the maximum).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from styx_benchmarks.driver import RunResult

NINES_TICKS = (0.0, 90.0, 99.0, 99.9, 99.99, 99.999)
SUSTAINABLE_P99_MS = 1000.0


def nines(percentile: float) -> float:
    """Position of a percentile on the HDR x axis: 0 → 0, 90 → 1, 99 → 2, 99.9 → 3, …"""
    return -math.log10(max(1e-9, 1.0 - percentile / 100.0))


def _plain(value: float, _pos: object = None) -> str:
    return f"{value:g}"


def plain_ms_axis(ax: Axes, log: bool = True) -> None:
    """Latency in plain milliseconds (20, 50, 100, 1000), never 10^2: a log scale with 1-2-5 ticks
    (1-2-3-5 within a decade)."""
    if log:  # call it after plotting: the tick density follows the data's range
        ax.set_yscale("log")
        lo, hi = ax.get_ylim()
        narrow = hi < 10 * max(lo, 1e-9)  # under a decade: 1-2-3-5 ticks, else too few labels
        ax.yaxis.set_major_locator(
            LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0) if narrow else (1.0, 2.0, 5.0))
        )
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(_plain))
    ax.set_ylabel("latency (ms)")


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---- from the result documents ------------------------------------------------------------------


def stored_curve(latency_ms: Mapping[str, float], count: int) -> list[tuple[float, float]]:
    """The (percentile, ms) points a result keeps when it has no curve: p50 … p99.9, then the maximum
    at 100·(1 - 1/count), where the largest of ``count`` samples sits."""
    points = [(float(k[1:]), v) for k, v in latency_ms.items() if k.startswith("p") and v is not None]
    points = [(p, v) for p, v in points if not math.isnan(v)]
    top = latency_ms.get("max")
    if top is not None and count > 1 and not math.isnan(top):
        points.append((100.0 * (1.0 - 1.0 / count), top))
    return sorted(points)


def plot_percentiles(doc: Mapping[str, Any], path: Path, title: str) -> Path | None:
    """Latency by percentile (HDR style), overall and per request kind (None: no latency recorded)."""
    fig = percentiles_figure(doc, title)
    return None if fig is None else _save(fig, path)


def percentiles_figure(doc: Mapping[str, Any], title: str) -> Figure | None:
    result = doc["result"]
    curves: Mapping[str, Sequence[Sequence[float]]] = doc.get("latency_curve_ms") or {}
    lines: dict[str, list[tuple[float, float]]] = {}
    if curves:
        lines = {label: [(p, ms) for p, ms in pts] for label, pts in curves.items() if pts}
    else:
        lines["all"] = stored_curve(result["latency_ms"], result.get("answered", 0))
        by_label = result.get("latency_ms_by_label") or {}
        if len(by_label) > 1:
            for label, lat in by_label.items():
                lines[label] = stored_curve(lat, lat.get("count", 0))
    lines = {k: v for k, v in lines.items() if v}
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    top = 0.0
    for label, pts in lines.items():
        xs = [nines(p) for p, _ in pts]
        top = max(top, *xs)
        style = {"lw": 2.0, "color": "black"} if label == "all" else {"lw": 1.0}
        ax.plot(xs, [ms for _, ms in pts], marker="." if not curves else None, label=label, **style)
    ticks = [t for t in NINES_TICKS if nines(t) <= max(top, 2.0) + 0.01]
    ax.set_xticks([nines(t) for t in ticks], [f"{t:g}" for t in ticks])
    ax.set_xlim(0, max(top, 2.0) * 1.02)
    ax.set_xlabel("percentile (from scheduled send)")
    plain_ms_axis(ax)
    if max(ms for pts in lines.values() for _, ms in pts) >= SUSTAINABLE_P99_MS / 2:
        ax.axhline(SUSTAINABLE_P99_MS, color="red", lw=0.6, ls="--", label="1 s")
    ax.set_title(f"{title}: latency by percentile")
    ax.grid(True, which="major", lw=0.3)
    ax.legend(fontsize=8, loc="best")
    return fig


def plot_over_time(doc: Mapping[str, Any], path: Path, title: str) -> Path:
    """Committed replies per second (by arrival) against the offered rate; latency per second."""
    return _save(over_time_figure(doc, title), path)


def over_time_figure(doc: Mapping[str, Any], title: str) -> Figure:
    result, series = doc["result"], doc["series"]
    secs = [s["second"] for s in series]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    if all("committed_arrived" in s for s in series):
        top.plot(secs, [s["committed_arrived"] for s in series], label="committed/s (replies arriving)")
        failed = [s["replies_arrived"] - s["committed_arrived"] for s in series]
        if any(failed):
            top.plot(secs, failed, label="aborted or failed/s (arriving)")
    else:  # files written before committed replies were counted by arrival
        top.plot(secs, [s["replies_arrived"] for s in series], label="replies/s (arriving, any status)")
    errors = [s.get("errors", 0) for s in series]
    if any(errors):
        top.plot(secs, errors, label="no reply (by send second)", color="red")
    top.axhline(result["rate"], color="grey", lw=0.8, ls="--", label="offered rate")
    top.set_ylim(bottom=0)
    top.yaxis.set_major_formatter(FuncFormatter(_plain))
    top.set_ylabel("per second")
    top.legend(loc="lower right", fontsize=8)
    top.set_title(f"{title}: throughput and latency over time")
    for key, label in (("p50_ms", "p50"), ("p99_ms", "p99"), ("max_ms", "max")):
        bottom.plot(secs, [s[key] if s[key] is not None else math.nan for s in series], label=label)
    plain_ms_axis(bottom)
    bottom.set_xlabel("second of the measured window (latency by scheduled send time)")
    bottom.legend(loc="upper left", fontsize=8)
    bottom.grid(True, which="major", lw=0.3)
    return fig


def plot_sweep_runs(runs: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path:
    """Left: latency percentiles against the offered rate. Right: achieved against offered rate.
    Runs that were not sustainable (p99 ≥ 1 s, < 98 % served or unanswered requests) are hollow."""
    return _save(sweep_figure(runs, title), path)


def sweep_figure(runs: Sequence[Mapping[str, Any]], title: str) -> Figure:
    ordered = sorted(runs, key=lambda r: r["rate"])
    rates = [r["rate"] for r in ordered]
    ok = [bool(r.get("sustainable_p99_1s")) for r in ordered]
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    for key, color in (("p50", "C0"), ("p99", "C1"), ("p99.9", "C2")):
        ys = [r["latency_ms"].get(key, math.nan) for r in ordered]
        lat.plot(rates, ys, color=color, label=key)
        lat.scatter(rates, ys, color=color, zorder=3, facecolors=[color if s else "white" for s in ok], s=28)
    plain_ms_axis(lat)
    lat.axhline(SUSTAINABLE_P99_MS, color="red", lw=0.6, ls="--", label="1 s")
    lat.set_xlabel("offered rate (requests/s)")
    lat.set_title(f"{title}: latency vs offered rate")
    lat.grid(True, which="major", lw=0.3)
    lat.legend(fontsize=8, loc="upper left")
    lat.xaxis.set_major_formatter(FuncFormatter(_plain))

    achieved = [r["throughput"] for r in ordered]
    top = max([*rates, *achieved]) * 1.05
    thr.plot([0, top], [0, top], color="grey", lw=0.8, ls="--", label="achieved = offered")
    thr.plot(rates, achieved, color="C3", label="achieved (answered/s)")
    thr.scatter(rates, achieved, color="C3", zorder=3, facecolors=["C3" if s else "white" for s in ok], s=28)
    thr.set_xlim(0, top)
    thr.set_ylim(0, top)
    thr.set_xlabel("offered rate (requests/s)")
    thr.set_ylabel("achieved rate (requests/s)")
    thr.set_title("achieved vs offered rate")
    thr.grid(True, lw=0.3)
    thr.legend(fontsize=8, loc="upper left")
    for axis in (thr.xaxis, thr.yaxis):
        axis.set_major_formatter(FuncFormatter(_plain))
    return fig


def plot_document(path: Path) -> list[Path]:
    """Redraw the plots of one result file (a run or a sweep); other JSON files are left alone."""
    doc = json.loads(path.read_text())
    stem = path.with_suffix("")
    name = doc.get("config", {}).get("workload", stem.name) if isinstance(doc, dict) else stem.name
    if isinstance(doc, dict) and "series" in doc and "result" in doc:
        title = f"{name} @ {doc['result']['rate']:g}/s"
        out = [plot_over_time(doc, stem.parent / f"{stem.name}-time.png", title)]
        latency = plot_percentiles(doc, stem.parent / f"{stem.name}-latency.png", title)
        return out + ([latency] if latency is not None else [])
    if isinstance(doc, dict) and doc.get("runs") and "rate" in doc["runs"][0]:
        return [plot_sweep_runs(doc["runs"], stem.parent / f"{stem.name}-sweep.png", f"{name} sweep")]
    if isinstance(doc, dict) and doc.get("benchmark") == "scaling_sim":
        return [plot_scaling(doc, stem.parent / f"{stem.name}.png")]
    return []


TOPOLOGY_COLORS = {"all-to-all": "C0", "relay": "C3", "tree": "C2"}


def plot_scaling(doc: Mapping[str, Any], path: Path) -> Path:
    """``scaling-sim.png`` (styx_benchmarks.scaling_sim): epoch latency, epochs per second and report
    messages per epoch against workers; colour by topology, dashed without the CPU model."""
    fig, (lat, rate, msgs) = plt.subplots(1, 3, figsize=(14, 4.2))
    ns = doc["config"]["workers"]
    for name in doc["config"]["models"]:
        rows = [r for r in doc["runs"] if r["model"] == name]
        xs = [r["workers"] for r in rows]
        cost, _, topology = name.partition("-")
        color = TOPOLOGY_COLORS[topology or "all-to-all"]
        style = {"marker": "o", "color": color, "label": name, "ls": "-" if cost == "cpu" else "--"}
        lat.plot(xs, [r["epoch_latency_ms"]["p50"] for r in rows], **style)
        rate.plot(xs, [r["epochs_per_s"] for r in rows], **style)
        if cost == "network":  # the counts do not depend on the CPU model
            counts = [r["report_messages_per_epoch"] for r in rows]
            msgs.plot(xs, counts, marker="o", color=color, label=topology or "all-to-all")
    msgs.plot(ns, [2 * n * n - n for n in ns], color="black", lw=1.5, ls=":", label="2n² - n")
    msgs.plot(ns, [4 * n for n in ns], color="grey", lw=1.5, ls=":", label="4n")
    lat.set_title("one epoch's latency, p50 (virtual ms)")
    rate.set_title("epochs per second (virtual)")
    msgs.set_title("report messages per epoch")
    for ax in (lat, rate, msgs):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("workers")
        ax.grid(True, which="major", lw=0.3)
        ax.legend(fontsize="small")
    msgs.set_yscale("log")
    return _save(fig, path)


# ---- from a run in memory (styx bench) ----------------------------------------------------------


def run_document(result: RunResult) -> dict[str, Any]:
    """What :func:`plot_document` reads, for a run in memory (the same keys as the result file)."""
    return {
        "result": result.summary(),
        "series": result.series(),
        "latency_curve_ms": result.latency_curve_ms(),
    }


def plot_run(result: RunResult, stem: Path, title: str) -> list[Path]:
    """``<stem>-latency.png`` (latency by percentile) and ``<stem>-time.png`` (throughput and latency
    per second)."""
    doc = run_document(result)
    paths = [plot_over_time(doc, stem.parent / f"{stem.name}-time.png", title)]
    latency = plot_percentiles(doc, stem.parent / f"{stem.name}-latency.png", title)
    return paths + ([latency] if latency is not None else [])


def plot_sweep(results: list[RunResult], stem: Path, title: str) -> Path:
    """Latency percentiles and achieved rate against the offered rate, one point per run."""
    return plot_sweep_runs([r.summary() for r in results], stem.parent / f"{stem.name}-sweep.png", title)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m styx_benchmarks.plots", description="redraw the plots of benchmark result files"
    )
    p.add_argument("files", nargs="+", type=Path, help="result JSON files (runs and sweeps)")
    for path in p.parse_args(argv).files:
        for png in plot_document(path):
            print(png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
