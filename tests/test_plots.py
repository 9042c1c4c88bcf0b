"""The benchmark plots (styx_benchmarks.plots), drawn from result documents without running anything:
the sweep's x axis is the offered rate, over-time plots draw what was committed (not the offered
rate), latency is plotted by percentile on a "nines" axis with plain millisecond ticks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure

from styx_benchmarks.driver import RunResult, new_histogram
from styx_benchmarks.plots import (
    nines,
    over_time_figure,
    percentiles_figure,
    plot_document,
    stored_curve,
    sweep_figure,
)


def sweep_run(rate: float, achieved: float, p99: float, ok: bool) -> dict[str, Any]:
    return {
        "rate": rate,
        "throughput": achieved,
        "latency_ms": {"p50": p99 / 3, "p90": p99 / 2, "p99": p99, "p99.9": p99 * 1.2, "max": p99 * 1.5},
        "sustainable_p99_1s": ok,
    }


def tick_labels(fig: Figure, axis: int, which: str = "y") -> list[str]:
    fig.canvas.draw()
    ax = fig.axes[axis]
    ticks = ax.get_yticklabels() if which == "y" else ax.get_xticklabels()
    return [t.get_text() for t in ticks if t.get_text()]


def test_nines_axis() -> None:
    assert [round(nines(p), 6) for p in (0, 90, 99, 99.9, 99.99)] == [0, 1, 2, 3, 4]


def test_sweep_puts_the_offered_rate_on_x_with_the_achieved_rate_beside_it() -> None:
    # Overload: 3000/s offered, 2000/s served. Against achieved throughput the line would fold back.
    runs = [
        sweep_run(3000, 2000, 9000, False),
        sweep_run(1000, 1000, 50, True),
        sweep_run(2000, 1990, 80, True),
    ]
    fig = sweep_figure(runs, "t")
    latency, achieved = fig.axes
    assert [list(line.get_xdata()) for line in latency.lines[:3]] == [[1000, 2000, 3000]] * 3
    assert latency.get_xlabel() == "offered rate (requests/s)"
    served = next(line for line in achieved.lines if line.get_label().startswith("achieved ("))
    assert list(served.get_xdata()) == [1000, 2000, 3000] and list(served.get_ydata()) == [1000, 1990, 2000]
    labels = tick_labels(fig, 0)
    assert "1000" in labels and not any("^" in t or "e+" in t for t in labels), labels


def test_over_time_draws_committed_replies_not_the_offered_rate() -> None:
    series = [
        {
            "second": i,
            "scheduled": 100,
            "committed": 100,
            "aborted": 0,
            "failed": 0,
            "errors": 0,
            "replies_arrived": r,
            "committed_arrived": c,
            "p50_ms": 10.0,
            "p99_ms": 20.0,
            "max_ms": 30.0,
        }
        for i, (r, c) in enumerate([(60, 50), (100, 90), (140, 130)])
    ]
    fig = over_time_figure({"result": {"rate": 100.0}, "series": series}, "t")
    lines = {line.get_label(): list(line.get_ydata()) for line in fig.axes[0].lines}
    assert lines["committed/s (replies arriving)"] == [50, 90, 130]
    assert lines["aborted or failed/s (arriving)"] == [10, 10, 10]
    assert lines["offered rate"] == [100.0, 100.0]  # a dashed reference, named for what it is


def test_percentile_plot_from_a_run_in_memory_and_from_stored_percentiles() -> None:
    result = RunResult(rate=100, duration_s=1, warmup_s=0, answered=10_000)
    result.hist = new_histogram()
    for us in range(1, 10_001):
        result.hist.record_value(us * 100)  # 0.1 ms … 1000 ms, uniform
    curve = result.latency_curve_ms()["all"]
    assert curve[0][0] == 0.0 and curve[-1] == (99.99, pytest.approx(1000, rel=1e-3))
    assert [p for p, _ in curve] == sorted(p for p, _ in curve)
    fig = percentiles_figure({"result": result.summary(), "latency_curve_ms": {"all": curve}}, "t")
    assert fig is not None
    assert tick_labels(fig, 0, "x") == ["0", "90", "99", "99.9", "99.99"]
    stored = stored_curve({"p50": 5.0, "p99": 9.0, "max": 12.0}, count=1000)
    assert stored == [(50.0, 5.0), (99.0, 9.0), (99.9, 12.0)]  # the max where 1 in 1000 lies


def test_plot_document_redraws_run_and_sweep_files(tmp_path: Path) -> None:
    sweep = tmp_path / "x-sweep-1.json"
    sweep.write_text(json.dumps({"config": {"workload": "x"}, "runs": [sweep_run(100, 100, 20, True)]}))
    run = tmp_path / "x-100-1.json"
    doc = {
        "config": {"workload": "x"},
        "result": {"rate": 100.0, "answered": 100, "latency_ms": {"p50": 5.0, "p99": 9.0, "max": 12.0}},
        "series": [{"second": 0, "replies_arrived": 100, "p50_ms": 5.0, "p99_ms": 9.0, "max_ms": 12.0}],
    }
    run.write_text(json.dumps(doc))
    other = tmp_path / "recovery.json"
    other.write_text("[1, 2]")
    assert [p.name for p in plot_document(sweep)] == ["x-sweep-1-sweep.png"]
    assert [p.name for p in plot_document(run)] == ["x-100-1-time.png", "x-100-1-latency.png"]
    assert plot_document(other) == []
    assert all(p.stat().st_size > 0 for p in tmp_path.glob("*.png"))
