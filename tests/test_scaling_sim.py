"""The scaling simulation (benchmarks/styx_benchmarks/scaling_sim.py) on 2 and 4 workers: the epoch
protocol's messages per epoch follow the all-to-all formula, and a seed's numbers repeat exactly."""

from __future__ import annotations

import argparse

import pytest

from styx_benchmarks.scaling_sim import measure


def _args(seed: int = 1) -> argparse.Namespace:
    return argparse.Namespace(seed=seed, hop_us=(100, 500), per_worker=2, epochs=3)


@pytest.mark.parametrize("n", [2, 4])
def test_reports_go_all_to_all(n: int) -> None:
    row = measure(n, "cpu", _args())
    msgs = row["messages_per_epoch"]
    # EpochStart to every worker; ExecDone to every peer; Vote to every peer and the coordinator;
    # EpochDone to the coordinator. Nothing conflicts, so no Revote and no Final.
    assert msgs["EpochStart"] == n
    assert msgs["ExecDone"] == n * (n - 1)
    assert msgs["Vote"] == n * n
    assert msgs["EpochDone"] == n
    assert "Revote" not in msgs and "Final" not in msgs
    assert row["report_messages_per_epoch"] == 2 * n * n - n
    assert row["txns_per_epoch"] == 2 * n
    assert row["epoch_latency_ms"]["p50"] > 0.3  # at least three hops of 100 µs or more


def test_same_seed_same_numbers() -> None:
    first, other, again = (
        measure(4, "cpu", _args(1)),
        measure(4, "cpu", _args(2)),
        measure(4, "cpu", _args(1)),
    )
    assert first == again  # whatever ran before it
    assert first["epoch_latency_ms"] != other["epoch_latency_ms"]  # the delays are drawn from the seed
    assert measure(4, "cpu-tree", _args(1)) == measure(4, "cpu-tree", _args(1))  # the hubs' bundles too


@pytest.mark.parametrize("n", [2, 4])
def test_relayed_reports_grow_linearly(n: int) -> None:
    row = measure(n, "cpu-relay", _args())
    msgs = row["messages_per_epoch"]
    # Each report once to the coordinator, one bundle of them back to each worker.
    assert msgs["ExecDone"] == msgs["ExecDone bundle"] == n
    assert msgs["Vote"] == msgs["Vote bundle"] == n
    assert row["report_messages_per_epoch"] == 4 * n


def test_tree_reports_grow_linearly() -> None:
    n, hubs = 4, 2  # groups of ⌈√4⌉ = 2: hubs w1 and w3
    msgs = measure(n, "network-tree", _args())["messages_per_epoch"]
    # Members to their hub, each hub to the other, each hub to its members (and a Vote to the coordinator).
    assert msgs["ExecDone"] == n - hubs
    assert msgs["ExecDone bundle"] == hubs * (hubs - 1) + n - hubs
    assert msgs["Vote"] == n - hubs
    assert msgs["Vote bundle"] == hubs * (hubs - 1) + n - hubs + hubs
