"""Pending timers and external calls in the gateway and its console, on a real cluster running the
reservation app (styx_benchmarks.reservations) against a payment service that never answers (a socket
that listens and accepts nothing: each attempt waits for its timeout), so a hold's charge stays pending
and its expiry timer too: the workers' counts and the entities they name in ``GET /v1/cluster``,
``GET /v1/effects`` for one entity, and the console's view of them in headless Chromium.
"""

from __future__ import annotations

import asyncio
import socket
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from styx_benchmarks import reservations
from styx_py.core.effectids import owner_of
from styx_py.stack.local import LocalStack
from styx_py.stack.screenshot import find_browser
from styx_py.stack.services import TansuBroker
from tests.browser import Browser
from tests.service_fixtures import start_cluster
from tests.test_gateway import TOKEN, GatewayThread, client_for, config, invocation, wait_ready, wait_until

pytestmark = [pytest.mark.timeout(180), pytest.mark.services]

SEAT = "s1"
OWNER = owner_of("seat", SEAT)


@pytest.fixture(scope="module")
def silent_payments() -> Iterator[str]:
    """A payment service URL whose requests are never answered (connections wait in the backlog)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with pytest.MonkeyPatch.context() as env:
            env.setenv(reservations.PAYMENTS_URL_ENV, url)  # the cluster's processes inherit it
            yield url


@pytest.fixture(scope="module")
def cluster(
    kafka: TansuBroker, tmp_path_factory: pytest.TempPathFactory, silent_payments: str
) -> Iterator[LocalStack]:
    path = tmp_path_factory.mktemp("effects-console")
    with start_cluster(path, kafka, app="styx_benchmarks.reservations:app") as stack:
        yield stack


@pytest.fixture(scope="module")
def gateway(cluster: LocalStack) -> Iterator[GatewayThread]:
    with GatewayThread(config(cluster, token=TOKEN, state_functions={})) as gt:
        yield gt


@pytest.fixture(scope="module")
def held(gateway: GatewayThread) -> dict[str, Any]:
    """A hold on the seat (its charge pending, its timer an hour away), once the workers report it."""

    async def run() -> dict[str, Any]:
        async with client_for(gateway.url, TOKEN) as http:
            await wait_ready(http)
            body = invocation(SEAT, "hold", "u1", 25, 3600.0, operator="seat")
            answer = await http.post("/v1/invocations", json=body)
            assert answer.status_code == 200, answer.text

            async def reported() -> bool:
                workers = (await http.get("/v1/cluster")).json()["status"]["workers"]
                return any(OWNER in w["pending_owners"] and w["timers_pending"] >= 1 for w in workers)

            await wait_until(reported)
            return dict(answer.json())

    return asyncio.run(run())


async def test_the_pending_call_and_timer_of_an_entity(gateway: GatewayThread, held: dict[str, Any]) -> None:
    charge = held["result"]
    async with client_for(gateway.url, TOKEN) as http:
        workers = (await http.get("/v1/cluster")).json()["status"]["workers"]
        assert sum(w["external_calls_pending"] for w in workers) == 1
        assert sum(w["timers_pending"] for w in workers) == 1
        by_key = (await http.get("/v1/effects", params={"operator": "seat", "key": SEAT})).json()
        by_owner = (await http.get("/v1/effects", params={"owner": OWNER})).json()
        none = (await http.get("/v1/effects", params={"operator": "seat", "key": "s2"})).json()
        missing = await http.get("/v1/effects", params={"operator": "seat"})
        assert (await client_for(gateway.url).get("/v1/effects", params={"owner": OWNER})).status_code == 401
    assert by_key["owner"] == OWNER and by_key["calls"] == by_owner["calls"]
    [call] = by_key["calls"]
    assert (call["id"], call["service"], call["function"], call["args"]) == (
        charge,
        "payments",
        "charge",
        ["u1", 25],
    )
    assert call["then"] == f"seat.paid({SEAT!r})"
    [timer] = by_key["timers"]
    assert timer["target"] == f"seat.expire({SEAT!r})" and timer["args"] == [charge]
    assert 3000 < timer["due_in_s"] <= 3600
    assert (none["calls"], none["timers"]) == ([], [])
    assert missing.status_code == 422 and missing.json()["error"]["code"] == "invalid_request"


def test_the_console_shows_pending_timers_and_calls(
    gateway: GatewayThread, held: dict[str, Any], tmp_path: Path
) -> None:
    browser = find_browser()
    if browser is None:
        pytest.skip("no Chromium installed (Debian: apt-get install chromium; make test installs it)")
    charge = held["result"]
    with Browser(browser) as page:
        page.goto(f"{gateway.url}/console#/effects?token={TOKEN}")
        page.wait("#effect-counts tr[data-effects-worker]")
        counts = "[...document.querySelectorAll('tr[data-effects-worker]')].map(r => +r.dataset.timers)"
        assert sum(page.eval(counts)) == 1
        page.click(f'li[data-owner="{OWNER}"] a')
        page.wait("#pending-timers tr[data-timer] td:nth-child(4)", f"seat.expire({SEAT!r})")
        assert page.text("#owner") == OWNER
        assert page.attr(f'#pending-calls tr[data-call="{charge}"]', "data-call") == charge
        assert urllib.parse.unquote(page.eval("location.hash")) == f"#/effects?owner={OWNER}"

        # From the entity: its value shows the hold, and its link opens the same view.
        page.goto(f"{gateway.url}/console#/entity?operator=seat&key={SEAT}&key_type=str")
        page.wait("#value")
        page.click("#to-effects")
        page.wait("#pending-calls tr[data-call]")
        assert page.text("#owner") == OWNER
