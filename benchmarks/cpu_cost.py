"""CPU cost per transaction of each process of a local cluster, at a fixed open-loop rate.

    python -m styx_py.benchmarks.cpu_cost --rate 2000 --seconds 10 [--linger-ms 5]

Starts a local cluster (SeaweedFS, Tansu in memory, coordinator, 2 workers), loads YCSB-T, runs
transfers at ``--rate`` and reads each process's CPU time (user + system, from /proc) before and
after: microseconds of CPU per answered transaction, per process, the share of a core each used, and
its read and write system calls per transaction (`/proc/PID/io`).
CPU time is what bounds throughput on a small machine, and unlike latency it barely moves when other
work shares the machine, so it is the number to compare when optimising.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import uvloop

from styx_py.benchmarks.driver import SdkSender, run_open_loop
from styx_py.benchmarks.workload import Options
from styx_py.benchmarks.workloads import make_workload
from styx_py.client import StyxClient
from styx_py.stack.local import LocalStack

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / _TICKS, int(fields[12]) / _TICKS


def cpu_seconds(pid: int) -> float:
    return sum(cpu_times(pid))


def syscalls(pid: int) -> tuple[int, int]:
    """(read, write) system calls so far (``/proc/PID/io``: socket sends and receives included)."""
    counts = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(counts["syscr"]), int(counts["syscw"])


async def measure(
    stack: LocalStack, pids: dict[str, int], rate: float, seconds: float, linger_ms: int = 0
) -> None:
    workload = make_workload("ycsbt", Options())
    connect = StyxClient.connect(stack.coordinator, max_pending=1_000_000, linger_ms=linger_ms)
    async with await connect as client:
        await workload.load(client, progress=lambda _: None)
        sender = SdkSender(client, 60)
        await run_open_loop(workload, sender, rate=rate, duration_s=1, warmup_s=0, progress=None)
        before = {name: cpu_times(pid) for name, pid in pids.items()}
        calls_before = {name: syscalls(pid) for name, pid in pids.items()}
        result = await run_open_loop(
            workload, sender, rate=rate, duration_s=seconds, warmup_s=0, progress=None
        )
        after = {name: cpu_times(pid) for name, pid in pids.items()}
        calls_after = {name: syscalls(pid) for name, pid in pids.items()}
    p = result.percentiles_ms()
    print(
        f"YCSB-T at {rate:g}/s for {seconds:g} s: {result.answered} answered, {result.throughput:.0f}/s, "
        f"p50 {p['p50']:.1f} ms, p99 {p['p99']:.1f} ms"
    )
    total = 0.0
    answered = max(1, result.answered)
    for name in pids:
        user, system = (a - b for a, b in zip(after[name], before[name], strict=True))
        used = user + system
        per_txn = used / answered * 1e6
        total += per_txn
        reads, writes = (a - b for a, b in zip(calls_after[name], calls_before[name], strict=True))
        print(
            f"  {name:<12} {per_txn:6.0f} µs/txn (sys {system / answered * 1e6:4.0f})  "
            f"{used / seconds * 100:4.0f} % of a core  "
            f"{reads / answered:5.2f} reads/txn  {writes / answered:5.2f} writes/txn"
        )
    print(f"  {'total':<12} {total:6.0f} µs/txn  (2 cores = {2e6 / total:,.0f} txn/s at 100 % CPU)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--linger-ms", type=int, default=5, help="client producer linger (as styx bench)")
    args = parser.parse_args()
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    data_dir = Path(tempfile.mkdtemp(prefix="styx-cpu-"))
    try:
        with LocalStack(data_dir, workers=2, env={"STYX_LOG_LEVEL": "WARNING"}) as stack:
            stack.deploy("styx_py.benchmarks.bank:app")
            pids = {name: proc.pid for name, proc in stack.procs.items()}
            assert stack.broker is not None and stack.broker.pid is not None
            pids["tansu"] = stack.broker.pid
            pids["client+driver"] = os.getpid()
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(measure(stack, pids, args.rate, args.seconds, args.linger_ms))
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
