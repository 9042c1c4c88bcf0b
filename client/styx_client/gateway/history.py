"""The cluster's recent history, from the coordinator status the gateway polls anyway (``GET /v1/cluster``).

One sample at most every :data:`HISTORY_STEP_S` seconds, the last :data:`HISTORY_SAMPLES` of them
(ten minutes): per interval, epochs per second, committed and aborted transactions per second (from the
differences of the coordinator's totals, so every epoch counts whatever the poll interval) and the mean
epoch latency (from its epoch-duration count and sum). A counter that went down (a restarted
coordinator) starts the differences afresh.
"""

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["HISTORY_SAMPLES", "HISTORY_STEP_S", "ClusterHistory", "Sample"]

HISTORY_STEP_S = 2.0
HISTORY_SAMPLES = 300


@dataclass(frozen=True, slots=True)
class _Reading:
    at: float
    epoch: int
    committed: int
    aborted: int
    epochs_timed: int
    epoch_s: float


@dataclass(frozen=True, slots=True)
class Sample:
    """One interval of the history, ending at ``t`` (Unix seconds)."""

    t: float
    epoch: int
    epochs_per_s: float
    committed_per_s: float
    aborted_per_s: float
    epoch_ms: float | None
    """Mean epoch latency in the interval (None: no epoch ended in it)."""
    workers: int
    state: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class ClusterHistory:
    """The samples, oldest first; :meth:`record` takes every status poll and keeps what it needs."""

    def __init__(self, step_s: float = HISTORY_STEP_S, max_samples: int = HISTORY_SAMPLES,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.step_s = step_s
        self.clock = clock
        self.samples: deque[Sample] = deque(maxlen=max_samples)
        self._last: _Reading | None = None

    def record(self, status: Mapping[str, Any]) -> None:
        now = self.clock()
        last = self._last
        if last is not None and now - last.at < self.step_s:
            return
        reading = _reading(now, status)
        if reading is None:
            return
        self._last = reading
        if last is None or reading.epoch < last.epoch or reading.committed < last.committed:
            return  # the first reading, or a restarted coordinator: nothing to take a difference of
        dt = max(reading.at - last.at, 1e-9)
        timed = reading.epochs_timed - last.epochs_timed
        self.samples.append(
            Sample(
                t=round(now, 3),
                epoch=reading.epoch,
                epochs_per_s=round((reading.epoch - last.epoch) / dt, 2),
                committed_per_s=round((reading.committed - last.committed) / dt, 2),
                aborted_per_s=round(max(0, reading.aborted - last.aborted) / dt, 2),
                epoch_ms=round((reading.epoch_s - last.epoch_s) / timed * 1000, 3) if timed > 0 else None,
                workers=len(status.get("workers") or ()),
                state=str(status.get("state") or ""),
            )
        )

    def as_list(self) -> list[dict[str, Any]]:
        return [s.as_dict() for s in self.samples]


def _reading(now: float, status: Mapping[str, Any]) -> _Reading | None:
    """The counters of one status body (None when it has none: nothing deployed yet)."""
    try:
        totals = status["totals"]
        timed = status.get("epoch_seconds") or {"count": 0, "sum": 0.0}
        return _Reading(
            now,
            int(status["epoch"]),
            int(totals["committed"]),
            int(totals["aborted"]),
            int(timed["count"]),
            float(timed["sum"]),
        )
    except (KeyError, TypeError, ValueError):
        return None
