"""The audit report: the verdict of every check (FAIL, skipped with its reason, pass), the first findings
of each, the analytics tables and the plots, as ``report.md`` (plots next to it in ``plots/``), as
``report.json`` (the verdicts, the inputs and what the checks counted) and as
``report.html``, one self-contained file (plots inline as base64 PNG, styles inline, no other host)."""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import MaxNLocator

from styx_benchmarks.plots import plain_ms_axis
from styx_py.audit.effects_rules import TALLY
from styx_py.audit.rules import SKIPPED, Finding, Verdict, verdicts

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
        t = sec["t_s"]
        checks = sec.get("check_replies")
        two = checks is not None and bool(checks.sum())
        fig, axes = plt.subplots(
            2 if two else 1,
            1,
            figsize=(8, 5 if two else 3.5),
            sharex=True,
            squeeze=False,
            gridspec_kw={"height_ratios": [3, 1.4]} if two else None,
        )
        ax = axes[0][0]
        bottom = None
        for status in ("committed", "aborted", "failed"):
            ax.bar(t, sec[status], bottom=bottom, label=status, width=1.0)
            bottom = sec[status] if bottom is None else bottom + sec[status]
        total = sec["committed"] + sec["aborted"] + sec["failed"]
        ax.set_ylim(0, max(1.0, float(total.max())) * 1.12)  # room for the legend above the bars
        ax.set_ylabel("replies / s")
        ax.set_title("Throughput of the workload (replies by status, per second)")
        ax.legend(fontsize=8)
        if two:
            assert checks is not None
            low = axes[1][0]
            low.bar(t, checks, width=1.0, color="grey")
            low.set_ylabel("replies / s")
            low.set_title("The checks' own reads (request ids 'check-…'), not in the plot above", fontsize=9)
        axes[-1][0].set_xlabel("seconds since the run's start (by reply time)")
        axes[-1][0].xaxis.set_major_locator(MaxNLocator(integer=True))
        out["Throughput over time"] = _save(fig, plots / "throughput.png")

        fig, ax = plt.subplots(figsize=(8, 3.5))
        for col in ("p50_ms", "p95_ms", "p99_ms"):
            ax.plot(t, sec[col], label=col.removesuffix("_ms"))
        plain_ms_axis(ax)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("seconds since the run's start (by reply time)")
        ax.set_title("Workload latency per second (send → reply on the egress log)")
        ax.legend(fontsize=8)
        out["Latency over time"] = _save(fig, plots / "latency.png")

    fn = tables["latency_by_function"]
    if "traffic" in fn:
        fn = fn[fn["traffic"] != "check"]
    if not fn.empty:
        labels = [f"{o}.{f}" for o, f in zip(fn["operator"], fn["function"], strict=True)]
        fig, ax = plt.subplots(figsize=(8, 1.6 + 0.45 * len(labels)))
        y = range(len(labels))
        ax.barh([i + 0.2 for i in y], fn["p99_ms"], height=0.4, label="p99")
        ax.barh([i - 0.2 for i in y], fn["p50_ms"], height=0.4, label="p50")
        ax.set_yticks(list(y), labels)
        ax.set_xlabel("latency (ms)")
        ax.set_title("Workload latency per function")
        ax.legend()
        out["Latency per function"] = _save(fig, plots / "latency_by_function.png")

    causes = tables["abort_causes"].head(10)
    if not causes.empty:
        labels = [c if len(c) <= 60 else c[:59] + "…" for c in causes["cause"].astype(str)]
        fig, ax = plt.subplots(figsize=(8, 1.6 + 0.45 * len(labels)))
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


TABLE_TITLES = {
    "status": "Replies by traffic and status",
    "latency_by_function": "Latency per function (ms, client send time → reply on the egress log)",
    "abort_causes": "Aborts and failures by cause (numbers in messages replaced by N)",
    "per_second": "Per second of the run (workload; check_replies: the checks' own reads)",
    "epochs": "Epochs",
}


@dataclass(frozen=True)
class Report:
    """Everything a report shows, rendered as Markdown or HTML."""

    ok: bool
    created: str
    inputs: list[str]
    checks: list[Verdict]
    samples: Sequence[Finding]
    tables: Mapping[str, pd.DataFrame]
    notes: list[str]
    plots: Mapping[str, str]  # title -> file name in plots/
    timings_s: Mapping[str, float]

    @property
    def headline(self) -> str:
        return headline(self.ok, self.checks)


def headline(ok: bool, checks: Sequence[Verdict]) -> str:
    """``PASSED — all 12 checks passed`` or ``FAILED — 9 of 12 checks passed, 1 failed, 2 skipped (…)``."""
    failed = [v.check for v in checks if v.verdict == "FAIL"]
    skipped = [v.check for v in checks if v.verdict == "skipped"]
    word = "PASSED" if ok else "FAILED"
    if not failed and not skipped:
        return f"{word} — all {len(checks)} checks passed"
    text = f"{word} — {len(checks) - len(failed) - len(skipped)} of {len(checks)} checks passed"
    if failed:
        text += f", {len(failed)} failed"
    if skipped:
        text += f", {len(skipped)} skipped ({', '.join(skipped)})"
    return text


def input_lines(stats: Mapping[str, Any]) -> list[str]:
    lines = [
        f"Kafka {stats['kafka']}: "
        + ", ".join(
            f"{kind} {topic} ({stats['records'][kind]} records)" for kind, topic in stats["topics"].items()
        ),
        f"request ids: {stats.get('request_ids', 0)}; answered: {stats.get('replies', 0)}, of which "
        f"{stats.get('check_replies', 0)} the checks' own reads (ids 'check-…')",
        f"run start (first ingress record): {stats.get('run_start') or 'unknown'}",
        f"generations: {stats.get('generations', '')}; workers per generation: "
        f"{stats.get('workers_by_generation', {})}",
    ]
    effects = stats.get("checked", {}).get(TALLY)
    if effects:
        lines.append(
            f"external calls and timers checked: {effects['intents']} intents, {effects['responses']} "
            f"responses, {effects['continuations']} continuations run and "
            f"{effects['continuations_failed']} failed, {effects['timers']} timers set, "
            f"{effects['timers_fired']} fired"
        )
    snap = stats.get("snapshot")
    lines.append(
        f"snapshot: epoch {snap['epoch']}, {snap['entities']} entities" if snap else "snapshot: none read"
    )
    return lines


def _md_code(text: str) -> str:
    return f"`{text}`"


def render_markdown(r: Report) -> str:
    lines = ["# styx-py audit", "", f"**{r.headline}** — {r.created}", "", "## Inputs", ""]
    lines += [f"- {_cell(line)}" for line in r.inputs]
    lines += [
        "",
        "## Checks",
        "",
        "| check | what it verifies | errors | warnings | verdict |",
        "|---|---|---|---|---|",
    ]
    for v in r.checks:
        verdict = f"skipped: {_cell(v.reason)}" if v.verdict == "skipped" else v.verdict
        lines.append(f"| {_md_code(v.check)} | {v.what} | {v.errors} | {v.warnings} | {verdict} |")
    shown = [f for f in r.samples if f.severity != SKIPPED]
    if shown:
        lines += [
            "",
            "## Findings",
            "",
            "The first findings of each check (all of them: `tables/findings.parquet`).",
            "",
        ]
        lines += [f"- **{f.severity}** `{f.check}` ({_cell(f.subject)}): {_cell(f.message)}" for f in shown]
    lines += ["", "## Analytics", ""]
    for name, title in TABLE_TITLES.items():
        lines += [f"### {title}", "", markdown_table(r.tables[name]), ""]
    lines += [n + "\n" for n in r.notes]
    if r.plots:
        lines += ["## Plots", ""]
        for title, name in r.plots.items():
            lines += [f"### {title}", "", f"![{title}](plots/{name})", ""]
    lines += ["## Audit stages (s)", "", " · ".join(f"{k} {v}" for k, v in r.timings_s.items()), ""]
    return "\n".join(lines)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; padding: 0 1em; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.6em; }
.verdict { font-size: 1.2em; padding: 0.4em 0.8em; border-radius: 4px; display: inline-block; }
.passed { background: #e3f5e1; color: #1a5e20; } .failed { background: #fde2e1; color: #8a1c1c; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.FAIL td.v { background: #fde2e1; font-weight: bold; } tr.skipped td.v { background: #fff4d6; }
tr.pass td.v { color: #1a5e20; } code { background: #f3f3f3; padding: 0 0.2em; }
img { max-width: 100%; border: 1px solid #eee; } .more { color: #666; font-style: italic; }
"""


def _html_table(df: pd.DataFrame, max_rows: int = MAX_TABLE_ROWS) -> str:
    if df.empty:
        return '<p class="more">(no rows)</p>'
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = []
    for row in df.head(max_rows).itertuples(index=False):
        cells = []
        for v in row:
            num = isinstance(v, int | float) and not isinstance(v, bool)
            cells.append(
                f"<td{' class=num' if num else ''}>{html.escape(_cell(v).replace(chr(92) + '|', '|'))}</td>"
            )
        rows.append("<tr>" + "".join(cells) + "</tr>")
    more = (
        f'<p class="more">{len(df) - max_rows} more rows in the Parquet table.</p>'
        if len(df) > max_rows
        else ""
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{more}"


def render_html(r: Report, plots_dir: Path) -> str:
    """One self-contained page: styles inline, plots as base64 PNG data URIs, no link to any host."""
    e = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>styx-py audit</title>',
        f"<style>{_CSS}</style></head><body>",
        "<h1>styx-py audit</h1>",
        f'<p><span class="verdict {"passed" if r.ok else "failed"}">{e(r.headline)}</span> '
        f"{e(r.created)}</p>",
        "<h2>Inputs</h2><ul>" + "".join(f"<li>{e(line)}</li>" for line in r.inputs) + "</ul>",
        "<h2>Checks</h2><table><thead><tr><th>check</th><th>what it verifies</th><th>errors</th>"
        "<th>warnings</th><th>verdict</th></tr></thead><tbody>",
    ]
    for v in r.checks:
        verdict = f"skipped: {v.reason}" if v.verdict == "skipped" else v.verdict
        css = v.verdict.split(" ")[0]
        out.append(
            f'<tr class="{e(css)}"><td><code>{e(v.check)}</code></td><td>{e(v.what)}</td>'
            f'<td class="num">{v.errors}</td><td class="num">{v.warnings}</td>'
            f'<td class="v">{e(verdict)}</td></tr>'
        )
    out.append("</tbody></table>")
    shown = [f for f in r.samples if f.severity != SKIPPED]
    if shown:
        out.append(
            "<h2>Findings</h2><p>The first findings of each check "
            "(all of them: <code>tables/findings.parquet</code>).</p><ul>"
        )
        out += [
            f"<li><b>{e(f.severity)}</b> <code>{e(f.check)}</code> ({e(f.subject)}): {e(f.message)}</li>"
            for f in shown
        ]
        out.append("</ul>")
    if r.plots:
        out.append("<h2>Plots</h2>")
        for title, name in r.plots.items():
            data = base64.b64encode((plots_dir / name).read_bytes()).decode("ascii")
            out.append(f'<h3>{e(title)}</h3><img alt="{e(title)}" src="data:image/png;base64,{data}">')
    out.append("<h2>Analytics</h2>")
    for name, title in TABLE_TITLES.items():
        out += [f"<h3>{e(title)}</h3>", _html_table(r.tables[name])]
    out += [f"<p>{e(n)}</p>" for n in r.notes]
    out.append(
        "<h2>Audit stages (s)</h2><p>" + e(" · ".join(f"{k} {v}" for k, v in r.timings_s.items())) + "</p>"
    )
    out.append("</body></html>")
    return "\n".join(out)


def write_report(
    out: Path,
    ok: bool,
    counts: Mapping[str, Mapping[str, int]],
    samples: Sequence[Finding],
    stats: Mapping[str, Any],
    tables: Mapping[str, pd.DataFrame],
    timings_s: Mapping[str, float],
    checks: Mapping[str, str],
) -> tuple[Path, Path]:
    """Write ``report.md`` (with ``plots/*.png``) and the self-contained ``report.html``; their paths."""
    notes: list[str] = []
    e = tables["epochs"]
    if not e.empty:
        notes.append(
            f"Epochs: {len(e)}; transactions per epoch mean {e['transactions'].mean():.1f}, max "
            f"{e['transactions'].max()}; duration p50 {e['duration_ms'].median():.1f} ms, p99 "
            f"{e['duration_ms'].quantile(0.99):.1f} ms."
        )
    report = Report(
        ok=ok,
        created=f"{datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC",
        inputs=input_lines(stats),
        checks=verdicts(checks, counts, samples),
        samples=samples,
        tables=tables,
        notes=notes,
        plots=plot_all(tables, out / "plots"),
        timings_s=timings_s,
    )
    md, page = out / "report.md", out / "report.html"
    summary = {
        "ok": ok,
        "created": report.created,
        "checks": [dataclasses.asdict(v) for v in report.checks],
        "checked": dict(stats.get("checked", {})),
        "inputs": report.inputs,
    }
    (out / "report.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    md.write_text(render_markdown(report))
    page.write_text(render_html(report, out / "plots"))
    return md, page
