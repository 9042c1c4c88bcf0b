"""External calls and timers on real processes: the reservation app (styx_benchmarks.reservations)
against the HTTP payment service (styx_benchmarks.payments), slow, refusing and losing answers, on a
local cluster (Tansu, SeaweedFS, a coordinator and two workers). A worker is SIGKILLed mid-run and
restarted, and the coordinator once; at the end no intent or timer is pending, the ledger shows every
key taking effect once, and the reservation check (no double charge, no seat both held and sold, every
hold ended, every charge kept by a sale or refunded) passes on the state."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from styx_benchmarks import reservations
from styx_benchmarks.payments import Knobs, serve_in_thread
from styx_client import StyxClient
from styx_py.cli import format_status
from styx_py.core.effectids import OUTBOX, TIMERS, owner_of
from styx_py.core.wire import StatusRequest
from styx_py.stack.local import LocalStack, admin
from styx_py.stack.services import SeaweedS3
from tests.service_fixtures import ClusterFactory
from tests.test_chaos import audit

pytestmark = pytest.mark.services

SEATS = 40
HOLDS = 400
RATE = 100.0  # holds a second


@pytest.fixture
def payments_url() -> Iterator[str]:
    with serve_in_thread(Knobs(delay_ms=20, fail=0.1, lose=0.1)) as url, pytest.MonkeyPatch.context() as env:
        env.setenv(reservations.PAYMENTS_URL_ENV, url)  # the cluster's processes inherit it
        yield url


@pytest.fixture
def stack(local_cluster: ClusterFactory, s3: SeaweedS3, payments_url: str) -> LocalStack:
    settings = {"snapshot_interval_s": "0.5"}
    return local_cluster(app="styx_benchmarks.reservations:app", s3=s3, settings=settings)


async def _pending(client: StyxClient) -> int:
    """Intents and timers still pending for any seat."""
    calls = [
        client.call(op, owner_of("seat", f"s{i}"), "pending") for op in (OUTBOX, TIMERS) for i in range(SEATS)
    ]
    return sum(len(p or {}) for p in await asyncio.gather(*calls))


async def test_reservations_with_a_worker_and_the_coordinator_killed(
    stack: LocalStack, payments_url: str
) -> None:
    rng = random.Random(3)
    async with await StyxClient.connect(stack.coordinator, timeout_s=300, max_pending=100_000) as client:
        loop = asyncio.get_running_loop()
        start = loop.time()
        tasks = []
        for i in range(HOLDS):
            delay = start + i / RATE - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)  # open-loop pacing
            if i == HOLDS // 3:
                stack.kill("w1")  # SIGKILL, then restarted as a supervisor would
                stack.start_worker("w1")
            if i == 2 * HOLDS // 3:
                stack.kill("coordinator")
                stack.start_coordinator()
            ttl = rng.choice([0.05, 0.5, 30.0])
            args = (f"u{i % 7}", rng.randint(1, 100), ttl)
            tasks.append(
                asyncio.create_task(client.submit("seat", f"s{rng.randrange(SEATS)}", "hold", *args))
            )
        replies = await asyncio.gather(*tasks)
        assert all(r.status == "committed" for r in replies)
        deadline = loop.time() + 240
        while (left := await _pending(client)) > 0:  # polling the state, bounded by the deadline
            assert loop.time() < deadline, f"{left} external calls and timers still pending"
            await asyncio.sleep(0.2)
        status = await admin(stack.coordinator, StatusRequest())
        assert all("external_calls_pending" in w and "timers_pending" in w for w in status["workers"])
        assert "external calls pending" in format_status(status)
        seats = await asyncio.gather(*(client.call("seat", f"s{i}", "look") for i in range(SEATS)))
        users = await asyncio.gather(*(client.call("user", f"u{i}", "look") for i in range(7)))
    state: dict[tuple[str, Any], Any] = {("seat", f"s{i}"): s for i, s in enumerate(seats) if s is not None}
    state.update({("user", f"u{i}"): u for i, u in enumerate(users) if u is not None})
    async with httpx.AsyncClient() as http:
        ledger = (await http.get(f"{payments_url}/ledger")).json()
        stats = (await http.get(f"{payments_url}/stats")).json()
    assert ledger, "no payment reached the service"
    assert all(entry["effects"] == 1 for entry in ledger.values()), "a key took effect twice"
    reservations.check(state, ledger)
    sold = sum(s["state"] == "sold" for s in seats if s)
    print(f"ledger {len(ledger)} keys, service {stats}, seats sold {sold}")
    # The audit of the run: the replay finds every intent completed once and every timer fired in time.
    report = await audit(stack, "styx_benchmarks.reservations:app")
    for check in ("effects.response", "effects.continuation", "timers.fired", "serial.outcome"):
        assert re.search(rf"\| `{re.escape(check)}` \| [^|]* \| 0 \| 0 \| pass \|", report), report[:3000]
