"""The HTTP gateway through real HTTP: uvicorn on a free port, a real cluster on Tansu.

One cluster (coordinator + 2 worker processes + the ``styx gateway`` process of the stack) serves the
whole module. Tests that need a particular configuration run their own in-process gateway in a thread
(:class:`GatewayThread`) against the same cluster; the test talks to it with ``httpx`` over TCP.
Deterministic overload and timeouts use :class:`GatedBackend`: the real client behind a gate the test
opens, so an invocation stays in flight exactly as long as the test wants.
"""

from __future__ import annotations

import asyncio
import dataclasses
import html.parser
import json
import random
import re
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from styx_client.gateway import (
    Backend,
    ClusterInfo,
    Gateway,
    GatewayConfig,
    GatewayLimits,
    GatewayTiming,
    Outcome,
    ReplyCache,
    connect_client,
    coordinator_status,
    reply_outcome,
)
from styx_client.gateway.codes import ERROR_CODES, error_table
from styx_client.gateway.lookups import ClusterReplies, Found
from styx_client.gateway.strict_json import strict_json
from styx_client.sdk import StyxClient
from styx_coordinator.cluster import Cluster
from styx_coordinator.lookups import ReplyLookups
from styx_coordinator.tasks import Tasks
from styx_py.core.config import Config
from styx_py.core.errors import ConfigError, GraphError, ProtocolError
from styx_py.core.operator import Operator
from styx_py.core.wire import (
    MAX_LOOKUP_IDS,
    MAX_LOOKUP_REPLY_BYTES,
    NIL,
    AdminReply,
    FindReplies,
    FoundReplies,
    Key,
    ReadState,
    Reply,
    ReplyLookup,
    encode_value,
    reply_decoder,
)
from styx_py.stack.local import LocalStack
from styx_py.stack.services import TansuBroker, free_port
from styx_worker.dedup import ReplyTable
from styx_worker.lookup import find_replies
from tests.service_fixtures import start_cluster

pytestmark = [pytest.mark.timeout(120)]
services = pytest.mark.services  # every test here but the pure ones at the end needs the real cluster

TOKEN = "test-token-0123456789"
ERROR_FIELDS = {"status", "code", "message", "request_id", "reply", "errors"}


# ---- fixtures and helpers ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(kafka: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """One cluster for the module (most tests only need a running one): bank app and a gateway."""
    with start_cluster(
        tmp_path_factory.mktemp("gateway-stack"),
        kafka,
        app="styx_benchmarks.bank:app",
        gateway=True,
        gateway_args=["--state-function", "account=balance"],
    ) as stack:
        yield stack


def config(cluster: LocalStack, **kw: Any) -> GatewayConfig:
    """A gateway of the module's cluster; ``kw`` are fields of GatewayConfig or of one of its parts."""
    limits = {k: kw.pop(k) for k in list(kw) if k in fields_of(GatewayLimits)}
    timing = {"status_interval_s": 0.1} | {k: kw.pop(k) for k in list(kw) if k in fields_of(GatewayTiming)}
    kw.setdefault("state_functions", {"account": "balance"})
    return GatewayConfig(
        cluster.coordinator, port=0, limits=GatewayLimits(**limits), timing=GatewayTiming(**timing), **kw
    )


def fields_of(settings: type) -> set[str]:
    return {f.name for f in dataclasses.fields(settings)}


class GatewayThread:
    """A :class:`Gateway` served by uvicorn on its own event loop in a thread, on a free port."""

    def __init__(self, cfg: GatewayConfig, **kw: Any) -> None:
        self.gateway = Gateway(cfg, **kw)
        self.sock = self.gateway.bind()
        self.gateway.port = int(self.sock.getsockname()[1])
        self.loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None
        self._running = threading.Event()
        self._thread = threading.Thread(target=self._main, name="gateway", daemon=True)

    @property
    def url(self) -> str:
        return self.gateway.url

    def _main(self) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            self._running.set()
            await self.gateway.run(self.sock)

        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread, raised by __exit__
            self.error = exc
            self._running.set()

    def call(self, fn: Callable[..., object], *args: object) -> None:
        """Run ``fn(*args)`` on the gateway's loop."""
        assert self.loop is not None
        self.loop.call_soon_threadsafe(fn, *args)

    def __enter__(self) -> GatewayThread:
        self._thread.start()
        assert self._running.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.call(self.gateway.stop)
        self._thread.join(30)
        if self._thread.is_alive():
            frame = sys._current_frames().get(self._thread.ident or -1)
            where = "".join(traceback.format_stack(frame)) if frame is not None else "?"
            raise AssertionError(f"gateway did not stop; its thread is at:\n{where}")
        if self.error is not None:
            raise self.error


class GatedBackend:
    """The real client behind a gate: submissions wait until the test opens it (never a sleep)."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.gate = asyncio.Event()
        self.entered = 0

    async def submit(
        self, operator: str, key: Key, function: str, *args: Any, request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Reply:  # fmt: skip
        self.entered += 1
        await self.gate.wait()
        return await self.inner.submit(
            operator, key, function, *args, request_id=request_id, timeout_s=timeout_s
        )

    async def close(self) -> None:
        await self.inner.close()

    def set_deployment(
        self, operators: Mapping[str, int], functions: Mapping[str, Any] | None = None
    ) -> None:
        self.inner.set_deployment(operators, functions)


async def gated_factory(status: Mapping[str, Any], cfg: GatewayConfig) -> Backend:
    return GatedBackend(await connect_client(status, cfg))


async def wait_until(predicate: Callable[[], Any], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def wait_ready(http: httpx.AsyncClient, expect: int = 200) -> None:
    async def ready() -> bool:
        return (await http.get("/readyz")).status_code == expect

    await wait_until(ready)


def client_for(url: str, token: str | None = None, **kw: Any) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(base_url=url, headers=headers, timeout=30, **kw)


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The stable error shape: ``{"error": {status, code, message, request_id, reply, errors}}``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    # A 429 says which bound refused it (client, backlog or entity); no other error has a reason.
    assert set(error) == ERROR_FIELDS | ({"reason"} if code == "overloaded" else set()), error
    assert error["status"] == status and error["code"] == code and error["message"], error
    return error


def invocation(key: Key, function: str, *args: Any, operator: str = "account") -> dict[str, Any]:
    return {"operator": operator, "key": key, "function": function, "args": list(args)}


@pytest.fixture(scope="module")
def gateway(cluster: LocalStack) -> Iterator[GatewayThread]:
    """A default in-process gateway shared by the tests that need no special configuration."""
    with GatewayThread(config(cluster)) as gt:
        yield gt


@pytest.fixture
async def http(gateway: GatewayThread) -> Any:
    async with client_for(gateway.url) as client:
        await wait_ready(client)
        yield client


# ---- transactions over HTTP -------------------------------------------------------------------------------


@services
async def test_concurrent_transfers_conserve_money_and_get_their_own_replies(
    gateway: GatewayThread, http: httpx.AsyncClient
) -> None:
    accounts, initial, transfers = 40, 100, 400
    prefix = f"t{uuid.uuid4().hex[:6]}-"
    keys = [f"{prefix}{i}" for i in range(accounts)]
    deposits = await asyncio.gather(
        *(http.post("/v1/invocations", json=invocation(k, "deposit", initial)) for k in keys)
    )
    assert all(r.status_code == 200 and r.json()["result"] == initial for r in deposits)

    rng = random.Random(7)
    plan = {f"{prefix}x{n}": (*rng.sample(keys, 2), rng.randint(1, 60)) for n in range(transfers)}
    limits = httpx.Limits(max_connections=200)
    async with client_for(gateway.url, limits=limits) as many:

        async def transfer(rid: str) -> httpx.Response:
            src, dst, amount = plan[rid]
            return await many.post(
                "/v1/invocations",
                json=invocation(src, "transfer", dst, amount),
                headers={"Idempotency-Key": rid},
            )

        responses = dict(zip(plan, await asyncio.gather(*(transfer(rid) for rid in plan)), strict=True))

    replies: dict[str, dict[str, Any]] = {}
    for rid, response in responses.items():
        assert response.status_code in (200, 409), response.text
        reply = (
            response.json()
            if response.status_code == 200
            else assert_error(response, 409, "aborted")["reply"]
        )
        assert reply["request_id"] == rid, "a reply went to the wrong HTTP request"
        assert float(response.headers["server-timing"].removeprefix("cluster;dur=")) > 0
        replies[rid] = reply
    assert any(r["status"] == "aborted" for r in replies.values()), "expected insufficient-credit aborts"

    # Each reply is the right one: replay serially in commit order (epoch, phase, tid).
    balances = dict.fromkeys(keys, initial)
    for rid in sorted(replies, key=lambda r: (replies[r]["epoch"], replies[r]["phase"], replies[r]["tid"])):
        src, dst, amount = plan[rid]
        reply = replies[rid]
        if balances[src] >= amount:
            assert reply["status"] == "committed" and reply["result"] == balances[src] - amount, (rid, reply)
            balances[src] -= amount
            balances[dst] += amount
        else:
            assert reply["status"] == "aborted" and reply["error"].startswith(f"insufficient credit in {src}")

    states = await asyncio.gather(*(http.get(f"/v1/state/account/{k}") for k in keys))
    seen = {s.json()["key"]: s.json()["value"] for s in states}
    assert all(s.status_code == 200 and s.json()["consistency"] == "read-only transaction" for s in states)
    assert seen == balances
    assert sum(seen.values()) == accounts * initial, "money not conserved"

    # One client, hence one egress consumer, resolved every waiter.
    backend = gateway.gateway.backend
    assert isinstance(backend, StyxClient)
    assert backend.stats.replied >= accounts + transfers + accounts


@services
async def test_idempotent_retries_return_the_identical_body_and_run_once(cluster: LocalStack) -> None:
    """Against the ``styx gateway`` process the stack started (the ``styx up`` path)."""
    assert cluster.gateway_url
    account = f"idem-{uuid.uuid4().hex[:8]}"
    async with client_for(cluster.gateway_url) as http:
        await wait_ready(http)
        key = f"{account}-once"
        first = await http.post(
            "/v1/invocations", json=invocation(account, "deposit", 10), headers={"Idempotency-Key": key}
        )
        again = await http.post(
            "/v1/invocations", json=invocation(account, "deposit", 10), headers={"Idempotency-Key": key}
        )
        assert first.status_code == again.status_code == 200
        assert first.content == again.content, "a retry must get the identical body"
        assert first.json()["request_id"] == key and first.json()["result"] == 10

        # Concurrent retries share one execution.
        key2 = f"{account}-burst"
        body = {**invocation(account, "deposit", 5), "request_id": key2}
        burst = await asyncio.gather(*(http.post("/v1/invocations", json=body) for _ in range(20)))
        assert {r.status_code for r in burst} == {200}
        assert len({r.content for r in burst}) == 1
        assert burst[0].json()["result"] == 15

        # The reply stays fetchable, identically; the key cannot be reused for another payload.
        fetched = await http.get(f"/v1/invocations/{key}")
        assert fetched.status_code == 200 and fetched.content == first.content
        other = await http.post(
            "/v1/invocations", json=invocation(account, "deposit", 99), headers={"Idempotency-Key": key}
        )
        assert_error(other, 422, "idempotency_key_reused")

        state = await http.get(f"/v1/state/account/{account}")
        assert state.json()["value"] == 15, "each idempotency key must execute exactly once"

        # An aborted reply is final too: the identical 409.
        key3 = f"{account}-abort"
        aborted = [
            await http.post(
                "/v1/invocations",
                json=invocation(account, "transfer", "x", 1000),
                headers={"Idempotency-Key": key3},
            )
            for _ in range(2)
        ]
        assert aborted[0].content == aborted[1].content
        assert assert_error(aborted[0], 409, "aborted")["reply"]["error_type"] == "Abort"


@services
async def test_the_gateways_client_waits_per_fetch_as_the_cluster_does(cluster: LocalStack) -> None:
    """The coordinator's status names its consumers' fetch wait (STYX_KAFKA_FETCH_WAIT_MS: 100 on
    Apache Kafka in docker-compose and Kubernetes); the gateway's client takes it. It also takes the
    replies the workers push, whose addresses it asks the same coordinator for."""
    from styx_client.gateway.cluster import coordinator_status

    status = await coordinator_status(cluster.coordinator)()
    assert status["kafka_fetch_wait_ms"] == 5  # the local default
    for named, expected in ((100, 100), (None, 5)):
        changed = {**status, "kafka_fetch_wait_ms": named}
        backend = await connect_client(changed, config(cluster))
        try:
            assert isinstance(backend, StyxClient) and backend.fetch_wait_ms == expected
            assert backend.coordinator == cluster.coordinator
        finally:
            await backend.close()


@services
async def test_async_submit_then_fetch(http: httpx.AsyncClient) -> None:
    account = f"async-{uuid.uuid4().hex[:8]}"
    accepted = await http.post(
        "/v1/invocations", params={"wait": "false"}, json=invocation(account, "deposit", 3)
    )
    assert accepted.status_code == 202
    body = accepted.json()
    assert body["status"] == "pending" and accepted.headers["location"] == body["location"]
    reply = await http.get(body["location"], params={"wait_s": 10})
    assert reply.status_code == 200, reply.text
    assert reply.json()["request_id"] == body["request_id"] and reply.json()["result"] == 3
    assert_error(await http.get("/v1/invocations/never-seen-id"), 404, "unknown_request")


# ---- replies any replica can serve ---------------------------------------------------------------------


async def wait_listening(http: httpx.AsyncClient) -> None:
    """Until a gateway process that is still starting answers /readyz with 200."""

    async def ready() -> bool:
        try:
            return (await http.get("/readyz")).status_code == 200
        except httpx.TransportError:
            return False

    await wait_until(ready)


@pytest.fixture
def second_gateway(cluster: LocalStack, tmp_path: Path) -> Iterator[str]:
    """Another ``styx gateway`` process on the same cluster, without ``--state-function`` (it takes the
    state function from the deployed graph); its URL."""
    port = free_port()
    args = ["gateway", "--coordinator", cluster.coordinator, "--port", str(port)]
    with (tmp_path / "gateway-b.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "styx_py.cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=cluster.env,
            start_new_session=True,
        )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@services
async def test_two_gateway_processes_answer_each_others_request_ids(
    cluster: LocalStack, second_gateway: str
) -> None:
    """Gateway A (the stack's process) and B (another process): a request submitted on A is fetched on
    B from the cluster's reply tables; a retry on B with A's Idempotency-Key gets A's identical body
    and does not run again (the cluster deduplicates the resent request id)."""
    account = f"replica-{uuid.uuid4().hex[:8]}"
    async with client_for(cluster.gateway_url) as a, client_for(second_gateway) as b:
        await wait_ready(a)
        await wait_listening(b)
        key = f"{account}-async"
        accepted = await a.post(
            "/v1/invocations",
            params={"wait": "false"},
            json=invocation(account, "deposit", 10),
            headers={"Idempotency-Key": key},
        )
        assert accepted.status_code == 202, accepted.text
        location = accepted.headers["location"]
        on_b = await b.get(location, params={"wait_s": 30})  # may still be in flight: B long-polls
        assert on_b.status_code == 200, on_b.text
        assert on_b.json()["request_id"] == key and on_b.json()["result"] == 10
        on_a = await a.get(location, params={"wait_s": 30})
        assert on_a.status_code == 200 and on_b.content == on_a.content, "replicas must agree byte for byte"

        retry = await b.post(
            "/v1/invocations", json=invocation(account, "deposit", 10), headers={"Idempotency-Key": key}
        )
        assert retry.status_code == 200 and retry.content == on_a.content, retry.text
        again = await b.get(location)  # now from B's own idempotency table
        assert again.content == on_a.content

        # B has no --state-function: it reads the state function from the deployed graph.
        state = await b.get(f"/v1/state/account/{account}")
        assert state.status_code == 200, state.text
        assert state.json()["value"] == 10 and state.json()["function"] == "balance", "the deposit ran twice"

        # A final abort on B is served on A as the identical 409.
        aborted = await b.post(
            "/v1/invocations",
            json=invocation(account, "transfer", "elsewhere", 1000),
            headers={"Idempotency-Key": f"{account}-abort"},
        )
        fetched = await a.get(f"/v1/invocations/{account}-abort")
        assert_error(aborted, 409, "aborted")
        assert fetched.content == aborted.content

        # Known nowhere: 404 from every replica (every worker answered with whole tables).
        for http in (a, b):
            assert_error(await http.get(f"/v1/invocations/{account}-never"), 404, "unknown_request")
        operators = (await b.get("/v1/operators")).json()["operators"]
        assert {o["name"]: o["state_function"] for o in operators} == {"account": "balance"}
        metrics = (await b.get("/metrics")).text
        assert _sample(metrics, "styx_gateway_reply_lookups_total") >= 1, "B never asked the cluster"


# ---- every error status, with its JSON body ------------------------------------------------------------


@services
async def test_bad_input_statuses(http: httpx.AsyncClient) -> None:
    account = f"bad-{uuid.uuid4().hex[:8]}"
    post = "/v1/invocations"
    malformed = await http.post(post, content=b'{"operator": ', headers={"content-type": "application/json"})
    assert_error(malformed, 400, "malformed_json")
    bad_key = await http.post(
        post, json=invocation(account, "deposit", 1), headers={"Idempotency-Key": "no spaces"}
    )
    assert_error(bad_key, 400, "bad_idempotency_key")
    conflicting = {**invocation(account, "deposit", 1), "request_id": "one"}
    assert_error(
        await http.post(post, json=conflicting, headers={"Idempotency-Key": "two"}),
        400,
        "conflicting_request_id",
    )

    assert_error(
        await http.post(post, json=invocation(account, "deposit", 1, operator="nope")),
        404,
        "unknown_operator",
    )
    assert_error(await http.post(post, json=invocation(account, "nope")), 404, "unknown_function")
    assert_error(await http.get("/v1/state/nope/x"), 404, "unknown_operator")
    assert_error(await http.get("/no/such/route"), 404, "not_found")

    await http.post(post, json=invocation(account, "deposit", 5))
    conflict = assert_error(
        await http.post(post, json=invocation(account, "transfer", "b", 50)), 409, "aborted"
    )
    assert conflict["message"].startswith(f"insufficient credit in {account}")
    assert (
        conflict["reply"]["status"] == "aborted"
        and conflict["reply"]["tid"] >= 1
        and conflict["reply"]["epoch"] >= 0
    )

    too_large = await http.post(post, json=invocation(account, "deposit", "x" * (1024 * 1024 + 1)))
    assert_error(too_large, 413, "body_too_large")

    wrong_count = assert_error(
        await http.post(post, json=invocation(account, "deposit", 1, 2)), 422, "bad_request"
    )
    assert wrong_count["reply"]["error_type"] == "BadRequest"
    wrong_type = assert_error(
        await http.post(post, json=invocation(account, "deposit", "ten")), 422, "function_error"
    )
    assert wrong_type["reply"]["error_type"] == "UserError" and "TypeError" in wrong_type["message"]
    schema = assert_error(
        await http.post(post, json={"operator": "account", "key": 1.5, "function": "deposit"}),
        422,
        "invalid_request",
    )
    assert schema["errors"] and schema["errors"][0]["loc"][:2] == ["body", "key"]
    assert (await http.get(f"/v1/state/account/{account}")).json()["value"] == 5, (
        "no failed call changed state"
    )


@services
async def test_limits_and_json_numbers(http: httpx.AsyncClient) -> None:
    """What is not JSON is 400 ``malformed_json`` saying why; what breaks a limit of
    ``styx_py.core.limits`` is 422 (the schema's limits, or ``bad_request`` naming the limit), before
    anything reaches the cluster."""
    account = f"lim-{uuid.uuid4().hex[:8]}"
    post = "/v1/invocations"
    json_body = {"content-type": "application/json"}
    for constant in ("NaN", "Infinity", "-Infinity"):
        head = f'{{"operator": "account", "key": "{account}", "function": "deposit", "args": '
        for body in (f"{head}[{constant}]}}", f'{head}[[1, {{"a": {constant}}}]]}}'):
            error = assert_error(
                await http.post(post, content=body, headers=json_body), 400, "malformed_json"
            )
            assert f"{constant} is not a JSON number" in error["message"], error
    deep = '{"operator": "account", "key": "k", "function": "deposit", "args": [' + "[" * 100_000
    deep += "]" * 100_000 + "]}"
    error = assert_error(await http.post(post, content=deep, headers=json_body), 400, "malformed_json")
    assert "too deep" in error["message"]

    def nested(depth: int) -> Any:
        value: Any = 1
        for _ in range(depth):
            value = [value]
        return value

    too_deep = assert_error(
        await http.post(post, json=invocation(account, "deposit", nested(65))), 422, "bad_request"
    )
    assert "MAX_ARG_DEPTH" in too_deep["message"] and too_deep["reply"] is None
    # At the limit the request reaches the function (which cannot add a list to a balance).
    at_limit = await http.post(post, json=invocation(account, "deposit", nested(64)))
    assert_error(at_limit, 422, "function_error")
    # Under the body limit as JSON, above the request limit once encoded (a float takes 9 bytes).
    floats = assert_error(
        await http.post(post, json=invocation(account, "deposit", [0.5] * 200_000)), 422, "bad_request"
    )
    assert "MAX_REQUEST_BYTES" in floats["message"]
    long_key = await http.post(post, json=invocation("k" * 1025, "deposit", 1))
    assert assert_error(long_key, 422, "invalid_request")["errors"][0]["loc"][:2] == ["body", "key"]
    long_id = await http.post(post, json={**invocation(account, "deposit", 1), "request_id": "i" * 129})
    assert_error(long_id, 422, "invalid_request")
    assert (await http.get(f"/v1/state/account/{account}")).json()["value"] == 0, "nothing ran"


@services
async def test_overload_429_and_timeout_504(cluster: LocalStack) -> None:
    cfg = config(cluster, max_pending=2)
    with GatewayThread(cfg, backend_factory=gated_factory) as gt:
        async with client_for(gt.url) as http:
            await wait_ready(http)
            account = f"gate-{uuid.uuid4().hex[:8]}"
            held = [
                await http.post(
                    "/v1/invocations",
                    params={"wait": "false"},
                    json=invocation(account, "deposit", 1),
                    headers={"Idempotency-Key": f"{account}-{n}"},
                )
                for n in range(2)
            ]
            assert [r.status_code for r in held] == [202, 202]
            shed = await http.post("/v1/invocations", json=invocation(account, "deposit", 1))
            assert assert_error(shed, 429, "overloaded")["reason"] == "client", "the gateway's own bound"
            assert shed.headers["retry-after"] == "1"

            # A waiter gives up at its deadline with 504; the job goes on and its reply is fetched later.
            rid = held[0].json()["request_id"]
            timeout = await http.post(
                "/v1/invocations",
                params={"timeout_s": 0.2},
                json=invocation(account, "deposit", 1),
                headers={"Idempotency-Key": rid},
            )
            assert assert_error(timeout, 504, "timeout")["request_id"] == rid
            # While full, new invocations are shed before the body is read: a retry naming its job
            # only in the body is shed too (documented), only the header lets it join.
            by_body = await http.post(
                "/v1/invocations", json={**invocation(account, "deposit", 1), "request_id": rid}
            )
            assert_error(by_body, 429, "overloaded")

            backend = gt.gateway.backend
            assert isinstance(backend, GatedBackend)
            gt.call(backend.gate.set)
            for response in held:
                fetched = await http.get(response.headers["location"], params={"wait_s": 10})
                assert fetched.status_code == 200, fetched.text
            assert (await http.get(f"/v1/state/account/{account}")).json()["value"] == 2
            assert backend.entered == 3  # two deposits and the state read; the 429 and the retry sent nothing
            assert gt.gateway.stats.peak_pending <= 2


@services
async def test_http_inflight_bound_429(cluster: LocalStack) -> None:
    """Waiting HTTP requests are bounded too (probes exempt), before any body is read."""
    cfg = config(cluster, max_pending=10, max_http_inflight=2)
    with GatewayThread(cfg, backend_factory=gated_factory) as gt:
        async with client_for(gt.url) as http:
            await wait_ready(http)
            account = f"inflight-{uuid.uuid4().hex[:8]}"
            waiting = [
                asyncio.create_task(http.post("/v1/invocations", json=invocation(account, "deposit", 1)))
                for _ in range(2)
            ]

            async def both_waiting() -> bool:
                return len(gt.gateway.jobs) == 2

            await wait_until(both_waiting)
            shed = await http.post("/v1/invocations", json=invocation(account, "deposit", 1))
            assert "HTTP requests in flight" in assert_error(shed, 429, "overloaded")["message"]
            assert (await http.get("/healthz")).status_code == 200
            backend = gt.gateway.backend
            assert isinstance(backend, GatedBackend)
            gt.call(backend.gate.set)
            assert [r.status_code for r in await asyncio.gather(*waiting)] == [200, 200]


@services
async def test_recovering_cluster_503(cluster: LocalStack) -> None:
    override: dict[str, str] = {}
    real = coordinator_status(cluster.coordinator)

    async def status() -> Mapping[str, Any]:
        return {**await real(), **override}

    with GatewayThread(config(cluster), status_source=status) as gt:
        async with client_for(gt.url) as http:
            await wait_ready(http)
            override["state"] = "recovering"
            await wait_ready(http, 503)
            readiness = (await http.get("/readyz")).json()
            assert readiness == {"ready": False, "state": "recovering", "reason": None}
            response = await http.post("/v1/invocations", json=invocation("r", "deposit", 1))
            assert_error(response, 503, "recovering")
            assert response.headers["retry-after"] == "1"
            override["state"] = "running"
            await wait_ready(http)
            assert (await http.post("/v1/invocations", json=invocation("r", "deposit", 1))).status_code == 200


@services
async def test_unreachable_coordinator_503() -> None:
    cfg = GatewayConfig(f"127.0.0.1:{free_port()}", port=0, timing=GatewayTiming(status_interval_s=0.02))
    with GatewayThread(cfg) as gt:
        async with client_for(gt.url) as http:
            assert (await http.get("/healthz")).status_code == 200

            async def unreachable() -> bool:
                return (await http.get("/readyz")).json()["state"] == "unreachable"

            await wait_until(unreachable)
            assert_error(
                await http.post("/v1/invocations", json=invocation("a", "deposit", 1)), 503, "unavailable"
            )


@services
async def test_bearer_token(cluster: LocalStack) -> None:
    with GatewayThread(config(cluster, token=TOKEN, state_functions={})) as gt:
        async with client_for(gt.url) as anonymous:
            assert (await anonymous.get("/healthz")).status_code == 200, "probes need no token"
            missing = await anonymous.get("/v1/operators")
            assert_error(missing, 401, "unauthorized")
            assert missing.headers["www-authenticate"].startswith("Bearer")
            wrong = await anonymous.post(
                "/v1/invocations",
                json=invocation("a", "deposit", 1),
                headers={"Authorization": "Bearer wrong-token-xx"},
            )
            assert_error(wrong, 401, "unauthorized")
        async with client_for(gt.url, TOKEN) as http:
            await wait_ready(http)
            operators = (await http.get("/v1/operators")).json()
            assert operators["ready"] and operators["graph"] == "styx_benchmarks.bank:app"
            assert operators["operators"][0]["name"] == "account"
            # No --state-function: the one the deployed graph names (bank: the argument-less read-only one).
            assert operators["operators"][0]["state_function"] == "balance"
            state = await http.get(f"/v1/state/account/nobody-{uuid.uuid4().hex[:6]}")
            assert state.status_code == 200 and state.json()["function"] == "balance", state.text


def test_token_required_off_loopback() -> None:
    with pytest.raises(ConfigError, match="token is required"):
        GatewayConfig("127.0.0.1:6000", host="0.0.0.0")
    GatewayConfig("127.0.0.1:6000", host="0.0.0.0", token=TOKEN)
    GatewayConfig("127.0.0.1:6000", host="::1")
    with pytest.raises(ConfigError, match="max_pending"):
        GatewayConfig("127.0.0.1:6000", limits=GatewayLimits(max_pending=0))


# ---- overload: a burst far above capacity -----------------------------------------------------------------


@services
async def test_a_burst_is_shed_while_the_admitted_requests_are_held(cluster: LocalStack) -> None:
    """800 concurrent requests against a capacity of 8 held invocations (the gate stands for a
    stalled cluster): exactly 8 admitted, every other answered 429 while those 8 are still held,
    health probes answered meanwhile, every table within its bound, and once the cluster moves the
    admitted ones commit exactly once. (How fast shedding is belongs to a benchmark, not here.)"""
    burst_size, capacity = 800, 8
    cfg = config(cluster, max_pending=capacity, max_cached_replies=100)
    with GatewayThread(cfg, backend_factory=gated_factory) as gt:
        limits = httpx.Limits(max_connections=burst_size, max_keepalive_connections=burst_size)
        async with client_for(gt.url, limits=limits) as http:
            await wait_ready(http)
            prefix = uuid.uuid4().hex[:6]

            answered = 0
            all_shed = asyncio.Event()

            async def one(n: int) -> int:
                nonlocal answered
                response = await http.post(
                    "/v1/invocations", json=invocation(f"{prefix}-{n % 50}", "deposit", 1)
                )
                if response.status_code == 429:
                    assert_error(response, 429, "overloaded")
                    assert response.headers["retry-after"] == "1"
                answered += 1
                if answered == burst_size - capacity:
                    all_shed.set()
                return response.status_code

            # Probes from another thread with its own connection: what a health checker would see,
            # not the queue of this test's own event loop.
            probes: list[int] = []
            burst_over = threading.Event()

            def probe() -> None:
                with httpx.Client(base_url=gt.url, timeout=60) as prober:
                    while True:  # at least one probe while the burst is in flight; 50/s at most
                        probes.append(prober.get("/healthz").status_code)
                        if burst_over.wait(0.02):
                            return

            prober = threading.Thread(target=probe, name="prober")
            burst = [asyncio.create_task(one(n)) for n in range(burst_size)]
            prober.start()
            await all_shed.wait()
            burst_over.set()
            await asyncio.to_thread(prober.join)
            assert len(gt.gateway.jobs) == capacity and gt.gateway.stats.peak_pending == capacity
            metrics = (await http.get("/metrics")).text
            backend = gt.gateway.backend
            assert isinstance(backend, GatedBackend)
            gt.call(backend.gate.set)
            statuses = await asyncio.gather(*burst)

        assert statuses.count(200) == capacity and statuses.count(429) == burst_size - capacity
        assert probes and set(probes) == {200}, f"/healthz during the burst: {probes}"
        answered = _count(metrics, "/v1/invocations")
        assert answered >= burst_size - capacity, f"the gateway's histogram counted {answered} answers"
        assert len(gt.gateway.jobs) == 0 and len(gt.gateway.replies) <= 100
        assert backend.entered == capacity, "a shed request reached the cluster"
        async with client_for(gt.url) as http:
            values = [(await http.get(f"/v1/state/account/{prefix}-{i}")).json() for i in range(50)]
        assert sum(v.get("value", 0) for v in values) == capacity, "every 200 executed once, every 429 never"


def _sample(metrics: str, name: str) -> float:
    """The value of an unlabelled sample in Prometheus exposition text."""
    match = re.search(rf"^{name} (\S+)$", metrics, re.M)
    assert match is not None, f"no {name} in the metrics"
    return float(match[1])


def _count(metrics: str, route: str) -> float:
    """Requests the gateway's latency histogram counted for ``route`` (Prometheus exposition text)."""
    prefix = "styx_gateway_request_duration_seconds_count{"
    for line in metrics.splitlines():
        if line.startswith(prefix) and f'route="{route}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no request count for {route}")


# ---- metrics, probes, OpenAPI --------------------------------------------------------------------------


@services
async def test_metrics_and_probes(http: httpx.AsyncClient) -> None:
    await http.post("/v1/invocations", json=invocation("m", "nope"))
    assert (await http.post("/v1/invocations", json=invocation("m", "deposit", 1))).status_code == 200
    text = (await http.get("/metrics")).text
    for needle in (
        'styx_gateway_requests_total{method="POST",route="/v1/invocations",status="404"}',
        "styx_gateway_request_duration_seconds_bucket",
        "styx_gateway_requests_in_flight",
        'styx_gateway_errors_total{code="unknown_function",status="404"}',
        "styx_gateway_pending_invocations",
        "styx_gateway_cached_replies",
        "styx_gateway_transaction_duration_seconds_bucket",
    ):
        assert needle in text, needle
    assert (await http.get("/healthz")).json() == {"status": "ok"}
    assert (await http.get("/readyz")).json() == {"ready": True, "state": "running", "reason": None}
    schema = (await http.get("/openapi.json")).json()
    assert {"/v1/invocations", "/v1/invocations/{request_id}", "/v1/state/{operator}/{key}"} <= set(
        schema["paths"]
    )


class _Links(html.parser.HTMLParser):
    """Every URL an HTML page makes the browser load or follow (src, href, Redoc's spec-url)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [v for k, v in attrs if k in ("src", "href", "spec-url") and v is not None]


async def test_docs_and_redoc_load_nothing_from_another_host() -> None:
    """/docs and /redoc reference only the gateway's own paths (no CDN: blank without internet
    otherwise), and every asset they reference is served."""
    gateway = Gateway(GatewayConfig("127.0.0.1:1", port=0))
    transport = httpx.ASGITransport(app=gateway.asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as http:
        for page in ("/docs", "/redoc"):
            response = await http.get(page)
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
            links = _Links()
            links.feed(response.text)
            assert len(links.urls) >= 2, links.urls  # the script, the stylesheet or icon
            assert re.search(r"\b(https?:)?//", response.text) is None, f"{page} names another host"
            for url in links.urls:
                parts = urllib.parse.urlsplit(url)
                assert not parts.scheme and not parts.netloc and url.startswith("/"), (page, url)
                asset = await http.get(url)
                assert asset.status_code == 200 and asset.content, (page, url)
        openapi = (await http.get("/openapi.json")).json()
    ids = {op["operationId"] for path in openapi["paths"].values() for op in path.values()}
    assert {"submitInvocation", "getInvocation", "getState", "listOperators"} <= ids
    assert all(re.fullmatch(r"[a-z]+[A-Za-z]*", i) for i in ids), ids
    assert "──>" not in openapi["info"]["description"], "the internal diagram is not user documentation"
    error_schema = openapi["components"]["schemas"]["ErrorDetail"]["properties"]["code"]
    assert set(error_schema["enum"]) == {c.code for c in ERROR_CODES}
    for code in ERROR_CODES:  # the table: every code with its status and meaning
        assert f"| {code.status} | `{code.code}` | {code.meaning}" in error_schema["description"], code
    docs = Path(__file__).parent.parent / "docs" / "http-api.md"
    assert error_table() in docs.read_text(), "docs/http-api.md: paste codes.error_table() again"


def test_every_error_the_gateway_answers_is_in_the_error_table() -> None:
    """Each ``failure(STATUS, "code", ...)`` in the gateway's source names a code of the table, with the
    table's status (the codes from Starlette's errors are mapped in app.py)."""
    table = {c.code: c.status for c in ERROR_CODES}
    package = Path(sys.modules[Gateway.__module__].__file__ or "").parent
    source = "\n".join(p.read_text() for p in sorted(package.glob("*.py")))
    used = re.findall(r'failure\(\s*(\d{3}),\s*"(\w+)"', source)
    assert len(used) > 20
    for status, code in used:
        assert table.get(code) == int(status), (code, status)
    mapped = re.findall(r'(\d{3}): "(\w+)"', source)
    assert all(table.get(code) == int(status) for status, code in mapped), mapped
    assert "http_error" in source and "internal" in source


@services
async def test_json_without_content_type_is_accepted_and_another_type_is_415(http: httpx.AsyncClient) -> None:
    body = json.dumps(invocation(f"ct-{uuid.uuid4().hex[:8]}", "deposit", 4)).encode()
    bare = await http.post("/v1/invocations", content=body)  # httpx sends no Content-Type with bytes
    assert bare.status_code == 200 and bare.json()["result"] == 4, bare.text
    # What `curl -d` sends: refused with the exact fix, before the body is parsed.
    form = {"content-type": "application/x-www-form-urlencoded"}
    error = assert_error(
        await http.post("/v1/invocations", content=body, headers=form), 415, "unsupported_media_type"
    )
    assert "Content-Type: application/json" in error["message"] and "curl --json" in error["message"]
    typed = {"content-type": "application/json; charset=utf-8"}
    assert (await http.post("/v1/invocations", content=body, headers=typed)).status_code == 200


def _doc_commands(text: str) -> list[str]:
    """The ``curl`` commands of the first ``sh`` block that sets ``GW=`` (continuation lines joined)."""
    block = next(b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "GW=" in b)
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.split("  #", 1)[0].strip() for line in joined.splitlines() if line.startswith("curl ")]


@services
def test_http_api_doc_examples_do_what_the_doc_says(gateway: GatewayThread) -> None:
    """docs/http-api.md's curl examples, run with curl against a gateway (on fresh names)."""
    asyncio.run(_wait_ready_url(gateway.url, None))
    text = (Path(__file__).parent.parent / "docs" / "http-api.md").read_text()
    commands = _doc_commands(text)
    assert len(commands) == 4 and all("--json" in c for c in commands if "POST" in c or "{" in c)
    unique = uuid.uuid4().hex[:8]
    outputs = []
    for command in commands:
        command = command.replace("alice", f"alice-{unique}").replace("pay-42", f"pay-{unique}")
        out = subprocess.run(
            ["bash", "-c", f"{command} -w '\n%{{http_code}}'"],
            env={"GW": gateway.url, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        body, _, status = out.rpartition("\n")
        outputs.append((int(status), json.loads(body)))
    (s1, deposit), (s2, accepted), (s3, transfer), (s4, state) = outputs
    assert (s1, deposit.get("status"), deposit.get("result")) == (200, "committed", 100), deposit
    assert (s2, accepted["location"]) == (202, f"/v1/invocations/pay-{unique}")
    assert (s3, transfer["request_id"], transfer["result"]) == (200, f"pay-{unique}", 70)
    assert (s4, state["value"]) == (200, 70)


# ---- fuzz / contract test from the OpenAPI schema ----------------------------------------------------------


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


# schemathesis 4.32 draws from the `random` module inside its strategies, which this hypothesis version
# deprecates; a third-party warning, so ignored for this test only.
@services
@pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")
def test_openapi_contract_fuzz(cluster: LocalStack) -> None:
    """schemathesis (positive and negative data) on every operation, then the real functions with
    random arguments: no 5xx other than a 504 asked for by a tiny timeout, every status documented,
    every body matching its schema, and every request answered within its deadline (no hangs)."""
    import schemathesis
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    def no_server_error(ctx: Any, response: Any, case: Any) -> None:
        if response.status_code >= 500:
            body = json.loads(response.content)
            assert response.status_code == 504 and body["error"]["code"] == "timeout", response.content

    checks = [
        no_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
        response_headers_conformance,
    ]
    with GatewayThread(config(cluster, token=TOKEN, reply_timeout_s=5.0, max_reply_timeout_s=5.0)) as gt:
        asyncio.run(_wait_ready_url(gt.url, TOKEN))
        auth = {"Authorization": f"Bearer {TOKEN}"}
        schema = schemathesis.openapi.from_dict(gt.gateway.app.openapi())
        calls = 0
        spec = gt.gateway.app.openapi()["paths"]
        for result in schema.get_all_operations():
            operation = result.ok()
            raw = spec[operation.path][operation.method.lower()]
            has_inputs = bool(raw.get("parameters") or raw.get("requestBody"))
            modes = [schemathesis.GenerationMode.POSITIVE]
            if has_inputs:  # nothing to make invalid otherwise
                modes.append(schemathesis.GenerationMode.NEGATIVE)
            for mode in modes:

                @settings(
                    max_examples=50,
                    deadline=None,
                    derandomize=True,
                    database=None,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck),
                )
                @given(case=operation.as_strategy(generation_mode=mode))
                def exercise(case: Any) -> None:
                    nonlocal calls
                    response = case.call(base_url=gt.url, headers=auth, timeout=10)
                    calls += 1
                    case.validate_response(response, checks=checks)

                exercise()
        assert calls > 100

        # The functions of the deployed app with arbitrary JSON arguments.
        with httpx.Client(base_url=gt.url, headers=auth, timeout=10) as http:

            @settings(max_examples=60, deadline=None, derandomize=True, database=None)
            @given(
                function=st.sampled_from(["deposit", "transfer", "balance"]),
                key=st.text(min_size=1, max_size=10) | st.integers(min_value=-(2**70), max_value=2**70),
                args=st.lists(JSON_VALUES, max_size=3),
            )
            def call_functions(function: str, key: Key, args: list[Any]) -> None:
                response = http.post("/v1/invocations", json=invocation(key, function, *args))
                assert response.status_code in (200, 409, 422), response.text
                if response.status_code != 200:
                    assert set(response.json()["error"]) == ERROR_FIELDS

            call_functions()


async def _wait_ready_url(url: str, token: str | None) -> None:
    async with client_for(url, token) as http:
        await wait_ready(http)


# ---- the CLI --------------------------------------------------------------------------------------------


def styx(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "styx_py.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


@services
def test_gateway_cli_help_and_readable_errors(cluster: LocalStack, tmp_path: Path) -> None:
    out = styx("gateway", "--help")
    assert out.returncode == 0 and "usage: styx gateway" in out.stdout and "--state-function" in out.stdout
    exposed = styx("gateway", "--host", "0.0.0.0", "--coordinator", cluster.coordinator)
    assert exposed.returncode == 2 and exposed.stderr.startswith("styx: error: gateway: token is required")
    busy = cluster.gateway_url.rsplit(":", 1)[1]
    taken = styx("gateway", "--port", busy, "--coordinator", cluster.coordinator)
    assert taken.returncode == 2 and "cannot listen on" in taken.stderr, taken.stderr
    empty = tmp_path / "token"
    empty.write_text("\n")
    assert styx("gateway", "--token-file", str(empty), "--coordinator", cluster.coordinator).returncode == 2
    for result in (exposed, taken):
        assert "Traceback" not in result.stderr


# ---- pure parts, no services ---------------------------------------------------------------------------


def test_strict_json_refuses_what_is_not_json() -> None:
    assert strict_json(b'{"a": [1.5, -2, 1e308, "NaN", "Infinity"]}') == {
        "a": [1.5, -2, 1e308, "NaN", "Infinity"]
    }
    for text, constant in (
        (b"[1, NaN]", "NaN"),
        (b'{"x": "NaN", "y": Infinity}', "Infinity"),
        (b"[-Infinity]", "-Infinity"),
    ):
        with pytest.raises(json.JSONDecodeError, match=f"{constant} is not a JSON number") as raised:
            strict_json(text)
        assert raised.value.pos == text.decode().rindex(constant), "the position of the constant"
    with pytest.raises(json.JSONDecodeError, match="too deep to parse"):
        strict_json(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(json.JSONDecodeError, match="digits"):
        strict_json(b"[" + b"9" * 5000 + b"]")
    with pytest.raises(json.JSONDecodeError):
        strict_json(b'{"operator": ')


def test_reply_cache_is_bounded_by_entries_bytes_and_ttl() -> None:
    now = [0.0]
    cache = ReplyCache(max_entries=3, max_bytes=4096, ttl_s=10.0, clock=lambda: now[0])
    outcome = Outcome(200, b"{}")
    for n in range(5):
        cache.put(f"r{n}", None, outcome)
    assert len(cache) == 3 and cache.get("r0") is None and cache.get("r4") is not None
    cache.put("big", None, Outcome(200, b"x" * 3700))
    assert len(cache) == 1 and cache.get("big") is not None  # bytes bound evicted the rest
    now[0] = 10.0
    assert cache.get("big") is None and cache.bytes == 0, "expired entries are dropped"


def test_reply_mapping_and_cluster_state() -> None:
    committed = Reply("r", 7, 3, 0, "committed", msgspec.Raw(encode_value(5)), None, None)
    assert json.loads(reply_outcome(committed, 1.5).body)["result"] == 5
    aborted = Reply("r", 7, 3, 1, "aborted", NIL, "no", "Abort")
    assert reply_outcome(aborted, 1.0).status == 409
    for error_type, code in (("BadRequest", "bad_request"), ("UserError", "function_error")):
        outcome = reply_outcome(Reply("r", 7, 3, 0, "failed", NIL, "x", error_type), 1.0)
        assert (outcome.status, outcome.code) == (422, code)
    assert reply_outcome(Reply("r", 1, 1, 0, "weird", NIL, None, None), 1.0).status == 502

    ops = [{"name": "account", "partitions": 4, "functions": ["deposit"]}]
    assert ClusterInfo.from_status({"graph": "g", "operators": ops}).state == "running"
    assert (
        ClusterInfo.from_status({"graph": "g", "operators": ops, "state": "recovering"}).state == "recovering"
    )
    assert ClusterInfo.from_status({"graph": None, "operators": []}).state == "undeployed"
    with pytest.raises(ProtocolError):
        ClusterInfo.from_status({"graph": "g", "operators": [{"name": "x"}]})


def _reply(rid: str, tid: int, epoch: int = 1, result: Any = None) -> Reply:
    return Reply(rid, tid, epoch, 0, "committed", msgspec.Raw(encode_value(result)), None, None)


def test_workers_answer_lookups_from_every_partition_within_a_byte_budget() -> None:
    table = ReplyTable(cap_per_partition=2)
    table.record(0, _reply("a", 1))
    table.record(3, _reply("a", 7))  # the same id reused for a key in another partition
    table.record(3, _reply("big", 8, result="x" * (MAX_LOOKUP_REPLY_BYTES // 2 + 1)))
    table.record(0, _reply("big2", 9, result="y" * (MAX_LOOKUP_REPLY_BYTES // 2 + 1)))
    table.record(0, _reply("c", 2))  # evicts "a" from partition 0 (cap 2): only partition 3 has it
    ask = FindReplies(5, ["a", "big", "big2", "run", "gone"], 0)
    found = find_replies(ask, "w1", table, {"run"}, complete=True)
    assert found.lookup == 5 and found.node_id == "w1" and found.complete
    assert sorted((r.request_id, r.tid) for r in found.replies) == [("a", 7), ("big2", 9)]
    assert found.deferred == ["big"] and found.pending == ["run"]  # "gone" is unknown: not listed

    # The gateway's pick among several replies is the latest in the serial order, on every replica.
    assert Found((_reply("a", 1, epoch=4), _reply("a", 9, epoch=3))).reply == _reply("a", 1, epoch=4)


async def test_lookups_are_coalesced_and_deferred_ids_asked_again() -> None:
    sent: list[list[str]] = []
    release = asyncio.Event()

    async def source(ids: list[str]) -> Mapping[str, Any]:
        sent.append(ids)
        await release.wait()
        late = len(sent) == 2  # the second answer defers "done-late" (a worker's byte budget)
        found = [r for r in ids if r.startswith("done") and not (late and r == "done-late")]
        replies = [msgspec.msgpack.encode(_reply(r, 1)) for r in found]
        return {"replies": replies, "pending": ["running"], "deferred": ["done-late"] if late else [],
                "complete": True}  # fmt: skip

    finder = ClusterReplies(source)
    async with asyncio.TaskGroup() as tg:
        runner = tg.create_task(finder.run())
        first = tg.create_task(finder.find("done-1"))
        await wait_until(lambda: _true(len(sent) == 1))
        # Asked while the first lookup is out: all three go into the second one.
        rest = [tg.create_task(finder.find(r)) for r in ("done-late", "running", "nowhere")]
        await wait_until(lambda: _true(len(finder) == 3))
        release.set()
        results = [await first] + [await t for t in rest]
        runner.cancel()
    assert sent == [["done-1"], ["done-late", "running", "nowhere"], ["done-late"]]
    assert [r.reply is not None for r in results] == [True, True, False, False]
    assert results[2].pending and not results[3].pending and results[3].complete


async def _true(value: bool) -> bool:
    return value


def test_state_function_is_declared_or_the_only_argument_free_read_only_one() -> None:
    op = Operator("acct")

    @op.function(read_only=True)
    async def balance(ctx: Any) -> int:
        return 0

    @op.function(read_only=True)
    async def history(ctx: Any, since: int) -> list[int]:
        return []

    assert op.state_reader() == "balance"

    @op.function(read_only=True)
    async def owner(ctx: Any) -> str:
        return ""

    assert op.state_reader() is None, "two candidates: the graph must say which"

    @op.function(state=True)
    async def snapshot(ctx: Any) -> dict[str, Any]:
        return {}

    assert op.state_reader() == "snapshot" and "snapshot" in op.read_only
    with pytest.raises(GraphError, match="state function"):

        @op.function(state=True)
        async def again(ctx: Any) -> None:
            return None

    info = ClusterInfo.from_status(
        {"graph": "g", "operators": [{"name": "acct", "partitions": 2, "functions": ["snapshot"],
                                      "state_function": "snapshot"}]}
    )  # fmt: skip
    assert info.state_functions == {"acct": "snapshot"}


class _Outbox:
    """A transport that keeps what is sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    def send(self, dst: str, msg: Any) -> None:
        self.sent.append((dst, msg))

    def to(self, dst: str) -> list[Any]:
        return [m for d, m in self.sent if d == dst]


class _ManualClock:
    """Timers fire when the test says so."""

    def __init__(self) -> None:
        self.fire = asyncio.Event()

    def now(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        await self.fire.wait()


def two_worker_lookups() -> tuple[_Outbox, _ManualClock, Tasks, ReplyLookups]:
    """A running coordinator's reply lookups over two workers, w1 and w2, sending into an outbox."""
    outbox, clock, tasks = _Outbox(), _ManualClock(), Tasks()
    cluster = Cluster(Config(), outbox, None)  # type: ignore[arg-type]  # only send() is used
    cluster.graph_path, cluster.state = "tests.apps.oracle:app", "running"
    for node in ("w1", "w2"):
        cluster.membership.register(node, "127.0.0.1", 1, 0.0)
    return outbox, clock, tasks, ReplyLookups(cluster, clock, tasks)  # type: ignore[arg-type]


async def test_the_coordinator_asks_every_worker_and_says_when_the_answer_is_incomplete() -> None:
    outbox, clock, tasks, lookups = two_worker_lookups()

    def asked(admin: str, ids: list[str]) -> int:
        lookups.start(admin, ReplyLookup(ids))
        finds = [outbox.to(w)[-1] for w in ("w1", "w2")]
        assert all(isinstance(f, FindReplies) and f.request_ids == ids for f in finds)
        return int(finds[0].lookup)

    def answer(admin: str) -> dict[str, Any]:
        (reply,) = outbox.to(admin)
        assert isinstance(reply, AdminReply) and reply.ok, reply
        return reply.body

    async with asyncio.TaskGroup() as tg:
        tasks.group = tg
        first = asked("admin-1", ["a", "b"])
        lookups.on_found(FoundReplies(first, "w1", [_reply("a", 3)], [], [], True))
        assert outbox.to("admin-1") == [], "answered before every worker did"
        lookups.on_found(FoundReplies(first, "w2", [], ["b"], [], True))
        body = answer("admin-1")
        assert [reply_decoder.decode(r).request_id for r in body["replies"]] == ["a"]
        assert body["pending"] == ["b"] and body["complete"]

        # A worker recovering (its tables lack replies): a miss is not final.
        second = asked("admin-2", ["c"])
        lookups.on_found(FoundReplies(second, "w1", [], [], [], False))
        lookups.on_found(FoundReplies(second, "w2", [], [], [], True))
        assert not answer("admin-2")["complete"]

        # A worker that does not answer: incomplete after the timeout; its late answer is dropped.
        third = asked("admin-3", ["d"])
        lookups.on_found(FoundReplies(third, "w1", [], [], [], True))
        clock.fire.set()
        await wait_until(lambda: _true(bool(outbox.to("admin-3"))))
        assert not answer("admin-3")["complete"]
        lookups.on_found(FoundReplies(third, "w2", [_reply("d", 1)], [], [], True))
        assert len(outbox.to("admin-3")) == 1 and not lookups.open

        lookups.start("admin-4", ReplyLookup([f"r{i}" for i in range(MAX_LOOKUP_IDS + 1)]))
        (refused,) = outbox.to("admin-4")
        assert not refused.ok and "request ids in one lookup" in refused.error


def test_docs_screenshot_shows_a_rendered_swagger_ui(tmp_path: Path) -> None:
    """`make screenshots`: the gateway's /docs in headless Chromium, offline. A page whose scripts did
    not load (a CDN out of reach) renders blank: a handful of colours. Swagger UI's coloured method
    badges and text give hundreds."""
    from PIL import Image

    from styx_benchmarks.screenshots import gateway_docs
    from styx_py.stack.screenshot import find_browser

    browser = find_browser()
    if browser is None:
        pytest.skip("no Chromium installed (Debian: apt-get install chromium)")
    png = asyncio.run(gateway_docs(tmp_path, browser))
    with Image.open(png) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 200, len(colours)
    green = sum(n for n, (r, g, b) in colours if g > 150 and r < 120 and b < 150)  # the POST badge
    assert green > 1000, green


async def test_state_reads_name_min_epoch_and_the_newest_reply_the_gateway_received() -> None:
    """``?min_epoch=`` and the gateway's SDK client's newest reply epoch both reach the coordinator as
    the read's ``min_epoch`` (whichever is newer); an ``as_of_epoch`` read is of that epoch."""
    asked: list[ReadState] = []

    async def source(msg: ReadState) -> AdminReply:
        asked.append(msg)
        return AdminReply(
            True, "", {"epoch": max(msg.epoch, msg.min_epoch), "keys": [], "values": [], "next": None}
        )

    gateway = Gateway(GatewayConfig("127.0.0.1:1", port=0), state_reads=source)
    transport = httpx.ASGITransport(app=gateway.asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as http:
        assert (await http.get("/v1/state/account")).status_code == 200
        assert (await http.get("/v1/state/account?min_epoch=17")).json()["epoch"] == 17
        gateway.link.backend = SimpleNamespace(newest_epoch=30)  # type: ignore[assignment]
        assert (await http.get("/v1/state/account/acct1/stored?min_epoch=5")).json()["epoch"] == 30
        assert (await http.get("/v1/state/account?min_epoch=40")).json()["epoch"] == 40
        assert (await http.get("/v1/state/account?min_epoch=-2")).status_code == 422
    assert [m.min_epoch for m in asked] == [-1, 17, 30, 40]
