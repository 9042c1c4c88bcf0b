"""The coordinator's and workers' HTTP endpoint for Prometheus and probes (``STYX_METRICS_PORT``).

``GET /metrics``  Prometheus text exposition of the process's private registry
``GET /healthz``  liveness: 200 whenever the process's event loop answers
``GET /readyz``   readiness: 200 or 503 with the reason, from the ``ready`` callback

It is served by the process's own asyncio event loop, not by a thread (``start_http_server``): a
scrape then reads the engine's counters between two loop steps (no torn reads of tables the loop
mutates), and a hung event loop fails the liveness probe, which is what a supervisor must restart.
Every connection answers one request and closes; heads are bounded in size and time. An answer that
raises (a bug in the readiness callback or a collector) is not left to the event loop's default
handler while the process runs on: :meth:`MetricsServer.run`, one of the process's tasks, raises it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from bisect import bisect_left
from collections.abc import Callable, Mapping

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import HistogramMetricFamily

from styx_py.core.limits import METRICS_HEAD_TIMEOUT_S, METRICS_MAX_HEAD_BYTES

__all__ = [
    "EPOCH_BUCKETS_S",
    "SLOW_BUCKETS_S",
    "SNAPSHOT_BYTES_BUCKETS",
    "LoopHistogram",
    "MetricsServer",
    "Readiness",
    "histogram_family",
]

log = logging.getLogger("styx.metrics")

# Epoch phases run from ~100 µs (an idle epoch) to the epoch timeout (30 s by default).
EPOCH_BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
# Snapshot uploads and recoveries: milliseconds (small state) to minutes (large state, slow S3).
SLOW_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
SNAPSHOT_BYTES_BUCKETS = tuple(float(4**i * 1024) for i in range(13))  # 1 KiB … 16 GiB


class LoopHistogram:
    """A histogram updated only from one event loop (and read there, by the metrics endpoint).

    ``prometheus_client.Histogram.observe`` takes a lock and costs ~6 µs on this machine;
    this is a bisect and two additions (~1 µs), cheap enough for once-per-epoch observations.
    """

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        assert list(bounds) == sorted(bounds), "bucket bounds must ascend"
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # Prometheus buckets are "le" (<=)
        self.total += value


def histogram_family(
    name: str, documentation: str, label: str | None, histograms: Mapping[str, LoopHistogram]
) -> HistogramMetricFamily:
    """The exposition of ``histograms`` (one per value of ``label``; one unlabelled under key "")."""
    family = HistogramMetricFamily(name, documentation, labels=[label] if label else None)
    for label_value, h in histograms.items():
        cumulative, buckets = 0, []
        for bound, count in zip(h.bounds, h.counts, strict=False):
            cumulative += count
            buckets.append((repr(float(bound)), float(cumulative)))
        buckets.append(("+Inf", float(cumulative + h.counts[-1])))
        family.add_metric([label_value] if label else [], buckets, h.total)
    return family


Readiness = Callable[[], tuple[bool, str]]


class MetricsServer:
    def __init__(self, registry: CollectorRegistry, ready: Readiness, host: str, port: int) -> None:
        self.registry = registry
        self.ready = ready
        self.host = host
        self.port = port
        self.server: asyncio.Server | None = None
        self.failure: Exception | None = None  # what an answer raised (a bug), for run() to raise
        self._failed = asyncio.Event()

    async def start(self) -> None:
        self.server = await asyncio.start_server(
            self._serve, self.host, self.port, limit=METRICS_MAX_HEAD_BYTES
        )
        self.port = self.server.sockets[0].getsockname()[1]

    async def run(self) -> None:
        """Until an answer raised: raises what it raised (run it among the process's tasks)."""
        await self._failed.wait()
        assert self.failure is not None
        raise self.failure

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(ConnectionError):
                await self.server.wait_closed()

    def answer(self, method: str, path: str) -> tuple[int, str, bytes]:
        """Status, content type and body for one request (no I/O: unit-testable)."""
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"method not allowed\n"
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            ok, reason = self.ready()
            return (
                (200 if ok else 503),
                "text/plain",
                (reason or ("ready" if ok else "not ready")).encode() + b"\n",
            )
        return 404, "text/plain", b"not found: /metrics, /healthz, /readyz\n"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(METRICS_HEAD_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = request_line.split(" ")
            if len(parts) != 3:
                status, ctype, body = 400, "text/plain", b"bad request\n"
            else:
                method, target = parts[0], parts[1]
                status, ctype, body = self.answer(method, target.split("?", 1)[0])
                if method == "HEAD":
                    body = b""
            reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}.get(
                status, "Service Unavailable"
            )
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode("latin-1")
                + body
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # a client that sent no complete head in time, or went away: nothing to answer
        except Exception as exc:  # not swallowed: run() raises it, and the process ends
            log.critical("answering a metrics or probe request raised", exc_info=exc)
            if self.failure is None:
                self.failure = exc
                self._failed.set()
        finally:
            writer.close()
