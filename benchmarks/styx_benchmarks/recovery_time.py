"""Measure recovery time: N workers, K keys of state, a worker killed with SIGKILL and restarted.

    python -m styx_benchmarks.recovery_time --workers 4 --keys 1000000

Reports the coordinator's own recovery metrics (detection, restore = snapshot load + log reads,
replay) and the end-to-end time from the kill to the first committed transaction on the killed
worker's partitions; writes them to benchmarks/results/recovery.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from styx_client import StyxClient
from styx_py.core.wire import StatusRequest
from styx_py.stack.local import LocalStack, admin

BATCH = 1000


async def status(stack: LocalStack) -> dict[str, Any]:
    return await admin(stack.coordinator, StatusRequest())


async def run(workers: int, keys: int, snapshot_interval_s: float) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="styx-recovery-"))
    env = {"STYX_SNAPSHOT_INTERVAL_S": str(snapshot_interval_s), "STYX_LOG_LEVEL": "WARNING"}
    stack = LocalStack(data, workers=workers, env=env)
    await asyncio.to_thread(stack.start)
    try:
        await asyncio.to_thread(stack.deploy, "styx_benchmarks.bank:app")
        async with await StyxClient.connect(stack.coordinator, timeout_s=600) as client:
            t0 = time.perf_counter()
            window = asyncio.Semaphore(8)

            async def load(start: int) -> None:
                async with window:
                    names = [f"k{i}" for i in range(start, min(keys, start + BATCH))]
                    await client.call("account", f"loader{start}", "open_accounts", names, 1)

            tasks = [asyncio.create_task(load(s)) for s in range(0, keys, BATCH)]
            for i, task in enumerate(asyncio.as_completed(tasks)):
                await task
                if i % 100 == 0:
                    print(f"  loaded {min(keys, (i + 1) * BATCH)}/{keys} keys", flush=True)
            load_s = time.perf_counter() - t0
            print(f"loaded {keys} keys in {load_s:.1f}s", flush=True)
            loaded_epoch = (await status(stack))["epoch"]
            while True:  # until a snapshot taken after the load is complete
                st = await status(stack)
                if st["last_snapshot"] and st["last_snapshot"]["epoch"] >= loaded_epoch:
                    break
                await client.call("account", "tick", "deposit", 1)
            snapshot = st["last_snapshot"]
            print(f"snapshot {snapshot}", flush=True)

            before = st["recoveries"]
            killed_at = time.perf_counter()
            stack.kill("w1")
            stack.start_worker("w1")
            probe = "k0"  # any key: nothing commits anywhere until every worker has recovered
            await client.call("account", probe, "deposit", 1)  # commits once the cluster is back
            end_to_end_s = time.perf_counter() - killed_at
            st = await status(stack)
            while st["recoveries"] == before or st["last_recovery"]["replay_s"] is None:
                await client.call("account", probe, "deposit", 1)
                st = await status(stack)
    finally:
        await asyncio.to_thread(stack.stop)
    return {
        "workers": workers,
        "keys": keys,
        "load_s": round(load_s, 1),
        "snapshot": snapshot,
        "recovery": st["last_recovery"],
        "kill_to_first_commit_s": round(end_to_end_s, 3),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--snapshot-interval-s", type=float, default=2.0)
    p.add_argument("--out", default="benchmarks/results/recovery.json")
    args = p.parse_args()
    result = asyncio.run(run(args.workers, args.keys, args.snapshot_interval_s))
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    result["git"] = rev.stdout.strip()
    print(json.dumps(result, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
