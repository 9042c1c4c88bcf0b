"""CPU time of the processes of a run, from ``/proc`` (Linux): what each one spent per transaction.

On a small machine CPU time is what bounds throughput, and unlike latency it barely moves when other
work shares the machine, so every benchmark result carries it per process (``styx bench``,
:mod:`styx_py.benchmarks.cpu_cost`). A process that is gone, or a system without ``/proc``, reads 0.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ProcessCpu", "cpu_seconds"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 if it is gone or unknown)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


class ProcessCpu:
    """CPU seconds of named processes between :meth:`start` and :meth:`stop`."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self.started: dict[str, float] = {}
        self.used: dict[str, float] = {}

    def start(self) -> None:
        self.started = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def stop(self) -> None:
        # A process that ended meanwhile (a worker killed and restarted under a new pid) reads 0: its
        # CPU is unknown, not negative.
        self.used = {
            name: max(0.0, cpu_seconds(pid) - self.started.get(name, 0.0)) for name, pid in self.pids.items()
        }

    def per_transaction_us(self, transactions: int) -> dict[str, float]:
        """Microseconds of CPU per transaction, per process and in ``total``."""
        n = max(1, transactions)
        out = {name: round(used / n * 1e6, 1) for name, used in self.used.items()}
        if out:
            out["total"] = round(sum(self.used.values()) / n * 1e6, 1)
        return out
