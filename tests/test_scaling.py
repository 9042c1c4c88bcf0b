"""Changing the cluster's shape on real processes: YCSB-T-style transfers run while the
cluster goes 2 → 4 → 3 workers and then loses one for good; nothing is lost or answered twice and
money is conserved. (The simulation covers many more interleavings: tests/test_reshape.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from styx_client import StyxClient
from styx_py.core.wire import StatusRequest
from styx_py.stack.local import LocalStack, admin
from tests.test_integration import read_replies, read_topic

pytestmark = pytest.mark.services

ACCOUNTS = 100
INITIAL = 1000


async def styx_scale(stack: LocalStack, *args: str) -> str:
    """``styx scale ARGS`` against ``stack``; its output (it must succeed)."""
    env = {**os.environ, "STYX_CLUSTER_SECRET": stack.secret}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "styx_py.cli", "scale", "--coordinator", stack.coordinator, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def running_on(names: list[str]) -> Callable[[dict[str, Any]], bool]:
    def ok(status: dict[str, Any]) -> bool:
        workers = sorted(w["node_id"] for w in status["workers"])
        return status["state"] == "running" and workers == names and not status["failed_workers"]

    return ok


async def test_scale_out_in_and_a_lost_worker_under_load(tmp_path: Path) -> None:
    env = {
        "STYX_LOG_LEVEL": "WARNING",
        "STYX_SNAPSHOT_INTERVAL_S": "0.5",
        "STYX_FAILURE_TIMEOUT_MS": "1000",
        "STYX_TAKEOVER_AFTER_MS": "4000",
    }
    stack = LocalStack(tmp_path, workers=2, env=env)
    await asyncio.to_thread(stack.start)
    sent: list[str] = []
    try:
        await asyncio.to_thread(stack.deploy, "styx_benchmarks.bank:app")
        async with await StyxClient.connect(stack.coordinator, timeout_s=180) as client:
            await asyncio.gather(
                *(client.submit("account", f"a{i}", "deposit", INITIAL) for i in range(ACCOUNTS))
            )
            stop = asyncio.Event()

            async def load() -> None:
                rng = random.Random(18)
                window = asyncio.Semaphore(100)
                pending: set[asyncio.Task[Any]] = set()

                async def one(rid: str, a: int, b: int, amount: int) -> None:
                    async with window:
                        await client.submit("account", f"a{a}", "transfer", f"a{b}", amount, request_id=rid)

                while not stop.is_set():
                    a, b = rng.sample(range(ACCOUNTS), 2)
                    rid = uuid.uuid4().hex
                    sent.append(rid)
                    task = asyncio.create_task(one(rid, a, b, rng.randint(1, 50)))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                    await asyncio.sleep(0.005)  # the load's pace: ~200 transfers/s
                await asyncio.gather(*pending)

            load_task = asyncio.create_task(load())
            # The CLI, as an operator would. The workers are started below (here, not by 'styx up').
            out = await styx_scale(stack, "--workers", "4", "--no-wait")
            assert "waiting for 2 more workers to register" in out, out
            await asyncio.to_thread(stack.wait_for, running_on(["w1", "w2", "w3", "w4"]), "on 4 workers")
            out = await styx_scale(stack, "--workers", "3")  # returns once the cluster runs on 3
            assert "draining w4" in out, out
            assert re.search(r"^workers now: w1, w2, w3 \(running, .*; \d+ partitions? moved", out, re.M), out
            on_3 = running_on(["w1", "w2", "w3"])
            # w4 exits with code 0 once it handed over, and is not restarted.
            await asyncio.to_thread(stack.wait_for, lambda st: on_3(st) and "w4" in stack.left, "w4 gone")
            # w2 is lost for good: killed and never restarted (no supervising: it would start a new one).
            stack.procs.pop("w2").kill()
            survivors = running_on(["w1", "w3"])
            await asyncio.to_thread(stack.wait_for, survivors, "taken over by w1, w3", supervise=False)
            stop.set()
            await load_task
            total = sum(
                await asyncio.gather(*(client.call("account", f"a{i}", "balance") for i in range(ACCOUNTS)))
            )
            rewritten = client.stats.rewritten
        assert total == ACCOUNTS * INITIAL
        status = await admin(stack.coordinator, StatusRequest(), secret=stack.secret)
        events = status["shape_changes"]
        assert sorted(n for e in events for n in e["added"]) == ["w3", "w4"], events
        assert [e["removed"] for e in events if e["removed"]] == [["w4"], ["w2"]], events
        # The drain moved partitions at a barrier (a join may land during another one's recovery: then
        # by a full recovery); the loss always by a full recovery.
        assert [e["barrier"] for e in events if e["removed"]] == [True, False], events
        logged = await read_replies(lambda: read_topic(stack.kafka, "styx-egress"), sent)
        counts = Counter(r.request_id for r in logged)
        twice = [rid for rid in sent if counts[rid] != 1]
        assert not twice, (
            f"{len(twice)} of {len(sent)} transfers answered {Counter(counts[r] for r in twice)} times; "
            f"the client wrote {rewritten} requests again"
        )
    finally:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(stack.stop)
