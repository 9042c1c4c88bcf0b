"""The lean ``POST /v1/invocations`` path (:mod:`styx_client.gateway.lean`), in process, without a cluster.

Its msgspec body type must accept only what FastAPI's pydantic model accepts (anything else goes to
FastAPI, whose error bodies are the documented ones), and a request it serves must get the same
answer FastAPI's handler gives.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import msgspec
import pydantic
import pytest

from styx_benchmarks.gateway_cpu import InstantBackend, instant_gateway
from styx_client.gateway import Gateway, GatewayConfig
from styx_client.gateway.lean import InvocationBody, _decode
from styx_client.gateway.models import InvocationRequest

pytestmark = [pytest.mark.timeout(60)]

BODIES = [
    b'{"operator": "account", "key": "alice", "function": "deposit", "args": [1]}',
    b'{"operator": "account", "key": 7, "function": "deposit"}',
    b'{"operator": "account", "key": "", "function": "deposit", "request_id": "a.b:c~d@e+f=g-1"}',
    b'{"operator": "account", "key": 18446744073709551615, "function": "deposit"}',
    b'{"operator": "account", "key": -9223372036854775808, "function": "deposit", "args": [[{"a": null}]]}',
    b'{"operator": "account", "key": 18446744073709551616, "function": "deposit"}',
    b'{"operator": "account", "key": 1.5, "function": "deposit"}',
    b'{"operator": "account", "key": true, "function": "deposit"}',
    b'{"operator": "account", "key": "' + b"k" * 1025 + b'", "function": "deposit"}',
    b'{"operator": "", "key": "k", "function": "deposit"}',
    b'{"operator": "account", "key": "k", "function": "deposit", "extra": 1}',
    b'{"operator": "account", "key": "k", "function": "deposit", "request_id": "no spaces"}',
    b'{"operator": "account", "key": "k", "function": "deposit", "request_id": "line\\n"}',
    b'{"operator": "account", "key": "k", "function": "deposit", "request_id": "' + b"i" * 129 + b'"}',
    b'{"operator": "account", "key": "k", "function": "deposit", "args": [NaN]}',
    b'{"operator": "account", "key": "k", "function": "deposit", "args": {}}',
    b'{"operator": "account", "key": "\\ud800", "function": "deposit"}',
    b'{"operator": 1, "key": "k", "function": "deposit"}',
    b'{"operator": "account", "key": "k"}',
    b'{"operator": "account", "key": "k", "function": "deposit", "args": ['
    + b"[" * 5000
    + b"]" * 5000
    + b"]}",
    b'{"operator": ',
    b"[]",
]


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_lean_body_accepts_only_what_the_pydantic_model_accepts(body: bytes) -> None:
    lean = _decode(body)
    if lean is None:
        return  # FastAPI's handler answers it
    model = InvocationRequest.model_validate_json(body)
    assert msgspec.structs.asdict(lean) == model.model_dump(), body


def test_the_lean_path_takes_the_common_bodies() -> None:
    taken = [b for b in BODIES[:5] if _decode(b) is not None]
    assert taken == BODIES[:5]
    with pytest.raises(pydantic.ValidationError):
        InvocationRequest.model_validate_json(BODIES[5])  # and the first one it leaves is refused


@pytest.fixture
async def served() -> AsyncIterator[tuple[httpx.AsyncClient, InstantBackend]]:
    backend = InstantBackend()
    gateway = await instant_gateway(backend)
    async with asyncio.TaskGroup() as tg:
        gateway.jobs.group = tg
        transport = httpx.ASGITransport(app=gateway.asgi)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as http:
            yield http, backend
        gateway.jobs.group = None


async def test_lean_and_fastapi_answer_alike(served: tuple[httpx.AsyncClient, InstantBackend]) -> None:
    """The same request, once on the lean path (no query) and once through FastAPI (``timeout_s``):
    the same status, body and headers; a retry with its Idempotency-Key is answered from the cache."""
    http, backend = served
    call = {"operator": "account", "key": "alice", "function": "deposit", "args": [3, "x"]}
    lean = await http.post("/v1/invocations", json=call, headers={"Idempotency-Key": "one"})
    slow = await http.post("/v1/invocations?timeout_s=5", json=call, headers={"Idempotency-Key": "two"})
    assert lean.status_code == slow.status_code == 200
    assert lean.json() == {**slow.json(), "request_id": "one"}
    assert lean.json()["result"] == [3, "x"]
    assert lean.headers["content-type"] == slow.headers["content-type"] == "application/json"
    assert lean.headers["server-timing"].startswith("cluster;dur=")
    again = await http.post("/v1/invocations", json=call, headers={"Idempotency-Key": "one"})
    assert again.content == lean.content and backend.sent == ["one", "two"], "sent once per key"
    reused = await http.post(
        "/v1/invocations", json={**call, "args": [4]}, headers={"Idempotency-Key": "one"}
    )
    assert reused.status_code == 422 and reused.json()["error"]["code"] == "idempotency_key_reused"
    accepted = await http.post("/v1/invocations?wait=false", json={**call, "request_id": "three"})
    assert accepted.status_code == 202 and accepted.headers["location"] == "/v1/invocations/three"


async def test_what_the_lean_path_leaves_gets_fastapis_errors(
    served: tuple[httpx.AsyncClient, InstantBackend],
) -> None:
    http, backend = served
    post = "/v1/invocations"
    malformed = await http.post(post, content=b'{"operator": ', headers={"content-type": "application/json"})
    assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "malformed_json"
    nan = b'{"operator": "account", "key": "k", "function": "deposit", "args": [NaN]}'
    error = (await http.post(post, content=nan)).json()["error"]
    assert error["code"] == "malformed_json" and "NaN is not a JSON number" in error["message"]
    schema = await http.post(post, json={"operator": "account", "key": 1.5, "function": "deposit"})
    assert schema.status_code == 422 and schema.json()["error"]["errors"][0]["loc"][:2] == ["body", "key"]
    unknown = await http.post(post, json={"operator": "nope", "key": "k", "function": "deposit"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_operator"
    assert backend.sent == [], "nothing reached the cluster"
    metrics = (await http.get("/metrics")).text
    assert 'styx_gateway_errors_total{code="unknown_operator",status="404"} 1.0' in metrics
    assert 'route="/v1/invocations",status="422"' in metrics


async def test_the_openapi_schema_still_declares_the_body() -> None:
    gateway = Gateway(GatewayConfig("127.0.0.1:1", port=0))
    openapi = gateway.app.openapi()
    operation = openapi["paths"]["/v1/invocations"]["post"]
    assert operation["operationId"] == "submitInvocation"
    ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref.endswith("/InvocationRequest")
    fields = openapi["components"]["schemas"]["InvocationRequest"]["properties"]
    assert set(fields) == set(InvocationBody.__struct_fields__)
    assert {p["name"] for p in operation["parameters"]} >= {"wait", "timeout_s", "Idempotency-Key"}
    json.dumps(openapi)
