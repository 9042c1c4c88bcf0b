"""The HTTP gateway's own CPU per ``POST /v1/invocations``, in process, without a cluster or sockets.

    python -m styx_benchmarks.gateway_cpu --requests 3000 [--profile]

Calls the gateway's ASGI app (the guard, the lean invocation path, the idempotency table, the jobs,
the recent-invocations window, the metrics) directly with one request at a time, against a backend
that commits every request at once (:class:`InstantBackend`), and prints the process CPU time per
request. What it leaves out is what the whole gateway adds on top (measured with
:mod:`styx_benchmarks.http_overhead`): uvicorn's HTTP parsing and socket writes, the event loop's
wake-ups, and the SDK's produce and reply reads. ``--profile`` prints cProfile's top functions.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import sys
import time
from collections.abc import Collection, Mapping
from typing import Any

import msgspec

from styx_client.gateway import Gateway, GatewayConfig
from styx_client.gateway.guard import replay_body
from styx_py.core.wire import Key, Reply, encode_value

__all__ = ["STATUS", "InstantBackend", "instant_gateway"]

STATUS = {
    "state": "running",
    "graph": "bank",
    "operators": [{"name": "account", "partitions": 4, "functions": ["deposit", "transfer"]}],
}
"""A coordinator status: the bank app deployed."""


class InstantBackend:
    """The gateway's backend committing every request at once, its arguments as the result."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def submit(
        self,
        operator: str,
        key: Key,
        function: str,
        *args: Any,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Reply:
        assert request_id is not None
        self.sent.append(request_id)
        result = msgspec.Raw(encode_value(list(args)))
        return Reply(request_id, 1, 2, 0, "committed", result, None, None)  # type: ignore[arg-type]

    async def close(self) -> None:
        return None

    def set_deployment(
        self, operators: Mapping[str, int], functions: Mapping[str, Collection[str]] | None = None
    ) -> None:
        return None


async def instant_gateway(backend: InstantBackend) -> Gateway:
    """A gateway that sees :data:`STATUS` and has ``backend`` connected (set ``jobs.group`` to serve)."""

    async def status() -> Mapping[str, Any]:
        return STATUS

    async def factory(status: Mapping[str, Any], config: GatewayConfig) -> InstantBackend:
        return backend

    gateway = Gateway(GatewayConfig("127.0.0.1:1", port=0), status_source=status, backend_factory=factory)
    await gateway.link._poll(0)  # one status poll: the backend connects
    return gateway


async def _post(gateway: Gateway, body: bytes, headers: list[tuple[bytes, bytes]]) -> int:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/invocations",
        "raw_path": b"/v1/invocations",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 1),
    }
    sent: list[Any] = []

    async def connected() -> Any:
        await asyncio.Event().wait()  # no disconnect while the request runs

    async def send(message: Any) -> None:
        sent.append(message)

    await gateway.asgi(scope, replay_body(body, connected), send)
    status: int = sent[0]["status"]
    return status


async def measure(requests: int, profile: bool) -> float:
    """CPU seconds per request over ``requests`` POSTs after a warm-up."""
    gateway = await instant_gateway(InstantBackend())
    call = {"operator": "account", "key": "acct1", "function": "transfer", "args": ["acct2", 5]}
    body = json.dumps(call).encode()
    headers = [
        (b"host", b"gateway"),
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
    ]
    profiler = cProfile.Profile() if profile else None
    async with asyncio.TaskGroup() as tg:
        gateway.jobs.group = tg
        for _ in range(200):
            assert await _post(gateway, body, headers) == 200
        started = time.process_time()
        if profiler is not None:
            profiler.enable()
        for _ in range(requests):
            await _post(gateway, body, headers)
        if profiler is not None:
            profiler.disable()
        used = time.process_time() - started
        gateway.jobs.group = None
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    return used / requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=3000, help="measured requests (default 3000)")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions")
    args = parser.parse_args()
    per_request = asyncio.run(measure(args.requests, args.profile))
    print(f"gateway CPU per POST /v1/invocations (in process, instant backend): {per_request * 1e6:.0f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
