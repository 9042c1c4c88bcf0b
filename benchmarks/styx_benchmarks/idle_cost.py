"""CPU of an idle local cluster: what it costs the machine while nobody sends anything.

python -m styx_benchmarks.idle_cost [--seconds 10]

Starts the cluster ``cpu_cost`` uses (two workers, the bank app, Tansu in memory), lets it settle, then
charges each process its CPU over ``--seconds``: first with no client, then with one connected SDK
client that sends nothing. On a 2-core machine, whatever an idle cluster burns is taken from every
request that comes later (benchmarks/results/idle-cost.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from styx_benchmarks.cpu import ProcessCpu, loop_ms, machine_line
from styx_benchmarks.cpu_cost import styx_cluster
from styx_client import StyxClient

SETTLE_S = 3.0  # after the start (or the client's connect) before measuring: the first fetches and rounds


async def _measure(pids: dict[str, int], seconds: float) -> tuple[dict[str, float], dict[str, float]]:
    """Share of a core and wake-ups a second of each process over ``seconds``."""
    cpu = ProcessCpu(pids)
    cpu.start()
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    cpu.stop()
    wall = time.perf_counter() - t0
    return {n: used / wall for n, used in cpu.used.items()}, {n: w / wall for n, w in cpu.woken.items()}


def _show(label: str, cores: dict[str, float], woken: dict[str, float]) -> None:
    parts = [f"{name} {share * 100:.1f} % ({woken[name]:.0f} wake-ups/s)" for name, share in cores.items()]
    print(f"{label}: {'  '.join(parts)}  total {sum(cores.values()) * 100:.0f} % of a core", flush=True)


async def _run(coordinator: str, pids: dict[str, int], seconds: float) -> None:
    await asyncio.sleep(SETTLE_S)
    _show("no client", *await _measure(pids, seconds))
    async with await StyxClient.connect(coordinator):
        await asyncio.sleep(SETTLE_S)
        _show("one idle client", *await _measure({**pids, "client": os.getpid()}, seconds))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured time of each part")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="styx-idle-", ignore_cleanup_errors=True) as data_dir,
        styx_cluster(Path(data_dir)) as (coordinator, _, pids),
    ):
        before = loop_ms()
        asyncio.run(_run(coordinator, pids, args.seconds))
    print(machine_line(before, loop_ms()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
