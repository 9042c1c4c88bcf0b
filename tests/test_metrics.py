"""Prometheus endpoints of the coordinator, the workers and the gateway.

The endpoint itself over real HTTP (``/metrics``, ``/healthz``, ``/readyz``, errors, a bounded head),
then a real local cluster (Tansu + SeaweedFS + coordinator + 2 workers + gateway): after a few
transactions of every outcome, every process is scraped and the numbers must reflect them, and every
metric the Grafana dashboard uses must exist in a scrape.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from styx_client import StyxClient
from styx_client.sdk.kafka_transport import KafkaTransport
from styx_py.core.wire import DeployRequest
from styx_py.io.metrics import LoopHistogram, MetricsServer, histogram_family
from styx_py.stack.local import LocalStack, admin
from styx_py.stack.services import SeaweedS3
from tests.service_fixtures import ClusterFactory

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "styx.json"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(scrape: Samples, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in scrape.items() if n == name and want <= set(ls))


async def poll(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.05)


# ---- the endpoint -------------------------------------------------------------------------------------


async def test_metrics_server_answers_probes_and_metrics() -> None:
    registry = CollectorRegistry()
    counter = Counter("styx_test_things", "things", registry=registry)
    counter.inc(3)
    state = {"ready": False}
    server = MetricsServer(registry, lambda: (state["ready"], "warming up"), "127.0.0.1", 0)
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as http:
            metrics = await http.get("/metrics")
            assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
            assert value(samples(metrics.text), "styx_test_things_total") == 3
            assert (await http.get("/healthz")).status_code == 200
            not_ready = await http.get("/readyz")
            assert not_ready.status_code == 503 and "warming up" in not_ready.text
            state["ready"] = True
            assert (await http.get("/readyz?verbose=1")).status_code == 200
            assert (await http.get("/nope")).status_code == 404
            assert (await http.post("/metrics")).status_code == 405
            head = await http.head("/healthz")
            assert head.status_code == 200 and head.content == b""
        # A head larger than the limit is not read to the end: the connection is closed.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 64 * 1024 + b"\r\n\r\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    finally:
        await server.close()


async def test_an_answer_that_raises_is_raised_by_run_not_left_to_the_loop() -> None:
    """A bug in the readiness callback (or a collector) must end the process: run(), one of its
    tasks, raises it, instead of the event loop's default handler logging it while all runs on."""

    def readiness() -> tuple[bool, str]:
        raise KeyError("a bug in readiness")

    server = MetricsServer(CollectorRegistry(), readiness, "127.0.0.1", 0)
    await server.start()
    try:
        running = asyncio.ensure_future(server.run())
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as http:
            with pytest.raises(httpx.RemoteProtocolError):  # closed without an answer
                await http.get("/readyz")
            assert (await http.get("/healthz")).status_code == 200
        with pytest.raises(KeyError, match="a bug in readiness"):
            await asyncio.wait_for(running, 60)
    finally:
        await server.close()


def test_loop_histogram_exposes_what_prometheus_client_would() -> None:
    bounds = (0.001, 0.01, 0.1, 1.0)
    values = [0.0005, 0.001, 0.002, 0.05, 0.1, 0.7, 3.0, 0.01]
    registry = CollectorRegistry()
    reference = Histogram("styx_ref_seconds", "ref", ["phase"], buckets=bounds, registry=registry)
    mine = LoopHistogram(bounds)
    for v in values:
        reference.labels("execute").observe(v)
        mine.observe(v)
    ours = {
        (s.name.replace("styx_mine", "styx_ref"), tuple(sorted(s.labels.items()))): s.value
        for s in histogram_family("styx_mine_seconds", "mine", "phase", {"execute": mine}).samples
    }
    theirs = samples(generate_latest(registry).decode())
    assert ours == {k: v for k, v in theirs.items() if not k[0].endswith("_created")}


# ---- a real cluster -----------------------------------------------------------------------------------


@pytest.fixture
def stack(local_cluster: ClusterFactory, s3: SeaweedS3) -> LocalStack:
    return local_cluster(
        s3=s3,
        # A snapshot every second epoch: the test's requests come in at least two epochs one after
        # the other (the transfers wait for the deposits), so one is certain; with every fifth it
        # depended on how the requests fell into epochs (a fresh-clone CI run saw none in 60 s).
        settings={"snapshot_interval_epochs": "2"},
        gateway=True,
        gateway_args=["--state-function", "account=balance"],
    )


def dashboard_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    exprs += [v["definition"] for v in dashboard["templating"]["list"]]  # the variables' queries
    return {m for e in exprs for m in re.findall(r"\b((?:styx|process)_[a-z0-9_]+)\b", e)}


@pytest.mark.services
async def test_scrape_after_transactions_has_every_dashboard_metric(stack: LocalStack) -> None:
    workers = ["w1", "w2"]
    endpoints = stack.endpoints()
    for name in ["coordinator", *workers]:
        assert endpoints[f"metrics {name}"] == stack.metrics_url(name)  # what `styx up` prints

    async with httpx.AsyncClient(timeout=10) as http:

        async def scrape(name: str) -> Samples:
            url = stack.gateway_url + "/metrics" if name == "gateway" else stack.metrics_url(name)
            response = await http.get(url)
            assert response.status_code == 200
            return samples(response.text)

        async def ready(name: str) -> int:
            return (await http.get(stack.metrics_url(name).replace("/metrics", "/readyz"))).status_code

        assert await ready("coordinator") == 200  # waiting for a deploy is ready
        assert {await ready(w) for w in workers} == {503}  # not part of a deployed cluster yet
        await admin(stack.coordinator, DeployRequest("styx_benchmarks.bank:app"))

        async def all_ready() -> bool:
            return {await ready(w) for w in workers} == {200}

        await poll(all_ready, 30, "workers ready after the deploy")

        async def gateway_ready() -> bool:
            # The gateway connects its client once it has seen the deploy, on its own schedule.
            return (await http.get(stack.gateway_url + "/readyz")).status_code == 200

        await poll(gateway_ready, 30, "gateway ready after the deploy")

        # Transactions of every outcome: commits, user aborts, user errors, bad requests.
        async with await StyxClient.connect(stack.coordinator, timeout_s=60) as client:
            transport = client._transport
            assert isinstance(transport, KafkaTransport)
            push = transport.links
            assert push is not None

            async def subscribed() -> bool:
                return push.healthy

            await poll(subscribed, 60, "the client subscribed on every worker")
            await asyncio.gather(*(client.submit("account", f"a{i}", "deposit", 100) for i in range(20)))
            transfers = [client.submit("account", f"a{i}", "transfer", f"a{i + 1}", 10) for i in range(19)]
            aborts = [client.submit("account", f"a{i}", "transfer", "a0", 10_000) for i in range(5)]
            errors = [client.submit("account", f"a{i}", "deposit", "not a number") for i in range(3)]
            bad = [client.submit("account", f"a{i}", "deposit", 1, 2) for i in range(2)]
            replies = await asyncio.gather(*transfers, *aborts, *errors, *bad)
        statuses = [r.status for r in replies]
        assert statuses.count("committed") == 19 and statuses.count("aborted") == 5
        assert statuses.count("failed") == 5, statuses
        token_free = {"content-type": "application/json"}
        ok = await http.post(
            stack.gateway_url + "/v1/invocations",
            headers=token_free,
            json={"operator": "account", "key": "z", "function": "deposit", "args": [1]},
        )
        assert ok.status_code == 200, ok.text
        missing = await http.post(
            stack.gateway_url + "/v1/invocations",
            headers=token_free,
            json={"operator": "nope", "key": "z", "function": "deposit", "args": [1]},
        )
        assert missing.status_code == 404

        scrapes: dict[str, Samples] = {}
        seen: dict[str, object] = {}  # what the last scrape showed, for the message of a timeout

        async def caught_up() -> bool:
            for name in ["coordinator", *workers, "gateway"]:
                scrapes[name] = await scrape(name)
            c = scrapes["coordinator"]
            seen["committed"] = value(c, "styx_coordinator_transactions_total", outcome="committed")
            seen["snapshots ok"] = value(c, "styx_coordinator_snapshots_total", result="ok")
            seen["ingress lag"] = {
                w: [(ls, v) for (n, ls), v in scrapes[w].items() if n == "styx_worker_ingress_lag"]
                for w in workers
            }
            lag = sum(value(scrapes[w], "styx_worker_ingress_lag") for w in workers)
            lag_known = all(any(n == "styx_worker_ingress_lag" for n, _ in scrapes[w]) for w in workers)
            return (
                value(c, "styx_coordinator_transactions_total", outcome="committed") >= 20 + 19 + 1
                and value(c, "styx_coordinator_snapshots_total", result="ok") >= 1
                and lag_known
                and lag == 0
            )

        try:
            await poll(caught_up, 60, "the transactions, a snapshot and zero ingress lag in the scrapes")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the last scrapes showed {seen}") from None

    c = scrapes["coordinator"]
    assert value(c, "styx_coordinator_epochs_total") > 0
    # Bad requests are rejected, not aborted: they say nothing about the workload's logic.
    assert value(c, "styx_coordinator_transactions_total", outcome="aborted") == 5 + 3
    assert value(c, "styx_coordinator_transactions_total", outcome="rejected") == 2
    assert value(c, "styx_coordinator_epoch_phase_duration_seconds_count", phase="decide") > 0
    assert value(c, "styx_coordinator_snapshot_bytes") > 0
    assert value(c, "styx_coordinator_workers") == 2
    assert value(c, "styx_coordinator_state", state="running") == 1
    assert value(c, "process_resident_memory_bytes") > 0

    def both(name: str, **labels: str) -> float:
        return sum(value(scrapes[w], name, **labels) for w in workers)

    assert both("styx_worker_transactions_committed_total") == value(
        c, "styx_coordinator_transactions_total", outcome="committed"
    )
    assert both("styx_worker_transactions_aborted_total", cause="user_abort") == 5
    assert both("styx_worker_transactions_aborted_total", cause="user_error") == 3
    assert both("styx_worker_transactions_aborted_total", cause="bad_request") == 2
    assert both("styx_worker_snapshot_upload_duration_seconds_count") >= 2
    assert both("styx_worker_partitions") == 4
    assert both("styx_worker_replies_pushed_total") > 0  # the client's, subscribed before it sent
    assert value(scrapes["gateway"], "styx_gateway_requests_total") >= 2

    present = {n for scrape in scrapes.values() for n, _ in scrape}
    missing_names = sorted(m for m in dashboard_metrics() if m not in present)
    assert not missing_names, f"the dashboard uses metrics no process exposes: {missing_names}"
