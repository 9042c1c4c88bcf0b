"""The gateway process: :class:`Gateway` wires the parts together and serves them with uvicorn.

:meth:`Gateway.run` serves the ASGI app and, in one task group, polls the coordinator's status (which
also connects the SDK client once a graph is deployed), sends the cluster reply lookups and runs the
invocation jobs; shutdown cancels the group once uvicorn has finished the requests in flight.
"""

import asyncio
import contextlib
import signal
import socket
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from styx_client.gateway.app import build_app, direct_routes
from styx_client.gateway.cluster import (
    Backend,
    BackendFactory,
    ClusterInfo,
    ClusterLink,
    StatusSource,
    connect_client,
    coordinator_status,
)
from styx_client.gateway.config import GatewayConfig
from styx_client.gateway.guard import Guard
from styx_client.gateway.history import ClusterHistory
from styx_client.gateway.invocations import Invocations
from styx_client.gateway.jobs import GatewayStats, Jobs
from styx_client.gateway.lookups import ClusterReplies, LookupSource, coordinator_lookup
from styx_client.gateway.metrics import GatewayMetrics
from styx_client.gateway.onewrite import OneWriteProtocol
from styx_client.gateway.recent import RecentInvocations
from styx_client.gateway.replies import ReplyCache
from styx_py.core.errors import StyxError
from styx_py.io.stateread import ReadSource, admin_reads

__all__ = ["Gateway", "bind_socket", "build_gateway", "serve_gateway"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Gateway:
    """The HTTP gateway: an ASGI app (:attr:`asgi`) plus the background work it needs."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        status_source: StatusSource | None = None,
        backend_factory: BackendFactory | None = None,
        reply_lookup: LookupSource | None = None,
        state_reads: ReadSource | None = None,
    ) -> None:
        self.config = config
        self.metrics = GatewayMetrics()
        self.link = ClusterLink(
            config,
            status_source or coordinator_status(config.coordinator, cluster_secret=config.cluster_secret),
            backend_factory or connect_client,
        )
        self.history = ClusterHistory()
        self.link.on_status = self.history.record
        self.replies = ReplyCache(
            config.limits.max_cached_replies, config.limits.max_cache_bytes, config.limits.idempotency_ttl_s
        )
        self.stats = GatewayStats()
        self.recent = RecentInvocations(config.limits.max_recent_invocations, config.limits.max_recent_bytes)
        self.jobs = Jobs(config, self.replies, self.stats, self.metrics, self.recent)
        self.cluster_replies = ClusterReplies(
            reply_lookup or coordinator_lookup(config.coordinator, cluster_secret=config.cluster_secret),
            self.metrics.lookup,
        )
        self.state_reads = state_reads or admin_reads(config.coordinator, secret=config.cluster_secret)
        self.invocations = Invocations(
            config, self.link, self.jobs, self.replies, self.stats, self.cluster_replies
        )
        self.metrics.track(lambda: len(self.jobs), lambda: len(self.replies))
        self.app = build_app(self)
        self.asgi: ASGIApp = Guard(self.app, self, direct_routes(self.app, self))
        self.port: int | None = None
        self._server: _Server | None = None
        self._stop_requested = False

    @property
    def cluster(self) -> ClusterInfo:
        """The latest view of the cluster."""
        return self.link.info

    @property
    def backend(self) -> Backend | None:
        """The SDK client, once connected."""
        return self.link.backend

    @property
    def url(self) -> str:
        assert self.port is not None, "the gateway is not bound yet"
        host = self.config.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def bind(self) -> socket.socket:
        """Bind the listening socket now, so the port (even ``port=0``) is known before serving."""
        return bind_socket(self.config.host, self.config.port)

    async def run(self, sock: socket.socket | None = None, *, handle_signals: bool = False) -> None:
        """Serve until :meth:`stop` (or SIGINT/SIGTERM with ``handle_signals``); then clean up."""
        sock = sock if sock is not None else self.bind()
        self.port = int(sock.getsockname()[1])
        server = self._server = _Server(_uvicorn_config(self.asgi, self.config))
        if self._stop_requested:
            server.should_exit = True
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in _SIGNALS:
                loop.add_signal_handler(sig, self.stop)
        try:
            await self._serve(server, sock)
        finally:
            if handle_signals:
                for sig in _SIGNALS:
                    loop.remove_signal_handler(sig)
            await self.link.close()
            sock.close()

    async def _serve(self, server: uvicorn.Server, sock: socket.socket) -> None:
        """uvicorn and, beside it, the status poller and the jobs, in one task group."""
        try:
            async with asyncio.TaskGroup() as tg:
                self.jobs.group = tg
                watcher = tg.create_task(self.link.run(), name="gateway-status")
                lookups = tg.create_task(self.cluster_replies.run(), name="gateway-lookups")
                await server.serve(sockets=[sock])
                # No HTTP request is being handled any more: end the background work.
                watcher.cancel()
                lookups.cancel()
                self.jobs.cancel()
        finally:
            self.jobs.group = None

    def stop(self) -> None:
        """Ask the server to finish (in-flight requests get ``shutdown_grace_s``). Loop-thread only."""
        self._stop_requested = True
        if self._server is not None:
            self._server.should_exit = True


class _Server(uvicorn.Server):
    """uvicorn minus its signal capture: :meth:`Gateway.run` owns the signals (also off the main thread)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _uvicorn_config(asgi: ASGIApp, config: GatewayConfig) -> uvicorn.Config:
    return uvicorn.Config(
        asgi,
        lifespan="off",  # the gateway's own task group is the lifecycle
        http=OneWriteProtocol,  # httptools, a response's head and body in one write
        access_log=False,
        log_config=None,
        log_level="warning",
        # Longer than clients' idle pools: a server closing an idle keep-alive connection races a
        # client reusing it (httpx ReadError); uvicorn's default is 5 s.
        timeout_keep_alive=75,
        timeout_graceful_shutdown=config.timing.shutdown_grace_s,
    )


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``; a clear error when it cannot be had."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise StyxError(f"gateway: cannot resolve {host}:{port}: {exc}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise StyxError(f"gateway: cannot listen on {host}:{port}: {exc}") from exc
    return sock


def build_gateway(config: GatewayConfig, **kw: Any) -> Gateway:
    """A gateway for ``config``; keyword arguments go to :class:`Gateway` (test injection points)."""
    return Gateway(config, **kw)


async def serve_gateway(config: GatewayConfig, *, announce: Callable[[str], None] | None = None) -> None:
    """Run a gateway until SIGINT/SIGTERM (the ``styx gateway`` command)."""
    gateway = build_gateway(config)
    sock = gateway.bind()
    gateway.port = int(sock.getsockname()[1])
    if announce is not None:
        announce(gateway.url)
    await gateway.run(sock, handle_signals=True)
