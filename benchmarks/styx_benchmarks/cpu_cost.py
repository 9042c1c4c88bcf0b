"""CPU cost per transaction of each process of a local cluster, at a fixed open-loop rate.

    python -m styx_benchmarks.cpu_cost --rate 2000 --seconds 10 [--linger-ms 0]
    python -m styx_benchmarks.cpu_cost --rate 8000 --seconds 10 --cluster echo [--client raw]
    python -m styx_benchmarks.cpu_cost --rate 2000 --seconds 15 --extra-topics 1000

Starts a local cluster (SeaweedFS, Tansu in memory, coordinator, 2 workers), loads YCSB-T, runs
transfers at ``--rate`` through the SDK and the driver of ``styx bench`` and reads each process's CPU
time (user + system, from /proc) before and after: microseconds of CPU per answered transaction, per
process, the share of a core each used over the run (sending and draining) and how often each was
woken (voluntary context switches of its threads: on a small VM each costs tens of microseconds of
CPU). The load generator (this process: driver + SDK) is also given per request *sent*, which stays
meaningful when the cluster falls behind, with the paths its replies came by (pushed, egress copies).

``--cluster echo`` replaces the cluster by Tansu and :mod:`styx_benchmarks.echo` (one process
answering every request at once): the load generator's own cost, at rates the real cluster cannot
sustain on a small machine. ``--client raw`` (echo only) sends pre-built records through bare
aiokafka instead (:mod:`styx_benchmarks.raw_load`): the floor the SDK and the driver are measured
against.

CPU time is what bounds throughput on a small machine, and unlike latency it barely moves when other
work shares the machine, so it is the number to compare when optimising.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import uvloop

from styx_benchmarks.bank import app_path
from styx_benchmarks.bench import deployed_line
from styx_benchmarks.cpu import ProcessCpu, loop_ms, machine_line
from styx_benchmarks.driver import SdkSender, run_open_loop
from styx_benchmarks.raw_load import RawSettings, run_raw
from styx_benchmarks.workload import Options
from styx_benchmarks.workloads import make_workload
from styx_client import StyxClient
from styx_py.core.limits import BUSY_LINGER_MS
from styx_py.stack.local import LocalStack
from styx_py.stack.services import TansuBroker, create_topics


async def measure(
    coordinator: str | None,
    bootstrap: str,
    pids: dict[str, int],
    rate: float,
    seconds: float,
    linger_ms: int = 0,
    profile: str | None = None,
    busy_linger_ms: float = BUSY_LINGER_MS,
    push_requests: bool = True,
) -> bool:
    """Warm up for 1 s, then measure ``seconds`` at ``rate``; through the coordinator's cluster, or
    (``coordinator`` None) straight to the echo responder's topics. True when every request of the
    measured run was answered."""
    workload = make_workload("ycsbt", Options())
    if coordinator is not None:
        connect = StyxClient.connect(
            coordinator,
            max_pending=1_000_000,
            linger_ms=linger_ms,
            busy_linger_ms=busy_linger_ms,
            push_requests=push_requests,
        )
        client = await connect
    else:
        client = StyxClient(
            bootstrap,
            {"account": 4},
            max_pending=1_000_000,
            linger_ms=linger_ms,
            busy_linger_ms=busy_linger_ms,
        )
        await client.start()
    async with client:
        if coordinator is not None:
            await workload.load(client, progress=lambda _: None)
        sender = SdkSender(client, 60)
        await run_open_loop(workload, sender, rate=rate, duration_s=1, warmup_s=0, progress=None)
        loop_before = loop_ms()
        cpu = ProcessCpu(pids)
        cpu.start()
        profiler = cProfile.Profile() if profile else None
        t0 = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        result = await run_open_loop(
            workload, sender, rate=rate, duration_s=seconds, warmup_s=0, progress=None
        )
        if profiler is not None and profile:
            profiler.disable()
            profiler.dump_stats(profile)
        wall = time.perf_counter() - t0
        cpu.stop()
        loop_after = loop_ms()
    p = result.percentiles_ms()
    print(
        f"YCSB-T at {rate:g}/s for {seconds:g} s: {result.sent} sent, {result.answered} answered, "
        f"{result.throughput:.0f}/s, p50 {p['p50']:.1f} ms, p99 {p['p99']:.1f} ms (run + drain {wall:.1f} s)"
    )
    per_txn = cpu.per_transaction_us(result.answered)
    for name, used in cpu.used.items():
        print(
            f"  {name:<12} {per_txn[name]:6.1f} µs/txn  {used / wall * 100:4.0f} % of a core  "
            f"{cpu.woken[name] / wall:6.0f} wake-ups/s"
        )
    # Not "N cores = X txn/s": a cluster with spare CPU spends it on more, smaller epochs and polls
    # (it used ~1.8 cores at every rate from 500 to 12 000/s here), so the CPU per transaction at one
    # rate does not say what a higher rate would cost.
    used_cores = sum(cpu.used.values()) / wall
    print(f"  {'total':<12} {per_txn['total']:6.1f} µs/txn  {used_cores * 100:4.0f} % of a core")
    st = client.stats
    print(
        f"  replies: {st.replied} taken ({st.pushed} pushed), {st.echoes_ignored} echoes read, "
        f"{st.egress_skipped} egress records skipped, {st.duplicates_ignored} duplicates, "
        f"{st.unmatched_ignored} unmatched ignored"
    )
    client_cpu = cpu.used["client+driver"]
    print(f"  {machine_line(loop_before, loop_after)}")
    print(f"  load generator: {client_cpu / max(1, result.sent) * 1e6:.1f} µs of CPU per request sent")
    return result.answered == result.sent


async def measure_raw(
    bootstrap: str, pids: dict[str, int], rate: float, seconds: float, linger_ms: int
) -> bool:
    """The floor: :func:`run_raw` (bare aiokafka) against the echo responder, 1 s warm-up first. True
    when every request of the measured run was answered."""
    settings = RawSettings(bootstrap, {"account": 4}, linger_ms=linger_ms)
    await run_raw(settings, rate, 1.0)
    loop_before = loop_ms()
    cpu = ProcessCpu(pids)
    cpu.start()
    t0 = time.perf_counter()
    result = await run_raw(settings, rate, seconds)
    wall = time.perf_counter() - t0
    cpu.stop()
    loop_after = loop_ms()
    print(
        f"raw aiokafka at {rate:g}/s for {seconds:g} s: {result.sent} sent, {result.answered} answered "
        f"(last reply after {result.wall_s:.1f} s)"
    )
    for name, used in cpu.used.items():
        per_request = used / max(1, result.sent) * 1e6
        print(
            f"  {name:<12} {per_request:6.1f} µs/request  {used / wall * 100:4.0f} % of a core  "
            f"{cpu.woken[name] / wall:6.0f} wake-ups/s"
        )
    client_cpu = cpu.used["client+driver"]
    print(f"  {machine_line(loop_before, loop_after)}")
    print(f"  load generator: {client_cpu / max(1, result.sent) * 1e6:.1f} µs of CPU per request sent")
    return result.answered == result.sent


@contextlib.contextmanager
def echo_cluster(data_dir: Path) -> Iterator[tuple[str, dict[str, int]]]:
    """Tansu (in memory) with fresh request and reply topics, and the echo responder; their pids."""
    broker = TansuBroker("memory", log_path=data_dir / "tansu.log").start()
    responder: subprocess.Popen[bytes] | None = None
    try:
        asyncio.run(create_topics(broker.bootstrap, {"styx-ingress": 4, "styx-egress": 4}))
        command = [sys.executable, "-m", "styx_benchmarks.echo", broker.bootstrap]
        responder = subprocess.Popen(command)
        assert broker.pid is not None
        yield broker.bootstrap, {"tansu": broker.pid, "echo": responder.pid}
    finally:
        if responder is not None:
            responder.terminate()
            responder.wait(timeout=10)
        broker.stop()


@contextlib.contextmanager
def styx_cluster(data_dir: Path, extra_topics: int = 0) -> Iterator[tuple[str, str, dict[str, int]]]:
    """A local cluster with the bank app deployed; its coordinator, its broker and every pid. With
    ``extra_topics``, the broker holds that many other topics first (as after a long run with log
    segments, which add a topic a second)."""
    with LocalStack(data_dir, workers=2, env={"STYX_LOG_LEVEL": "WARNING"}) as stack:
        for first in range(0, extra_topics, 100):
            last = min(extra_topics, first + 100)
            asyncio.run(create_topics(stack.kafka, {f"styx-extra.{i}": 4 for i in range(first, last)}))
        app = app_path(4)
        stack.deploy(app)
        print(deployed_line(app, stack.coordinator), flush=True)
        yield stack.coordinator, stack.kafka, stack.pids()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--linger-ms", type=int, default=0, help="client producer linger (as styx bench)")
    parser.add_argument(
        "--busy-linger-ms",
        type=float,
        default=BUSY_LINGER_MS,
        help="the SDK client's busy linger (as styx bench)",
    )
    parser.add_argument(
        "--cluster",
        choices=("styx", "echo"),
        default="styx",
        help="styx: a local cluster; echo: Tansu and a responder that answers at once (the client alone)",
    )
    parser.add_argument(
        "--client",
        choices=("sdk", "raw"),
        default="sdk",
        help="sdk: the driver and the SDK; raw: bare aiokafka with pre-built records (the floor; echo only)",
    )
    parser.add_argument(
        "--extra-topics",
        type=int,
        default=0,
        help="the cluster's broker holds this many other topics first (as after a long run with segments)",
    )
    parser.add_argument(
        "--no-push-requests", action="store_true", help="the workers fetch every request (as styx bench)"
    )
    parser.add_argument(
        "--profile", metavar="FILE", help="cProfile the measured run into FILE (slows the client down)"
    )
    args = parser.parse_args()
    if args.client == "raw" and args.cluster != "echo":
        parser.error("--client raw needs --cluster echo (its requests are not real transactions)")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    data_dir = Path(tempfile.mkdtemp(prefix="styx-cpu-"))
    complete = False
    try:
        coordinator: str | None
        with contextlib.ExitStack() as stack:
            if args.cluster == "styx":
                coordinator, bootstrap, pids = stack.enter_context(styx_cluster(data_dir, args.extra_topics))
            else:
                coordinator = None
                bootstrap, pids = stack.enter_context(echo_cluster(data_dir))
            pids["client+driver"] = os.getpid()
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                if args.client == "raw":
                    complete = runner.run(
                        measure_raw(bootstrap, pids, args.rate, args.seconds, args.linger_ms)
                    )
                else:
                    complete = runner.run(
                        measure(
                            coordinator,
                            bootstrap,
                            pids,
                            args.rate,
                            args.seconds,
                            args.linger_ms,
                            args.profile,
                            args.busy_linger_ms,
                            not args.no_push_requests,
                        )
                    )
    finally:
        if complete:
            shutil.rmtree(data_dir, ignore_errors=True)
        else:
            # A run that lost requests (or failed) is worth a look: its processes' logs are kept.
            print(f"not every request was answered: the cluster's logs are kept in {data_dir}", flush=True)
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
