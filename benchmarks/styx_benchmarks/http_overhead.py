"""What the HTTP gateway adds on top of the SDK: bank transfers at a fixed rate, both ways, p50/p99.

    python -m styx_benchmarks.http_overhead --rate 200 --seconds 10

Starts a local cluster (SeaweedFS, Tansu in memory, coordinator, 2 workers and the ``styx gateway``
process), deploys the bank app, loads the accounts, then runs the same open-loop transfer workload
through the SDK (this process → Kafka → cluster → Kafka → this process) and through the gateway
(this process → HTTP → gateway process → Kafka → cluster → … → HTTP), in the order SDK, HTTP, HTTP,
SDK so that drift (the broker slows as its log grows) hits both paths alike. Latency is measured
from each request's scheduled send time, so a stalled client cannot hide queueing. The HTTP client
is httpx with keep-alive connections; its own cost is part of the HTTP numbers, as it would be for
``gateway`` is the HTTP round trip minus the submit → reply time the gateway reports in its
``Server-Timing`` header: the cost of HTTP, FastAPI and the gateway itself. With a stack it starts,
it also prints the gateway process's CPU per HTTP request (from ``/proc``: its CPU over the HTTP
phases minus its idle CPU over the SDK phases, divided by the HTTP requests) and this process's own
CPU per request on each path (the load generator's).

The HTTP client is a minimal keep-alive HTTP/1.1 client (below) by default. ``--client httpx`` uses
httpx instead, whose connection pool costs about 3.5 ms of CPU per request here (profiled: httpcore's
pool bookkeeping and sniffio look-ups), so at 200/s the load generator itself queues and the
numbers measure httpx, not the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from styx_benchmarks.cpu import cpu_seconds
from styx_benchmarks.demo import percentile
from styx_client import StyxClient
from styx_py.stack.local import LocalStack

ACCOUNTS = 1000
INITIAL = 100

Send = Callable[[str, str, int], Awaitable[float | None]]
Post = Callable[[str, bytes], Awaitable[tuple[int, bytes, float]]]  # status, body, gateway's ms
"""Send one transfer; return the gateway's own submit → reply time in ms (HTTP only)."""


async def paced(send: Send, rate: float, seconds: float, seed: int) -> tuple[list[float], list[float]]:
    """Open-loop: request i leaves at start + i/rate whatever happened to the others."""
    rng = random.Random(seed)
    latencies: list[float] = []
    gateway_costs: list[float] = []

    async def one(scheduled: float, src: str, dst: str, amount: int) -> None:
        inner_ms = await send(src, dst, amount)
        done = time.perf_counter()
        latencies.append(done - scheduled)
        if inner_ms is not None:
            gateway_costs.append(done - scheduled - inner_ms / 1000)

    n = int(rate * seconds)
    start = time.perf_counter() + 0.05
    async with asyncio.TaskGroup() as tg:
        for i in range(n):
            scheduled = start + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            a, b = rng.sample(range(ACCOUNTS), 2)
            tg.create_task(one(scheduled, f"acct{a}", f"acct{b}", rng.randint(1, 50)))
    return latencies, gateway_costs


class KeepAliveClient:
    """Just enough HTTP/1.1 for a load generator: POST JSON on pooled keep-alive connections.

    Assumes a well-behaved server that answers with Content-Length (uvicorn does); any error closes
    the connection and propagates.
    """

    def __init__(self, url: str, max_connections: int = 256) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.host, self.port = host, int(port)
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.slots = asyncio.Semaphore(max_connections)

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        status, data, _ = await self.request_timed("POST", path, body)
        return status, data

    async def post_timed(self, path: str, body: bytes) -> tuple[int, bytes, float]:
        """POST; also the submit → reply milliseconds of the gateway's ``Server-Timing`` header."""
        return await self.request_timed("POST", path, body)

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        status, data, _ = await self.request_timed(method, path, body)
        return status, data

    async def request_timed(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes, float]:
        request = (
            b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s"
            % (method.encode(), path.encode(), self.host.encode(), len(body), body)
        )
        async with self.slots:
            while self.idle:
                # A pooled connection may have been closed by the server's keep-alive timeout: retry
                # on the next one; a fresh connection's failure is real and propagates.
                reader, writer = self.idle.pop()
                try:
                    return await self._exchange(reader, writer, request)
                except (asyncio.IncompleteReadError, ConnectionError) as exc:
                    if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                        raise
            reader, writer = await asyncio.open_connection(self.host, self.port)
            return await self._exchange(reader, writer, request)

    async def _exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
    ) -> tuple[int, bytes, float]:
        timing = ""
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
                elif name.strip().lower() == b"server-timing":
                    timing = value.decode()
            data = await reader.readexactly(length)
        except BaseException:
            writer.close()
            raise
        self.idle.append((reader, writer))
        return status, data, server_timing_ms(timing)

    async def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


def server_timing_ms(header: str) -> float:
    """The ``dur`` of the gateway's ``Server-Timing: cluster;dur=MS`` header (0.0 when absent)."""
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name == "dur":
            return float(value)
    return 0.0


async def httpx_poster(http: httpx.AsyncClient) -> Post:
    async def post(path: str, body: bytes) -> tuple[int, bytes, float]:
        response = await http.post(path, content=body, headers={"content-type": "application/json"})
        return (
            response.status_code,
            response.content,
            server_timing_ms(response.headers.get("server-timing", "")),
        )

    return post


def summary(name: str, values: list[float]) -> str:
    ordered = sorted(values)
    return (
        f"{name:<8} n={len(ordered):<5} p50 {percentile(ordered, 0.5) * 1e3:6.2f} ms  "
        f"p90 {percentile(ordered, 0.9) * 1e3:6.2f} ms  p99 {percentile(ordered, 0.99) * 1e3:6.2f} ms  "
        f"max {ordered[-1] * 1e3:6.2f} ms"
    )


async def measure(
    coordinator: str,
    gateway_url: str,
    rate: float,
    seconds: float,
    client_kind: str,
    gateway_pid: int | None = None,
) -> bool:
    async with await StyxClient.connect(coordinator) as client:
        await asyncio.gather(
            *(client.submit("account", f"acct{i}", "deposit", INITIAL) for i in range(ACCOUNTS))
        )
        # Transfers move money and never create it (a reused cluster may hold more than INITIAL each).
        loaded: int = sum(
            await asyncio.gather(*(client.call("account", f"acct{i}", "balance") for i in range(ACCOUNTS)))
        )
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        async with httpx.AsyncClient(base_url=gateway_url, limits=limits, timeout=30) as http:
            for _ in range(600):  # the gateway connects its client at its next status poll
                if (await http.get("/readyz")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
            else:
                raise SystemExit(f"the gateway at {gateway_url} did not become ready")

            async def via_sdk(src: str, dst: str, amount: int) -> float | None:
                reply = await client.submit("account", src, "transfer", dst, amount)
                assert reply.status in ("committed", "aborted"), reply
                return None

            raw = KeepAliveClient(gateway_url)
            post = raw.post_timed if client_kind == "raw" else await httpx_poster(http)

            async def via_http(src: str, dst: str, amount: int) -> float | None:
                body = {"operator": "account", "key": src, "function": "transfer", "args": [dst, amount]}
                status, data, gateway_ms = await post("/v1/invocations", json.dumps(body).encode())
                assert status in (200, 409), data
                return gateway_ms

            # Warm both paths (connections, caches) before measuring.
            await paced(via_sdk, rate, 1.0, seed=0)
            await paced(via_http, rate, 1.0, seed=0)
            results: dict[str, list[float]] = {"sdk": [], "http": [], "gateway": []}
            gateway_cpu = {"sdk": 0.0, "http": 0.0}  # the gateway process's CPU seconds in each phase
            own_cpu = {"sdk": 0.0, "http": 0.0}  # this process's (the load generator's)
            for seed, (name, send) in enumerate(
                [("sdk", via_sdk), ("http", via_http), ("http", via_http), ("sdk", via_sdk)], start=1
            ):
                cpu_before, own_before = cpu_seconds(gateway_pid), time.process_time()
                latencies, costs = await paced(send, rate, seconds / 2, seed)
                gateway_cpu[name] += cpu_seconds(gateway_pid) - cpu_before
                own_cpu[name] += time.process_time() - own_before
                results[name] += latencies
                results["gateway"] += costs
            await raw.close()
            balances = await asyncio.gather(
                *(client.call("account", f"acct{i}", "balance") for i in range(ACCOUNTS))
            )

    print(
        f"bank transfers at {rate:g}/s, {seconds:g} s per path (as 2 halves, order SDK HTTP HTTP SDK), "
        f"HTTP client: {client_kind}"
    )
    for name, values in results.items():
        print(summary(name, values))
    sdk, via = sorted(results["sdk"]), sorted(results["http"])
    print(
        f"HTTP overhead: p50 {(percentile(via, 0.5) - percentile(sdk, 0.5)) * 1e3:+.2f} ms, "
        f"p99 {(percentile(via, 0.99) - percentile(sdk, 0.99)) * 1e3:+.2f} ms"
    )
    if gateway_pid is not None:
        # While the SDK runs the gateway only polls the coordinator: that idle cost is not per request.
        per_request = (gateway_cpu["http"] - gateway_cpu["sdk"]) / max(1, len(results["http"]))
        print(
            f"gateway process CPU: {gateway_cpu['http']:.2f} s over the HTTP phases, "
            f"{gateway_cpu['sdk']:.2f} s (idle) over the SDK phases: "
            f"{per_request * 1e6:.0f} µs per HTTP request"
        )
    print(
        f"load generator CPU per request: {own_cpu['sdk'] / max(1, len(results['sdk'])) * 1e6:.0f} µs "
        f"(SDK), {own_cpu['http'] / max(1, len(results['http'])) * 1e6:.0f} µs (HTTP)"
    )
    total = int(sum(balances))
    print(f"money conserved: {total} == {loaded}: {'yes' if total == loaded else 'NO'}")
    return total == loaded


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=200.0, help="transfers per second (default 200)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per path (default 10)")
    parser.add_argument(
        "--client",
        choices=["raw", "httpx"],
        default="raw",
        help="HTTP client of the load generator (default raw)",
    )
    parser.add_argument(
        "--coordinator", help="use this running cluster (bank app deployed) instead of a new one"
    )
    parser.add_argument("--gateway", help="with --coordinator: the cluster's gateway URL")
    args = parser.parse_args()
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # refused connections while Tansu starts
    if args.coordinator:
        if not args.gateway:
            parser.error("--coordinator needs --gateway")
        return (
            0
            if asyncio.run(measure(args.coordinator, args.gateway, args.rate, args.seconds, args.client))
            else 1
        )
    data_dir = Path(tempfile.mkdtemp(prefix="styx-bench-"))
    try:
        with LocalStack(data_dir, workers=2, gateway=True, env={"STYX_LOG_LEVEL": "WARNING"}) as stack:
            stack.deploy("styx_benchmarks.bank:app")
            ok = asyncio.run(
                measure(
                    stack.coordinator,
                    stack.gateway_url,
                    args.rate,
                    args.seconds,
                    args.client,
                    stack.pids().get("gateway"),
                )
            )
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
