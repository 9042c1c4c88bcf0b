"""The processes a local stack started, recorded in its data directory (``DATA_DIR/pids``), so that a
stack started later on the same directory ends any that outlived their owner.

On Linux a stack's services die with the process that started them (:mod:`styx_py.io.lifeline`); this
is the second line, for what escaped that (a process that changed its parent, a platform without
``PR_SET_PDEATHSIG``). A record names the process and its owner by pid *and* start time (``/proc``),
so a reused pid is never taken for the process recorded; a record whose owner still runs (another stack
on the same directory) is left alone. Without ``/proc`` nothing is recorded or reaped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

__all__ = ["PIDS_FILE", "forget", "reap", "record", "start_time"]

PIDS_FILE = "pids"
_POLL_S = 0.05


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None if it is gone, a zombie or unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


def record(data_dir: Path, name: str, pid: int | None) -> None:
    """Note that this process started ``pid`` (``name``) for the stack on ``data_dir``."""
    if pid is None:
        return
    started, owner = start_time(pid), os.getpid()
    owner_started = start_time(owner)
    if started is None or owner_started is None:
        return  # gone already, or no /proc here
    data_dir.mkdir(parents=True, exist_ok=True)
    with (data_dir / PIDS_FILE).open("a") as f:
        f.write(f"{pid} {started} {owner} {owner_started} {name}\n")


def forget(data_dir: Path) -> None:
    """The stack stopped everything it started: no record is needed any more."""
    (data_dir / PIDS_FILE).unlink(missing_ok=True)


def reap(data_dir: Path, timeout_s: float = 5.0) -> list[str]:
    """End every recorded process that still runs although its owner is gone: SIGTERM to its process
    group (each service leads its own), SIGKILL after ``timeout_s``. Returns a line per process ended."""
    path = data_dir / PIDS_FILE
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    stale: list[tuple[int, int, str]] = []
    for line in lines:
        fields = line.split(" ", 4)
        if len(fields) != 5 or not all(f.isdigit() for f in fields[:4]):
            continue  # not a record (a file cut short by a crash)
        pid, started, owner, owner_started = (int(f) for f in fields[:4])
        if start_time(owner) == owner_started:
            continue  # its owner runs: not ours to end
        if start_time(pid) == started:
            stale.append((pid, started, fields[4]))
    for pid, _, _ in stale:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(start_time(p) == s for p, s, _ in stale) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    for pid, started, _ in stale:
        if start_time(pid) == started:
            _signal(pid, signal.SIGKILL)
    path.unlink(missing_ok=True)
    return [f"{name} (pid {pid}) left by an earlier stack on {data_dir}: stopped" for pid, _, name in stale]


def _signal(pid: int, sig: int) -> None:
    """``sig`` to the process group ``pid`` leads, or to the process alone if it leads none."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            os.kill(pid, sig)
