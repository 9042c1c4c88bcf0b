"""What ``styx status`` shows (pure): throughput over the last seconds, totals, workers, operators.

The keys of :meth:`styx_py.coordinator.server.Coordinator.status` are an interface: the CLI, the gateway
and the tests read them.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from styx_py.coordinator.cluster import Cluster
from styx_py.core.wire import EpochDone

__all__ = ["WINDOW_S", "Throughput", "operator_rows", "worker_rows"]

WINDOW_S = 10.0  # rates are averaged over this many seconds
MAX_EPOCHS_KEPT = 2000  # bounds the window's memory when epochs are shorter than WINDOW_S / 2000


class Throughput:
    """Totals since start, and the epochs of the last :data:`WINDOW_S` seconds."""

    def __init__(self) -> None:
        self.started_at: float | None = None
        self.totals = {"committed": 0, "aborted": 0, "rescheduled": 0, "fallback": 0}
        # (finished at, committed, aborted, fallback) per epoch
        self.epochs: deque[tuple[float, int, int, int]] = deque(maxlen=MAX_EPOCHS_KEPT)

    def record(self, now: float, done: list[EpochDone], fallback: int) -> None:
        committed = sum(d.committed for d in done)
        aborted = sum(d.aborted for d in done)
        self.totals["committed"] += committed
        self.totals["aborted"] += aborted
        self.totals["rescheduled"] += sum(d.rescheduled for d in done)
        self.totals["fallback"] += fallback
        self.epochs.append((now, committed, aborted, fallback))

    def summary(self, now: float) -> dict[str, Any]:
        recent = [t for t in self.epochs if now - t[0] <= WINDOW_S]
        started_at = now if self.started_at is None else self.started_at
        window = min(WINDOW_S, max(now - started_at, 1e-9))
        finished = sum(t[1] + t[2] for t in recent)
        return {
            "epochs_per_s": round(len(recent) / window, 1),
            "txn_per_s": round(finished / window, 1),
            "abort_rate": round(sum(t[2] for t in recent) / finished, 4) if finished else 0.0,
            "totals": dict(self.totals),
        }


def worker_rows(cluster: Cluster, now: float) -> list[dict[str, Any]]:
    last_seen = cluster.membership.last_seen
    return [
        {
            "node_id": w.node_id,
            "sid": w.sid,
            "address": f"{w.host}:{w.port}",
            "partitions": [p for p, o in enumerate(cluster.placement) if o == w.node_id],
            "last_heartbeat_s_ago": round(now - last_seen.get(w.node_id, now), 3),
        }
        for w in cluster.membership.infos()
    ]


def operator_rows(cluster: Cluster) -> list[dict[str, Any]]:
    return [{"name": o.name, "partitions": o.partitions, "functions": o.functions} for o in cluster.operators]
