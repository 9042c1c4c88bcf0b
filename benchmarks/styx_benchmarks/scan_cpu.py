"""CPU time of one consistent scan, per process, on an idle cluster; and the same path without sockets.

    python -m styx_benchmarks.scan_cpu                      # 50 scans of 10 000 accounts, /proc CPU
    python -m styx_benchmarks.scan_cpu --profile            # the scanning client under cProfile
    python -m styx_benchmarks.scan_cpu --pure [--profile]   # the pages' work in one process, no sockets

The cluster run starts the local stack :mod:`styx_benchmarks.scan_load` measures (2 workers, the bank
app over 4 partitions), opens YCSB-T's 10 000 accounts, then scans them ``--scans`` times back to
back as ``styx state list account`` does (:func:`styx_py.io.stateread.scan`, pages of
``--page-size`` rows) from this process, each scan checked against the conserved total. Each
process's CPU (user + system, ``/proc``) over the scans, less what it spent over as long a time idle
right after, divided by the scans, is its CPU per scan: the coordinator, each worker and the client
(this process). ``--pure`` runs the same pages through the functions the processes call (a worker's
:func:`~styx_worker.window.read_at`, the frames' encoding and decoding on each hop, the coordinator's
:class:`~styx_coordinator.reads.StateReads`, the client's :func:`~styx_py.io.stateread.read_page`)
with no sockets and no event loop wake-ups: where the CPU of a page goes, by step.

Results go to ``benchmarks/results/scan-cpu-<time>.json`` (``--note`` kept in it).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from styx_benchmarks.cpu import ProcessCpu, loop_ms
from styx_benchmarks.scan_load import KEYS, RESULTS
from styx_benchmarks.workload import Options
from styx_benchmarks.workloads import make_workload
from styx_benchmarks.ycsbt import INITIAL, key_name
from styx_client import StyxClient
from styx_py.core.limits import READ_PAGE
from styx_py.core.wire import ReadState
from styx_py.io import stateread
from styx_py.stack.local import LocalStack, cluster_secret


async def _scan(source: stateread.ReadSource, page_size: int) -> tuple[int, int]:
    rows = total = 0
    async for page in stateread.scan(source, "account", page_size=page_size):
        rows += len(page.rows)
        total += sum(v for _, v in page.rows)
    return rows, total


async def _cluster(
    coordinator: str, pids: dict[str, int], scans: int, page_size: int, prof: Any
) -> dict[str, Any]:
    async with await StyxClient.connect(coordinator) as client:
        await make_workload("ycsbt", Options()).load(client, progress=lambda _: None)
    source = stateread.admin_reads(coordinator, secret=cluster_secret(coordinator), timeout_s=30)
    deadline = time.monotonic() + 60
    while (await _scan(source, page_size))[0] < KEYS:  # the newest finished epoch holds the load
        assert time.monotonic() < deadline, "the loaded accounts never showed in a scan"
        await asyncio.sleep(0.05)
    for _ in range(5):  # warm: the workers' key indexes, the kept connection
        await _scan(source, page_size)
    cpu = ProcessCpu({**pids, "client": os.getpid()})
    cpu.start()
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    for _ in range(scans):
        rows, total = await _scan(source, page_size)
        assert (rows, total) == (KEYS, KEYS * INITIAL), (rows, total)
    if prof is not None:
        prof.disable()
    wall = time.perf_counter() - t0
    cpu.stop()
    busy = dict(cpu.used)
    cpu.start()
    await asyncio.sleep(wall)
    cpu.stop()
    idle = dict(cpu.used)
    per_scan = {name: round((busy[name] - idle[name]) / scans * 1000, 2) for name in busy}
    per_scan["total"] = round(sum(per_scan.values()), 2)
    return {
        "scans": scans,
        "scan_ms": round(wall / scans * 1000, 1),
        "cpu_ms_per_scan": per_scan,
        "busy_cpu_s": {n: round(v, 3) for n, v in busy.items()},
        "idle_cpu_s": {n: round(v, 3) for n, v in idle.items()},
    }


def run_cluster(scans: int, page_size: int, prof: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="styx-scancpu-", ignore_cleanup_errors=True) as data_dir:
        env = {"STYX_LOG_LEVEL": "WARNING"}
        with LocalStack(Path(data_dir) / "stack", workers=2, env=env) as stack:
            stack.deploy("styx_benchmarks.bank:app")
            pids = {n: p for n, p in stack.pids().items() if n == "coordinator" or n.startswith("w")}
            return asyncio.run(_cluster(stack.coordinator, pids, scans, page_size, prof))


def run_pure(scans: int, page_size: int, prof: Any) -> dict[str, Any]:
    """The pages of ``scans`` scans through every step the processes take, no sockets (see the module
    docstring); CPU ms per scan of each process's share."""
    import msgspec

    from styx_coordinator.reads import StateReads
    from styx_py.core.partitioning import partition_of
    from styx_py.core.wire import AdminReply, Batch, ReadAt, decode_batch, encode_frame
    from styx_worker.window import VersionWindow, read_at

    n_parts, workers = 4, ("w1", "w2")
    owner = {p: workers[p % 2] for p in range(n_parts)}
    stores = {w: _Store() for w in workers}
    encode = msgspec.msgpack.encode
    for i in range(KEYS):
        k = key_name(i)
        stores[owner[partition_of(k, n_parts)]].data[("account", k)] = encode(INITIAL)
    windows = {w: VersionWindow(100, -1) for w in workers}
    spent = {"coordinator": 0.0, "w1": 0.0, "w2": 0.0, "client": 0.0}
    clock = time.process_time

    class Transport:
        def __init__(self) -> None:
            self.out: list[tuple[str, Any]] = []

        def send(self, dest: str, msg: Any) -> None:
            self.out.append((dest, msg))

    transport = Transport()
    cluster = _Cluster(transport, n_parts, owner)
    reads = StateReads(cluster, None, _Tasks(), lambda: 10)  # type: ignore[arg-type]

    def exchange(msg: ReadState) -> AdminReply:
        frame = encode_frame(Batch("admin-1", [msg]))  # the client's (counted by scan_all)
        t = clock()
        (read,) = decode_batch(frame[4:], "coordinator").msgs
        reads.start("admin-1", read)  # type: ignore[arg-type]
        asks = [(dest, encode_frame(Batch("coordinator", [m]))) for dest, m in transport.out]
        transport.out.clear()
        spent["coordinator"] += clock() - t
        answers = []
        for dest, ask in asks:
            t = clock()
            (at,) = decode_batch(ask[4:], "worker").msgs
            assert isinstance(at, ReadAt)
            found = read_at(at, dest, stores[dest], windows[dest], 10, lambda _: True)
            answers.append(encode_frame(Batch(dest, [found])))
            spent[dest] += clock() - t
        t = clock()
        for answer in answers:
            for m in decode_batch(answer[4:], "coordinator").msgs:
                reads.on_rows(m)  # type: ignore[arg-type]
        ((_, reply),) = transport.out
        transport.out.clear()
        out = encode_frame(Batch("coordinator", [reply]))
        spent["coordinator"] += clock() - t
        (got,) = decode_batch(out[4:], "admin").msgs
        return got  # type: ignore[return-value]

    async def source(msg: ReadState) -> AdminReply:
        return exchange(msg)

    async def scan_all() -> None:
        for _ in range(scans):
            t = clock()
            rows = total = 0
            async for page in stateread.scan(source, "account", page_size=page_size):
                rows += len(page.rows)
                total += sum(v for _, v in page.rows)
            spent["client"] += clock() - t  # includes the others' shares: taken off below
            assert (rows, total) == (KEYS, KEYS * INITIAL), (rows, total)

    asyncio.run(scan_all())  # once to warm the key indexes
    spent = dict.fromkeys(spent, 0.0)
    if prof is not None:
        prof.enable()
    asyncio.run(scan_all())
    if prof is not None:
        prof.disable()
    spent["client"] -= spent["coordinator"] + spent["w1"] + spent["w2"]
    per_scan = {name: round(s / scans * 1000, 2) for name, s in spent.items()}
    per_scan["total"] = round(sum(per_scan.values()), 2)
    return {"scans": scans, "cpu_ms_per_scan": per_scan}


class _Store:
    def __init__(self) -> None:
        from styx_worker.keyindex import KeyIndex

        self.data: dict[tuple[str, Any], bytes] = {}
        self.index = KeyIndex()


class _Cluster:
    def __init__(self, transport: Any, n_parts: int, owner: dict[int, str]) -> None:
        self.transport = transport
        self.operators = [_Op("account", n_parts)]
        self.placement = owner
        self.state = "running"
        self.gen = 1


class _Op:
    def __init__(self, name: str, partitions: int) -> None:
        self.name, self.partitions = name, partitions


class _Tasks:
    def spawn(self, coro: Any) -> None:
        coro.close()  # the read's timeout: never reached here


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--scans", type=int, default=50)
    parser.add_argument("--page-size", type=int, default=READ_PAGE, help="rows per page of a scan")
    parser.add_argument("--pure", action="store_true", help="no cluster: the pages' work in this process")
    parser.add_argument("--profile", action="store_true", help="print this process's cProfile")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--note", default="", help="kept in the results file")
    args = parser.parse_args()
    prof = cProfile.Profile() if args.profile else None
    before = loop_ms()
    run: Callable[[int, int, Any], dict[str, Any]] = run_pure if args.pure else run_cluster
    result = run(args.scans, args.page_size, prof)
    after = loop_ms()
    result = {"mode": "pure" if args.pure else "cluster", "page_size": args.page_size, "keys": KEYS} | result
    result |= {"note": args.note, "loop_ms_before": before, "loop_ms_after": after}
    result["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=1))
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"scan-cpu-{result['mode']}-{time.strftime('%Y%m%d-%H%M%S')}.json"
        path.write_text(json.dumps(result, indent=1))
        print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
