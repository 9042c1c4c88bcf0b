"""The `styx up --demo` workload: bank transfers at a steady rate, then a conservation check."""

from __future__ import annotations

import asyncio
import random
import time

from styx_benchmarks.workload import submit_checks
from styx_client import StyxClient
from styx_py.core.wire import Reply

ACCOUNTS = 1000
INITIAL = 100


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


async def run_demo(coordinator: str, seconds: float = 5.0, rate: float = 500.0, seed: int = 1) -> bool:
    rng = random.Random(seed)
    async with await StyxClient.connect(coordinator) as client:
        t0 = time.perf_counter()
        await asyncio.gather(
            *(client.submit("account", f"acct{i}", "deposit", INITIAL) for i in range(ACCOUNTS))
        )
        print(f"loaded {ACCOUNTS} accounts in {time.perf_counter() - t0:.2f}s", flush=True)

        latencies: list[float] = []
        replies: list[Reply] = []

        async def one(scheduled: float) -> None:
            a, b = rng.sample(range(ACCOUNTS), 2)
            reply = await client.submit("account", f"acct{a}", "transfer", f"acct{b}", rng.randint(1, 50))
            latencies.append(time.perf_counter() - scheduled)  # from the scheduled send time
            replies.append(reply)

        n = int(seconds * rate)
        start = time.perf_counter()
        tasks = []
        for i in range(n):
            scheduled = start + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)  # open-loop pacing: requests leave on the clock
            tasks.append(asyncio.create_task(one(scheduled)))
            if i and i % int(rate) == 0:
                print(f"  {i}/{n} sent, {len(replies)} replied", flush=True)
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
        committed = sum(r.status == "committed" for r in replies)
        aborted = sum(r.status == "aborted" for r in replies)
        lat = sorted(latencies)
        print(
            f"transfers: {len(replies)} in {elapsed:.2f}s = {len(replies) / elapsed:.0f} txn/s "
            f"({committed} committed, {aborted} aborted for insufficient credit)",
            flush=True,
        )
        print(
            f"latency ms: p50 {percentile(lat, 0.5) * 1e3:.1f}  p99 {percentile(lat, 0.99) * 1e3:.1f}  "
            f"max {lat[-1] * 1e3:.1f}",
            flush=True,
        )

        # The check's own reads: request ids "check-…", which the audit counts apart from the workload.
        reads = [("account", f"acct{i}", "balance", ()) for i in range(ACCOUNTS)]
        balances = await submit_checks(client, reads, concurrency=ACCOUNTS)
        total = sum(r.value for r in balances if r.status == "committed")
        ok = total == ACCOUNTS * INITIAL and len(replies) == n
        print(f"money conserved: {total} == {ACCOUNTS * INITIAL}: {'yes' if ok else 'NO'}", flush=True)
        return ok
