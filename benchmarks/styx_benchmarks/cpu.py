"""CPU time of the processes of a run, from ``/proc`` (Linux): what each one spent per transaction.

On a small machine CPU time is what bounds throughput, and unlike latency it barely moves when other
work shares the machine, so every benchmark result carries it per process (``styx bench``,
:mod:`styx_benchmarks.cpu_cost`). A process that is gone, or a system without ``/proc``, reads 0.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ProcessCpu", "cpu_seconds", "loop_ms", "machine_line", "wakeups"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def loop_ms(repeat: int = 5) -> float:
    """How fast this machine runs Python now: the best of ``repeat`` timings, in ms, of a fixed loop of
    10⁶ steps (a fraction of a second in all).

    The CPU of the 2-core VM these results come from is not equally fast all day: ten times this loop
    took from 0.23 to 1.56 s at different hours, and every latency and CPU figure moved with it
    (benchmarks/results/resting-reader.md, pushed-requests.md). Every result carries this, taken just
    before and after its run, so two runs can be told apart by the machine as well as by the code."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        [0 for _ in range(1_000_000)]
        best = min(best, time.perf_counter() - t0)
    return round(best * 1000, 1)


def machine_line(before_ms: float, after_ms: float) -> str:
    """How every benchmark reports :func:`loop_ms` taken before and after its run."""
    return f"machine: a 10⁶-step Python loop took {before_ms:g} ms before the run, {after_ms:g} after"


def _stat(pid: int) -> list[str]:
    # The fields after the command name (which may hold spaces and parentheses): state, ppid, ...
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                out.setdefault(int(_stat(int(entry.name))[1]), []).append(int(entry.name))
    return out


def cpu_seconds(pid: int | None, descendants: bool = False) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 if it is gone or unknown); with
    ``descendants``, also those of its live descendants and of the children it has waited for (the
    coordinator merges snapshots in a child process)."""
    if pid is None:
        return 0.0
    try:
        fields = _stat(pid)
    except (OSError, IndexError, ValueError):
        return 0.0
    total = (int(fields[11]) + int(fields[12])) / _TICKS
    if descendants:
        total += (int(fields[13]) + int(fields[14])) / _TICKS
        total += sum(cpu_seconds(child) for child in descendants_of(pid))
    return total


def descendants_of(pid: int) -> list[int]:
    """The live processes below ``pid`` (its children, theirs, ...), from /proc."""
    children = _children()
    found: list[int] = []
    stack = list(children.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children.get(child, []))
    return found


def wakeups(pid: int | None) -> int:
    """Voluntary context switches of process ``pid``'s live threads so far (0 if gone or unknown): how
    often they went to sleep and were woken (an event loop: once per idle wait). On a small VM each
    costs tens of microseconds of CPU (benchmarks/results/resting-reader.md), so it is counted next to
    the CPU time."""
    if pid is None:
        return 0
    total = 0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                for line in (task / "status").read_text().splitlines():
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
                        break
    return total


class ProcessCpu:
    """CPU seconds of named processes between :meth:`start` and :meth:`stop`."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self.started: dict[str, float] = {}
        self.used: dict[str, float] = {}
        self.woken_at_start: dict[str, int] = {}
        self.woken: dict[str, int] = {}  # wake-ups (wakeups()) of each process between start and stop

    def start(self) -> None:
        self.started = {name: self._read(pid) for name, pid in self.pids.items()}
        self.woken_at_start = {name: wakeups(pid) for name, pid in self.pids.items()}

    @staticmethod
    def _read(pid: int) -> float:
        # A process's CPU includes its children's (the coordinator's snapshot merges), except for this
        # one: the cluster a benchmark starts runs as its children.
        return cpu_seconds(pid, descendants=pid != os.getpid())

    def stop(self) -> None:
        # A process that ended meanwhile (a worker killed and restarted under a new pid) reads 0: its
        # CPU is unknown, not negative.
        self.used = {
            name: max(0.0, self._read(pid) - self.started.get(name, 0.0)) for name, pid in self.pids.items()
        }
        self.woken = {
            name: max(0, wakeups(pid) - self.woken_at_start.get(name, 0)) for name, pid in self.pids.items()
        }

    def per_transaction_us(self, transactions: int) -> dict[str, float]:
        """Microseconds of CPU per transaction, per process and in ``total``."""
        n = max(1, transactions)
        out = {name: round(used / n * 1e6, 1) for name, used in self.used.items()}
        if out:
            out["total"] = round(sum(self.used.values()) / n * 1e6, 1)
        return out
