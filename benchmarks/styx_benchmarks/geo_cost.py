"""What a DeathStar hotel request costs the engine with each geo index, without Kafka or sockets.

    python -m styx_benchmarks.geo_cost                    # 2 000 requests, 2 rounds
    python -m styx_benchmarks.geo_cost --requests 5000 --rounds 3

Loads ``deathstar-hotel`` (scale 1.0) into the in-process cluster (:class:`~styx_py.testing.cluster.
SimCluster`, two workers: both workers' engine work runs in this process), then submits the same
requests (the default mix, by seed) to the grid-cell app and to the range-read app
(:mod:`~styx_benchmarks.deathstar.hotel_range`), alternating, and prints the process CPU per request
while they run, the per-query figures of the range variant (scans, rows), and whether every reply
equals the serial execution. Measured numbers are in benchmarks/results/deathstar-geo.md.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time

from styx_benchmarks.deathstar import HotelReservation, search_ranges
from styx_benchmarks.workload import Op, Options
from styx_py.testing.cluster import SimCluster, check_against_serial


def requests(n: int) -> list[Op]:
    w = HotelReservation(Options(seed=1))
    rng = random.Random(1)
    return [w.next_op(rng) for _ in range(n)]


async def cpu_per_request_us(geo: str, ops: list[Op]) -> float:
    """Process CPU per request of ``ops`` on a freshly loaded cluster running the ``geo`` variant."""
    w = HotelReservation(Options(seed=1, extra={"geo": geo}))
    async with SimCluster(w.app, workers=2, seed=1, epoch_size_max=200) as c:
        for operator, key, function, args in w.load_calls():
            c.submit(operator, function, key, *args)
        await c.wait()
        start = time.process_time()
        for n, op in enumerate(ops):
            c.submit(op.operator, op.function, op.key, *op.args, request_id=f"{op.label}-{n}")
        await c.wait()
        spent = time.process_time() - start
        await check_against_serial(c)
        return spent / len(ops) * 1e6


def scans_per_query(ops: list[Op]) -> float:
    """Range scans per search or recommendation (each visits every partition of ``geo``)."""
    points = [op.args[:2] if op.label == "search" else op.args[1:3] for op in ops]
    points = [p for p, op in zip(points, ops, strict=True) if op.label in ("search", "recommend")]
    return sum(len(search_ranges(lat, lon)) for lat, lon in points) / max(1, len(points))


async def main_async(args: argparse.Namespace) -> None:
    ops = requests(args.requests)
    print(f"{args.requests} requests; range scans per search or recommendation: {scans_per_query(ops):.2f}")
    for n in range(args.rounds):
        for geo in ("grid", "range"):
            us = await cpu_per_request_us(geo, ops)
            print(f"round {n + 1}: {geo}: {us:.0f} µs of CPU per request (replies = serial execution)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m styx_benchmarks.geo_cost", description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=2000, help="requests per run (default 2000)")
    p.add_argument("--rounds", type=int, default=2, help="alternating grid/range rounds (default 2)")
    args = p.parse_args(argv)
    if args.requests < 1 or args.rounds < 1:
        p.error("--requests and --rounds must be positive")
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
