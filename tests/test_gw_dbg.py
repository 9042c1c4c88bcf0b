import asyncio, httpx, pytest
from tests.test_gateway import *  # noqa

async def test_dbg(gateway, http):
    r = await http.post("/v1/invocations", json=invocation("zz", "deposit", 1), params={"timeout_s": 3}, timeout=10)
    print(r.status_code, r.text)
    print(gateway.gateway.backend.stats, gateway.gateway.stats, gateway.gateway.jobs)
    assert 0
