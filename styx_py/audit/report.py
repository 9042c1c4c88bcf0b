"""The audit report: ``report.md`` with the verdict of every check, the first findings of each, the
analytics tables, and PNG plots (matplotlib, headless) next to it in ``plots/``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot

import matplotlib.pyplot as plt
import pandas as pd

from styx_py.audit.rules import ERROR, WARNING, Finding

MAX_TABLE_ROWS = 30


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(df: pd.DataFrame, max_rows: int = MAX_TABLE_ROWS) -> str:
    if df.empty:
        return "_(no rows)_\n"
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.head(max_rows).itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    if len(df) > max_rows:
        lines.append(f"\n_{len(df) - max_rows} more rows in the Parquet table._")
    return "\n".join(lines) + "\n"


def _save(fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name


def plot_all(tables: Mapping[str, pd.DataFrame], plots: Path) -> dict[str, str]:
    """Every plot the data allows; returns title -> file name."""
    out: dict[str, str] = {}
    sec = tables["per_second"]
    if not sec.empty:
        t = sec["second"] - sec["second"].min()
        fig, ax = plt.subplots(figsize=(8, 3.5))
        bottom = None
        for status in ("committed", "aborted", "failed"):
            ax.bar(t, sec[status], bottom=bottom, label=status, width=1.0)
            bottom = sec[status] if bottom is None else bottom + sec[status]
        ax.set_xlabel("second of the run")
        ax.set_ylabel("replies / s")
        ax.set_title("Throughput")
        ax.legend()
        out["Throughput over time"] = _save(fig, plots / "throughput.png")

        fig, ax = plt.subplots(figsize=(8, 3.5))
        for col in ("p50_ms", "p95_ms", "p99_ms"):
            ax.plot(t, sec[col], label=col.removesuffix("_ms"))
        ax.set_yscale("log")
        ax.set_xlabel("second of the run")
        ax.set_ylabel("latency (ms)")
        ax.set_title("Latency per second (send → reply on the egress log)")
        ax.legend()
        out["Latency over time"] = _save(fig, plots / "latency.png")

    fn = tables["latency_by_function"]
    if not fn.empty:
        labels = [f"{o}.{f}" for o, f in zip(fn["operator"], fn["function"], strict=True)]
        fig, ax = plt.subplots(figsize=(8, 0.6 + 0.45 * len(labels)))
        y = range(len(labels))
        ax.barh([i + 0.2 for i in y], fn["p99_ms"], height=0.4, label="p99")
        ax.barh([i - 0.2 for i in y], fn["p50_ms"], height=0.4, label="p50")
        ax.set_yticks(list(y), labels)
        ax.set_xlabel("latency (ms)")
        ax.set_title("Latency per function")
        ax.legend()
        out["Latency per function"] = _save(fig, plots / "latency_by_function.png")

    causes = tables["abort_causes"].head(10)
    if not causes.empty:
        labels = [c if len(c) <= 60 else c[:59] + "…" for c in causes["cause"].astype(str)]
        fig, ax = plt.subplots(figsize=(8, 0.6 + 0.45 * len(labels)))
        ax.barh(range(len(labels)), causes["replies"])
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        ax.set_xlabel("replies")
        ax.set_title("Aborts and failures by cause")
        out["Abort causes"] = _save(fig, plots / "abort_causes.png")

    epochs = tables["epochs"]
    if not epochs.empty:
        fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
        a1.plot(epochs["epoch"], epochs["transactions"], lw=0.8)
        a1.set_ylabel("transactions")
        a1.set_title("Epoch sizes and durations (sequencer log)")
        a2.plot(epochs["epoch"], epochs["duration_ms"], lw=0.8)
        a2.set_ylabel("duration (ms)")
        a2.set_xlabel("epoch")
        out["Epochs"] = _save(fig, plots / "epochs.png")
    return out


def write_report(
    out: Path,
    ok: bool,
    counts: Mapping[str, Mapping[str, int]],
    samples: Sequence[Finding],
    stats: Mapping[str, Any],
    tables: Mapping[str, pd.DataFrame],
    timings_s: Mapping[str, float],
    checks: Mapping[str, str],
) -> Path:
    plots = plot_all(tables, out / "plots")
    lines = [
        "# styx-py audit",
        "",
        f"**{'PASSED' if ok else 'FAILED'}** — {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC",
        "",
        "## Inputs",
        "",
        f"- Kafka `{stats['kafka']}`: "
        + ", ".join(
            f"{kind} `{topic}` ({stats['records'][kind]} records)" for kind, topic in stats["topics"].items()
        ),
        f"- request ids: {stats.get('request_ids', 0)}; answered: {stats.get('replies', 0)}",
        f"- generations: {stats.get('generations', '')}; "
        f"workers per generation: {stats.get('workers_by_generation', {})}",
    ]
    snap = stats.get("snapshot")
    lines.append(
        f"- snapshot: epoch {snap['epoch']}, {snap['entities']} entities" if snap else "- snapshot: none read"
    )
    lines += [
        "",
        "## Checks",
        "",
        "| check | what it verifies | errors | warnings | verdict |",
        "|---|---|---|---|---|",
    ]
    names = sorted(set(checks) | set(counts))
    for name in names:
        by = counts.get(name, {})
        errors, warnings = by.get(ERROR, 0), by.get(WARNING, 0)
        what = checks.get(name) or checks.get(name.split(".")[0], "")
        verdict = "FAIL" if errors else ("pass (warnings)" if warnings else "pass")
        lines.append(f"| `{name}` | {what} | {errors} | {warnings} | {verdict} |")
    if samples:
        lines += [
            "",
            "## Findings",
            "",
            "The first findings of each check (all of them: `tables/findings.parquet`).",
            "",
        ]
        for f in samples:
            lines.append(f"- **{f.severity}** `{f.check}` ({_cell(f.subject)}): {_cell(f.message)}")
    lines += ["", "## Analytics", ""]
    titles = {
        "status": "Replies by status",
        "latency_by_function": "Latency per function (ms, client send time → reply on the egress log)",
        "abort_causes": "Aborts and failures by cause (numbers in messages replaced by N)",
        "per_second": "Per second",
        "epochs": "Epochs",
    }
    for name, title in titles.items():
        lines += [f"### {title}", "", markdown_table(tables[name]), ""]
    if not tables["epochs"].empty:
        e = tables["epochs"]
        lines += [
            f"Epochs: {len(e)}; transactions per epoch mean {e['transactions'].mean():.1f}, max "
            f"{e['transactions'].max()}; duration p50 {e['duration_ms'].median():.1f} ms, p99 "
            f"{e['duration_ms'].quantile(0.99):.1f} ms.",
            "",
        ]
    if plots:
        lines += ["## Plots", ""]
        for title, name in plots.items():
            lines += [f"### {title}", "", f"![{title}](plots/{name})", ""]
    lines += ["## Audit stages (s)", "", " · ".join(f"{k} {v}" for k, v in timings_s.items()), ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
