"""What ``styx status`` shows (pure): throughput over the last seconds, totals, workers, operators.

The keys of :meth:`styx_coordinator.server.Coordinator.status` are an interface: the CLI, the gateway
and the tests read them.
"""

from __future__ import annotations

from typing import Any

from styx_coordinator.cluster import Cluster
from styx_coordinator.placement import loads_of
from styx_py.core.limits import STATUS_RATE_WINDOW_S
from styx_py.core.wire import EpochDone

OVERLOADED_WINDOW_S = 2.0  # the cluster is overloaded while it refused requests this recently

__all__ = [
    "OVERLOADED_WINDOW_S",
    "STATUS_RATE_WINDOW_S",
    "Throughput",
    "operator_rows",
    "version_rows",
    "worker_rows",
]


class Throughput:
    """Totals since start, and per-second counts of the last :data:`STATUS_RATE_WINDOW_S` seconds.

    ``aborted`` counts what user logic aborted (``Abort`` or another exception); bad requests (unknown
    operator or function, bad key or arguments) are ``rejected``, outside the abort rate: a client's
    mistake says nothing about contention or the workload's logic.

    ``refused`` counts requests the workers did not admit (admission control, answered ``refused``):
    while any were refused in the last :data:`OVERLOADED_WINDOW_S` seconds the cluster is
    ``overloaded`` (a flag beside ``state``: it runs normally, for what it admits).

    Counts go into one bucket per second (a ring of ``STATUS_RATE_WINDOW_S + 1``), so the memory is bounded
    whatever the epoch rate and no epoch is left out of the rates (a bounded list of epochs capped
    ``epochs_per_s`` at its length divided by the window)."""

    def __init__(self) -> None:
        self.started_at: float | None = None
        self.totals = {
            "committed": 0,
            "aborted": 0,
            "rejected": 0,
            "refused": 0,
            "rescheduled": 0,
            "fallback": 0,
            "epochs": 0,
        }
        # second -> [epochs, committed, aborted, rejected, refused]
        self.buckets: dict[int, list[int]] = {}
        self.refused_at = -float("inf")  # when an epoch last refused requests

    def record(self, now: float, done: list[EpochDone], fallback: int) -> None:
        committed = sum(d.committed for d in done)
        aborted = sum(d.aborted for d in done)
        rejected = sum(d.rejected for d in done)
        refused = sum(d.refused for d in done)
        if refused:
            self.refused_at = now
        self.totals["refused"] += refused
        self.totals["committed"] += committed
        self.totals["aborted"] += aborted
        self.totals["rejected"] += rejected
        self.totals["rescheduled"] += sum(d.rescheduled for d in done)
        self.totals["fallback"] += fallback
        self.totals["epochs"] += 1
        second = int(now)
        bucket = self.buckets.get(second)
        if bucket is None:
            for old in [s for s in self.buckets if s <= second - STATUS_RATE_WINDOW_S - 1]:
                del self.buckets[old]
            bucket = self.buckets[second] = [0, 0, 0, 0, 0]
        bucket[0] += 1
        bucket[1] += committed
        bucket[2] += aborted
        bucket[3] += rejected
        bucket[4] += refused

    def overloaded(self, now: float) -> bool:
        """Whether the workers refused requests in the last :data:`OVERLOADED_WINDOW_S` seconds."""
        return now - self.refused_at < OVERLOADED_WINDOW_S

    def summary(self, now: float) -> dict[str, Any]:
        """Rates over the last :data:`STATUS_RATE_WINDOW_S` whole seconds before ``now`` (the current
        second is still filling), or since the start when that is shorter."""
        current = int(now)
        recent = [b for s, b in self.buckets.items() if current - STATUS_RATE_WINDOW_S <= s < current]
        started_at = now if self.started_at is None else self.started_at
        window = max(1, min(STATUS_RATE_WINDOW_S, current - int(started_at)))
        epochs = sum(b[0] for b in recent)
        decided = sum(b[1] + b[2] for b in recent)  # committed or aborted by user logic
        aborted = sum(b[2] for b in recent)
        return {
            "epochs_per_s": round(epochs / window, 1),
            "txn_per_s": round((decided + sum(b[3] for b in recent)) / window, 1),  # every answered one
            "abort_rate": round(aborted / decided, 4) if decided else 0.0,
            "refused_per_s": round(sum(b[4] for b in recent) / window, 1),
            "overloaded": self.overloaded(now),
            "totals": dict(self.totals),
        }


def worker_rows(cluster: Cluster, now: float) -> list[dict[str, Any]]:
    last_seen = cluster.membership.last_seen
    # Measured load of each worker's partitions (placement balances it at every shape change).
    load = loads_of(cluster.placement, cluster.load.rates(len(cluster.placement)), cluster.workers)
    return [
        {
            "node_id": w.node_id,
            "sid": w.sid,
            "address": f"{w.host}:{w.port}",
            "partitions": [p for p, o in enumerate(cluster.placement) if o == w.node_id],
            "txn_per_s": round(load.get(w.node_id, 0.0), 1),
            "last_heartbeat_s_ago": round(now - last_seen.get(w.node_id, now), 3),
            **_effects(cluster.effects.get(w.node_id, [])),
            "pending_owners": cluster.pending_owners.get(w.node_id, []),
        }
        for w in cluster.membership.infos()
    ]


def _effects(reported: list[int]) -> dict[str, int]:
    """What a worker's heartbeat said of its external calls and timers (zeros before one did)."""
    pending, running, timers = [*reported, 0, 0, 0][:3]
    return {"external_calls_pending": pending, "external_calls_running": running, "timers_pending": timers}


def operator_rows(cluster: Cluster) -> list[dict[str, Any]]:
    return [
        {
            "name": o.name,
            "partitions": o.partitions,
            "functions": o.functions,
            "state_function": o.state_function,
        }
        for o in cluster.operators
    ]


def version_rows(cluster: Cluster) -> list[dict[str, Any]]:
    """Every committed graph version: the last one runs; each ran from its first epoch until the next."""
    return [
        {"version": v.number, "graph": v.import_path, "first_epoch": v.first_epoch} for v in cluster.versions
    ]
