"""The invocation listing, the cluster view and the web console of the gateway, on a real cluster (bank
app, 2 workers, a gateway with a token): the listing and the view of one invocation over HTTP,
``styx invocations list`` and ``styx console``, a click-through of the console in headless Chromium
(cluster → the list, filtered → an invocation found by its id → its entity), asserting on what the
page's own scripts built, and docs/http-api.md's examples run as written. The window and the history alone:
``tests/test_gateway_recent.py``.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from styx_benchmarks.screenshots import console_shots
from styx_py.core.wire import StatusRequest
from styx_py.stack.local import LocalStack, admin
from styx_py.stack.screenshot import find_browser
from styx_py.stack.services import TansuBroker
from tests.browser import Browser
from tests.service_fixtures import start_cluster
from tests.test_gateway import TOKEN, GatewayThread, client_for, config, invocation, wait_ready, wait_until

pytestmark = [pytest.mark.timeout(180)]


# ---- on a real cluster --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(kafka: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with start_cluster(
        tmp_path_factory.mktemp("console-stack"), kafka, app="styx_benchmarks.bank:app"
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def gateway(cluster: LocalStack) -> Iterator[GatewayThread]:
    with GatewayThread(config(cluster, token=TOKEN)) as gt:
        yield gt


class Traffic:
    """What the module's invocations were: ids of the committed deposits and of the aborted transfers."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.deposits: dict[str, dict[str, Any]] = {}
        self.aborted: list[str] = []
        self.moved = f"move-{tag}"  # a committed transfer: a call graph of two entities


@pytest.fixture(scope="module")
def traffic(gateway: GatewayThread) -> Traffic:
    """Deposits into a few accounts, then transfers larger than their balances (aborted), then one
    that commits (its deposit into another account is a call of its transaction)."""
    seen = Traffic(uuid.uuid4().hex[:8])

    async def run() -> None:
        async with client_for(gateway.url, TOKEN) as http:
            await wait_ready(http)
            for i in range(6):
                rid = f"dep-{seen.tag}-{i}"
                body = invocation(f"{seen.tag}-{i % 3}", "deposit", 10 + i)
                answer = await http.post("/v1/invocations", json=body, headers={"Idempotency-Key": rid})
                assert answer.status_code == 200, answer.text
                seen.deposits[rid] = answer.json()
            for i in range(3):
                rid = f"over-{seen.tag}-{i}"
                body = invocation(f"{seen.tag}-{i}", "transfer", f"{seen.tag}-x", 10_000)
                answer = await http.post("/v1/invocations", json=body, headers={"Idempotency-Key": rid})
                assert answer.status_code == 409, answer.text
                seen.aborted.append(rid)
            body = invocation(f"{seen.tag}-1", "transfer", f"{seen.tag}-2", 1)
            answer = await http.post("/v1/invocations", json=body, headers={"Idempotency-Key": seen.moved})
            assert answer.status_code == 200, answer.text

    asyncio.run(run())
    return seen


@pytest.mark.services
async def test_listing_filters_pages_and_views_over_http(gateway: GatewayThread, traffic: Traffic) -> None:
    async with client_for(gateway.url, TOKEN) as http:
        assert (await client_for(gateway.url).get("/v1/invocations")).status_code == 401
        page = (await http.get("/v1/invocations", params={"limit": 500})).json()
        ours = [i for i in page["invocations"] if traffic.tag in i["request_id"]]
        assert [i["request_id"] for i in ours] == [
            traffic.moved,
            *reversed(traffic.aborted),
            *reversed(traffic.deposits),
        ]
        assert page["window"] == 1000 and page["retained"] >= len(ours)

        aborted = (await http.get("/v1/invocations", params={"status": "aborted"})).json()["invocations"]
        assert {i["request_id"] for i in aborted} >= set(traffic.aborted)
        assert all(i["status"] == "aborted" and i["error"] for i in aborted)
        assert (await http.get("/v1/invocations", params={"operator": "nothing"})).json()["invocations"] == []
        bad = await http.get("/v1/invocations", params={"status": "done"})
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"

        listed: list[str] = []
        after: str | None = None
        while True:
            params: dict[str, str | int] = {
                "limit": 2,
                "status": "committed",
                **({"after": after} if after else {}),
            }
            body = (await http.get("/v1/invocations", params=params)).json()
            listed += [i["request_id"] for i in body["invocations"]]
            after = body["next_after"]
            if after is None:
                break
        assert len(listed) == len(set(listed)) and set(traffic.deposits) <= set(listed)

        rid, reply = next(iter(traffic.deposits.items()))
        view = (await http.get(f"/v1/invocations/{rid}/view")).json()
        assert view["source"] == "gateway" and view["status"] == "committed"
        assert (view["operator"], view["key"], view["function"], view["args"]) == (
            "account",
            f"{traffic.tag}-0",
            "deposit",
            [10],
        )
        assert (view["epoch"], view["tid"], view["phase"], view["result"]) == (
            reply["epoch"],
            reply["tid"],
            reply["phase"],
            reply["result"],
        )
        assert view["entities"] == [{"operator": "account", "key": f"{traffic.tag}-0", "wrote": True}]
        assert [c["path"] for c in view["calls"]] == [[]] and view["graph_complete"]

        moved = (await http.get(f"/v1/invocations/{traffic.moved}/view")).json()
        assert moved["calls"] == transfer_graph(traffic), moved
        assert moved["entities"] == [
            {"operator": "account", "key": f"{traffic.tag}-1", "wrote": True},
            {"operator": "account", "key": f"{traffic.tag}-2", "wrote": True},
        ]
        aborted = (await http.get(f"/v1/invocations/{traffic.aborted[0]}/view")).json()
        assert [(c["path"], c["status"], c["wrote"]) for c in aborted["calls"]] == [([], "abort", False)]
        unknown = await http.get(f"/v1/invocations/none-{traffic.tag}/view")
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_request"


def transfer_graph(traffic: Traffic) -> list[dict[str, Any]]:
    """The call graph of the committed transfer: the root and the deposit it called."""
    root = {"operator": "account", "key": f"{traffic.tag}-1", "function": "transfer"}
    deposit = {"operator": "account", "key": f"{traffic.tag}-2", "function": "deposit"}
    return [
        {"path": [], **root, "status": "ok", "wrote": True},
        {"path": [0], **deposit, "status": "ok", "wrote": True},
    ]


@pytest.mark.services
async def test_another_replica_views_an_invocation_from_the_cluster(
    cluster: LocalStack, traffic: Traffic
) -> None:
    """A second gateway never sent it: the view has the cluster's reply and call graph, not the call."""
    rid, reply = next(iter(traffic.deposits.items()))
    with GatewayThread(config(cluster)) as other:
        async with client_for(other.url) as http:
            await wait_ready(http)
            view = (await http.get(f"/v1/invocations/{rid}/view")).json()
            moved = (await http.get(f"/v1/invocations/{traffic.moved}/view")).json()
    assert moved["source"] == "cluster" and moved["calls"] == transfer_graph(traffic)
    assert view["source"] == "cluster" and view["operator"] is None
    assert (view["status"], view["epoch"], view["tid"], view["result"]) == (
        "committed",
        reply["epoch"],
        reply["tid"],
        reply["result"],
    )


@pytest.mark.services
async def test_another_replica_lists_the_clusters_invocations(cluster: LocalStack, traffic: Traffic) -> None:
    """A second gateway's own window is empty; scope=cluster lists what the workers retain: the first
    gateway's invocations too, with their call and reply, newest first in the serial order."""
    with GatewayThread(config(cluster)) as other:
        async with client_for(other.url) as http:
            await wait_ready(http)
            own = (await http.get("/v1/invocations")).json()
            page = (await http.get("/v1/invocations", params={"scope": "cluster", "limit": 500})).json()
            aborted = (
                await http.get("/v1/invocations", params={"scope": "cluster", "status": "aborted"})
            ).json()
            nothing = (await http.get("/v1/invocations", params={"scope": "cluster", "operator": "x"})).json()
        styx = [sys.executable, "-m", "styx_py.cli", "invocations", "list", "--gateway", other.url]
        argv = [*styx, "--cluster"]
        table = await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, text=True, timeout=60, check=False
        )
    assert own["invocations"] == [] and own["scope"] == "gateway"
    assert page["scope"] == "cluster" and page["complete"] and page["next_after"] is None
    listed = {i["request_id"]: i for i in page["invocations"]}
    ours = [rid for rid in listed if traffic.tag in rid]
    assert ours[:1] == [traffic.moved] and set(ours) == {traffic.moved, *traffic.aborted, *traffic.deposits}
    order = [(i["epoch"], i["phase"], i["tid"]) for i in page["invocations"]]
    assert order == sorted(order, reverse=True)
    moved = listed[traffic.moved]
    assert (moved["operator"], moved["key"], moved["function"], moved["status"], moved["source"]) == (
        "account",
        f"{traffic.tag}-1",
        "transfer",
        "committed",
        "cluster",
    )
    for rid, reply in traffic.deposits.items():
        assert (listed[rid]["epoch"], listed[rid]["tid"], listed[rid]["result"]) == (
            reply["epoch"],
            reply["tid"],
            reply["result"],
        )
    assert {i["status"] for i in aborted["invocations"]} == {"aborted"}
    assert set(traffic.aborted) <= {i["request_id"] for i in aborted["invocations"]}
    assert nothing["invocations"] == []
    assert table.returncode == 0 and traffic.moved in table.stdout, table.stdout + table.stderr
    assert "recent transactions the workers retain" in table.stdout.splitlines()[-1]


@pytest.mark.services
async def test_cluster_view_has_the_workers_and_a_history(
    cluster: LocalStack, gateway: GatewayThread, traffic: Traffic
) -> None:
    async with client_for(gateway.url, TOKEN) as http:

        async def sampled() -> bool:
            return len((await http.get("/v1/cluster")).json()["history"]) >= 1

        await wait_until(sampled)
        view = (await http.get("/v1/cluster")).json()
    status = await admin(cluster.coordinator, StatusRequest())
    assert [w["node_id"] for w in view["status"]["workers"]] == [w["node_id"] for w in status["workers"]]
    assert view["summary"]["ready"] and view["gateway"]["window"] == 1000
    assert view["status"]["epoch_seconds"]["count"] >= 1
    sample = view["history"][-1]
    assert sample["workers"] == 2 and sample["epochs_per_s"] >= 0


@pytest.mark.services
def test_styx_invocations_list(gateway: GatewayThread, traffic: Traffic, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    styx = [sys.executable, "-m", "styx_py.cli", "invocations", "list", "--gateway", gateway.url]
    done = subprocess.run(
        [*styx, "--token-file", str(token), "--status", "aborted", "--limit", "100"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == [
        "REQUEST",
        "ID",
        "STATUS",
        "OPERATOR",
        "KEY",
        "FUNCTION",
        "EPOCH",
        "TID",
        "MS",
    ]
    rows = {line.split()[0]: line.split() for line in lines[1:] if line and not line.startswith("(")}
    assert set(traffic.aborted) <= set(rows) and all(r[1] == "aborted" for r in rows.values())
    as_json = subprocess.run(
        [*styx, "--token-file", str(token), "--json", "--limit", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert as_json.returncode == 0 and len(msgspec.json.decode(as_json.stdout)["invocations"]) == 3
    unauthorized = subprocess.run([*styx], capture_output=True, text=True, timeout=60, check=False)
    assert unauthorized.returncode == 2 and "401" in unauthorized.stderr, unauthorized.stderr
    paged = subprocess.run(
        [*styx, "--token-file", str(token), "--limit", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert paged.returncode == 0 and "; older: --after " in paged.stdout.splitlines()[-1], paged.stdout
    get = [sys.executable, "-m", "styx_py.cli", "invocations", "get", "--gateway", gateway.url]
    graph = subprocess.run(
        [*get, traffic.moved, "--graph", "--token-file", str(token)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert graph.returncode == 0, graph.stderr
    assert msgspec.json.decode(graph.stdout)["calls"] == transfer_graph(traffic)
    assert graph.stderr.splitlines() == [
        f"root: account/{traffic.tag}-1.transfer ok, wrote",
        f"  0: account/{traffic.tag}-2.deposit ok, wrote",
    ]


@pytest.mark.services
def test_styx_console_prints_the_url(gateway: GatewayThread) -> None:
    console = [sys.executable, "-m", "styx_py.cli", "console"]
    done = subprocess.run([*console, "--gateway", gateway.url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"{gateway.url}/console", done
    nowhere = subprocess.run(
        [*console, "--gateway", "http://127.0.0.1:9"], capture_output=True, text=True, timeout=60
    )
    assert nowhere.returncode == 2 and nowhere.stderr.startswith("styx: error: cannot reach the gateway"), (
        nowhere
    )


# ---- the console in headless Chromium ----------------------------------------------------------------


SVG_NS = "http://www.w3.org/2000/svg"  # a name for the SVG elements the charts create, never fetched
ROWS = (
    "Object.fromEntries([...document.querySelectorAll('tr[data-worker]')]"
    ".map(r => [r.dataset.worker, r.dataset.partitions]))"
)
STATUSES = "[...document.querySelectorAll('tr[data-request-id]')].map(r => r.dataset.status)"
IDS = "[...document.querySelectorAll('tr[data-request-id]')].map(r => r.dataset.requestId)"
CALLS = (
    "[...document.querySelectorAll('#calls tr[data-path]')]"
    ".map(r => (r.dataset.path || 'root') + ':' + r.dataset.status)"
)
SHOWN = "document.body.dataset.shown === '{}'"  # the page has rendered the view of this address


@pytest.mark.services
def test_console_walkthrough_in_headless_chromium(
    cluster: LocalStack, gateway: GatewayThread, traffic: Traffic, tmp_path: Path
) -> None:
    """Clicks through the console as a user does (mouse clicks, the filter form), over the DevTools
    protocol: cluster → the invocation list, filtered → an invocation found by its id → its entity."""
    browser = find_browser()
    if browser is None:
        pytest.skip("no Chromium installed (Debian: apt-get install chromium; make test installs it)")
    # The page, its script and style come from the gateway, without the token; its data needs it.
    for asset in ("/console", "/console-assets/console.js", "/console-assets/console.css"):
        served = httpx.get(f"{gateway.url}{asset}", timeout=10)
        others = re.findall(r"https?://[^\s\"')]+", served.text.replace(SVG_NS, ""))
        assert served.status_code == 200 and not others, (asset, others)
    assert httpx.get(f"{gateway.url}/v1/cluster", timeout=10).status_code == 401
    status = cluster.status()
    rid, reply = next(iter(traffic.deposits.items()))

    with Browser(browser) as page:
        # Cluster: every worker with the partitions the coordinator says it owns.
        page.goto(f"{gateway.url}/console#/cluster?token={TOKEN}")  # as `styx console` would hand it out
        page.wait("tr[data-worker]")
        assert page.eval("location.hash") == "#/cluster", "the token stays in the address bar"
        assert page.eval(ROWS) == {
            w["node_id"]: ",".join(map(str, w["partitions"])) for w in status["workers"]
        }
        assert page.text('[data-field="state"]') == "running"

        # The list, filtered by status with the form.
        page.click("#to-invocations")
        page.wait("table#invocations")
        page.select('select[name="status"]', "aborted")
        page.click("form.filters button")
        page.until(SHOWN.format("#/invocations?status=aborted"), "the aborted invocations")
        assert set(page.eval(STATUSES)) == {"aborted"}
        assert set(traffic.aborted) <= set(page.eval(IDS))

        # All of them again (the menu), and the invocation found by its id; its link opens it.
        page.click('nav a[data-nav="invocations"]')
        page.until(SHOWN.format("#/invocations"), "every invocation")
        assert page.attr(f'tr[data-request-id="{rid}"]', "data-status") == "committed"
        page.click(f'tr[data-request-id="{rid}"] a')
        page.wait("#request-id", rid)
        assert page.text('[data-field="status"]') == "committed"
        assert page.text('[data-field="epoch"]') == str(reply["epoch"])
        assert page.text('[data-field="tid"]') == str(reply["tid"])
        assert page.text('[data-field="phase"]').startswith(str(reply["phase"]))
        assert msgspec.json.decode(page.text("#reply")) == reply["result"]
        entity_key = f"{traffic.tag}-0"
        assert page.text("#to-entity") == f"account/{entity_key}"

        # The entity: its value, read through the state route as the page does.
        page.click("#to-entity")
        page.wait("#value")
        assert page.text("#entity") == f"account/{entity_key}"
        balance = sum(10 + i for i in range(6) if i % 3 == 0)  # the deposits into account <tag>-0
        assert msgspec.json.decode(page.attr("#value", "data-value") or "null") == balance
        assert urllib.parse.parse_qs(page.eval("location.hash").split("?", 1)[1])["key"] == [entity_key]

        # The whole cluster's recent transactions (the scope select), where the committed transfer
        # is the newest of ours; it opens: its call graph and the entities it touched; one of them opens.
        page.click('nav a[data-nav="invocations"]')
        page.until(SHOWN.format("#/invocations"), "every invocation")
        page.select('select[name="scope"]', "cluster")
        page.click("form.filters button")
        page.until(SHOWN.format("#/invocations?scope=cluster"), "the cluster's invocations")
        assert "recent transactions the workers retain" in page.text("#scope-note")
        assert next(i for i in page.eval(IDS) if traffic.tag in i) == traffic.moved
        page.click(f'tr[data-request-id="{traffic.moved}"] a')
        page.wait("#request-id", traffic.moved)
        page.wait("table#calls")
        assert page.eval(CALLS) == ["root:ok", "0:ok"]
        touched = f"account/{traffic.tag}-2"
        assert page.attr(f'li[data-entity="{touched}"]', "data-wrote") == "true"
        page.click(f'li[data-entity="{touched}"] a')
        page.wait("#value")
        assert page.text("#entity") == touched
        moved_into = sum(10 + i for i in range(6) if i % 3 == 2) + 1  # its deposits and the transfer
        assert msgspec.json.decode(page.attr("#value", "data-value") or "null") == moved_into

    # The same pages render as images at desktop and phone widths (the docs' screenshots).
    for png in console_shots(gateway.url, tmp_path, rid, TOKEN):
        assert png.stat().st_size > 10_000, png


# ---- the HTTP docs' examples, run as written ------------------------------------------------------------


@pytest.mark.services
def test_the_http_api_examples_run_as_written(cluster: LocalStack, tmp_path: Path) -> None:
    """docs/http-api.md's curl walk-through (the blocks that use ``$GW``), in order, in one shell, against
    a fresh gateway without a token: each exits 0 and prints what its ``# {...}`` comment says."""
    from tests.test_readme import commands, expected_json, run_script

    text = (Path(__file__).resolve().parent.parent / "docs" / "http-api.md").read_text()
    blocks = [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "$GW" in b]
    steps = [(c, comment) for block in blocks for c, comment in commands(block)]
    assert steps[0][0].startswith("GW=") and any("/view" in c for c, _ in steps), steps
    with GatewayThread(config(cluster)) as gt:
        asyncio.run(_ready(gt.url))
        script = [f"GW={gt.url}" if c.startswith("GW=") else c for c, _ in steps]
        results = run_script(script, tmp_path, tmp_path)
    for (command, comment), (rc, output) in zip(steps, results, strict=True):
        assert rc == 0, f"{command!r} exited {rc}:\n{output}"
        expected = expected_json(comment)
        if expected is not None:
            actual = msgspec.json.decode(output.splitlines()[-1])
            assert _matches(actual, expected), f"{command!r} printed {actual}; the docs say {expected}"
    listing = next(out for (c, _), (_, out) in zip(steps, results, strict=True) if "status=aborted" in c)
    assert [i["request_id"] for i in msgspec.json.decode(listing)["invocations"]] == ["pay-43"]
    table = next(out for (c, _), (_, out) in zip(steps, results, strict=True) if "invocations list" in c)
    table = table.splitlines()
    assert table[0].startswith("REQUEST ID") and table[1].split()[:2] == ["pay-43", "aborted"], table


def _matches(actual: Any, expected: Any) -> bool:
    """``actual`` has every value ``expected`` names, at any depth (``None``, the docs' ``…``: any)."""
    if expected is None:
        return True
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and _matches(actual[k], v) for k, v in expected.items()
        )
    return bool(actual == expected)


async def _ready(url: str) -> None:
    async with client_for(url) as http:
        await wait_ready(http)
