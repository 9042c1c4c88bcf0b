"""Consistent state reads on real processes (Tansu, a coordinator, two workers): ``client.scan`` while
YCSB-T transfers run, ``GET /v1/state/{operator}`` by pages with its cursor, and ``styx state``.

Every scan must sum to the conserved total at its epoch (50 scans, while transfers commit), the pages
of one HTTP scan must all name one epoch, an epoch older than the window must be refused by name.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import httpx
import pytest

from styx_client import StyxClient
from styx_client.gateway import Gateway, GatewayConfig
from styx_py.cli import main as styx_main
from styx_py.core.errors import EpochOutOfWindow
from styx_py.stack.local import LocalStack
from tests.service_fixtures import ClusterFactory

pytestmark = pytest.mark.services

ACCOUNTS, INITIAL, WINDOW = 200, 1000, 400


@pytest.fixture
def stack(local_cluster: ClusterFactory) -> LocalStack:
    return local_cluster(app="styx_benchmarks.bank:app", settings={"state_window_epochs": str(WINDOW)})


async def _transfers(client: StyxClient, names: list[str], stop: asyncio.Event, rate: float) -> int:
    """YCSB-T transfers at about ``rate`` a second until ``stop``; how many were sent."""
    rng, sent, pending = random.Random(1), 0, set()
    while not stop.is_set():
        src, dst = rng.sample(names, 2)
        task = asyncio.ensure_future(client.submit("account", src, "transfer", dst, rng.randint(1, 20)))
        pending.add(task)
        task.add_done_callback(pending.discard)
        sent += 1
        await asyncio.sleep(1 / rate)
    await asyncio.gather(*pending)
    return sent


async def test_scans_during_transfers_sum_to_the_total_over_the_sdk_http_and_cli(
    stack: LocalStack, capsys: pytest.CaptureFixture[str]
) -> None:
    names = [f"acct{i}" for i in range(ACCOUNTS)]
    async with await StyxClient.connect(stack.coordinator) as client:
        opened = await client.submit("account", "loader", "open_accounts", names, INITIAL)
        assert opened.committed and client.newest_epoch == opened.epoch
        # The reply can leave before its epoch is over; a scan right after it still sees its writes.
        epoch, rows = await client.scan("account", prefix="acct")
        assert epoch >= opened.epoch and len(rows) == ACCOUNTS, (epoch, opened.epoch, len(rows))
        stop = asyncio.Event()
        load = asyncio.ensure_future(_transfers(client, names, stop, rate=200))
        epochs: list[int] = []
        try:
            for _ in range(50):
                epoch, rows = await client.scan("account", prefix="acct")
                assert len(rows) == ACCOUNTS and sum(v for _, v in rows) == ACCOUNTS * INITIAL, epoch
                epochs.append(epoch)
            first = epochs[0]
            config = GatewayConfig(stack.coordinator, port=0, cluster_secret=stack.secret)
            gateway = Gateway(config)
            transport = httpx.ASGITransport(app=gateway.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
                seen: list[Any] = []
                cursor, page_epochs = None, set()
                while True:
                    params: dict[str, Any] = {"limit": 60} | ({"cursor": cursor} if cursor else {})
                    r = await http.get("/v1/state/account", params=params)
                    assert r.status_code == 200, r.text
                    body = r.json()
                    page_epochs.add(body["epoch"])
                    seen += body["items"]
                    cursor = body["cursor"]
                    if cursor is None:
                        break
                assert len(page_epochs) == 1 and len(seen) == ACCOUNTS
                assert sum(item["value"] for item in seen) == ACCOUNTS * INITIAL
                one = await http.get(f"/v1/state/account/{names[0]}/stored", params={"as_of_epoch": first})
                assert one.status_code == 200 and one.json()["found"] and one.json()["epoch"] == first
                missing = await http.get("/v1/state/account/nobody/stored")
                assert missing.status_code == 200 and missing.json()["found"] is False
                assert (await http.get("/v1/state/nope")).json()["error"]["code"] == "unknown_operator"
        finally:
            stop.set()
            sent = await load
        assert sent > 0 and epochs[-1] > epochs[0], "the scans should see transfers commit"
        # Quiet now: styx state list sums to the total; get names an epoch too.
        at = ["--coordinator", stack.coordinator]
        newest = ["--min-epoch", str(client.newest_epoch)]
        assert await asyncio.to_thread(styx_main, ["state", "list", "account", "--json", *newest, *at]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert listed["epoch"] >= client.newest_epoch
        assert listed["rows"] == ACCOUNTS and sum(i["value"] for i in listed["items"]) == ACCOUNTS * INITIAL
        assert await asyncio.to_thread(styx_main, ["state", "get", "account", "nobody", *at]) == 3
        capsys.readouterr()
        # Past the window: transfers until the first scan's epoch is out of it, then refused by name.
        while (await client.scan("account", limit=1))[0] - first < WINDOW:
            await asyncio.gather(*(client.submit("account", n, "transfer", names[0], 1) for n in names[1:20]))
        with pytest.raises(EpochOutOfWindow):
            await client.scan("account", as_of_epoch=first)
        argv = ["state", "get", "account", names[0], "--as-of-epoch", str(first)]
        code = await asyncio.to_thread(styx_main, [*argv, *at])
        assert code == 4 and "styx sql --as-of-epoch" in capsys.readouterr().err
