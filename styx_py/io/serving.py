"""What the coordinator and worker processes set up alike: the authenticated cluster transport, the
metrics endpoint, and the run that ends the process with exit code 70 when a message handler or a
task raised."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from styx_py.core.config import Config
from styx_py.core.errors import StyxError
from styx_py.core.wire import Inbox, Message
from styx_py.io.handshake import require_secret
from styx_py.io.links import TransportLimits
from styx_py.io.metrics import MetricsServer, Readiness
from styx_py.io.tcp import EXIT_HANDLER_FAILED, HandlerFailed, TcpTransport
from styx_py.io.tls import Tls

__all__ = ["cluster_transport", "run_until_failure", "start_metrics"]

log = logging.getLogger("styx.io")


class _Ended(Exception):
    """One of run_until_failure's tasks returned: the others stop."""


def cluster_transport(
    node_id: str,
    handle: Callable[[str, Message], None],
    config: Config,
    host: str,
    port: int,
    *,
    inbox: Inbox,
    who: str,
) -> TcpTransport:
    """The process's TCP transport, authenticated with the cluster secret (refused without one unless
    ``host`` is loopback, see :func:`~styx_py.io.handshake.require_secret`), in mutual TLS when the
    configuration names the TLS files."""
    require_secret(config.cluster_secret, host, who)
    if not config.cluster_secret:
        log.warning("no cluster_secret (STYX_CLUSTER_SECRET): any local process can join (loopback only)")
    files = config.internal_tls()
    return TcpTransport(
        node_id,
        handle,
        host,
        port,
        inbox=inbox,
        secret=config.cluster_secret,
        limits=TransportLimits.from_config(config),
        tls=None if files is None else Tls(files),
    )


async def start_metrics(
    registry: CollectorRegistry, readiness: Readiness, config: Config, who: str
) -> MetricsServer | None:
    """The ``/metrics`` and health endpoint on ``metrics_port``, started; None when that port is 0."""
    if not config.metrics_port:
        return None
    metrics = MetricsServer(registry, readiness, config.metrics_host, config.metrics_port)
    await metrics.start()
    log.info("%s metrics on http://%s:%d/metrics", who, config.metrics_host, metrics.port)
    return metrics


async def run_until_failure(
    transport: TcpTransport,
    tasks: Sequence[Coroutine[Any, Any, object]],
    closing: Sequence[Callable[[], Awaitable[None]]],
) -> None:
    """Run the transport and ``tasks`` until one ends; then ``closing`` in order, and the transport.

    A task that returns (a worker that left the cluster) ends the run cleanly, once what the transport
    buffered was sent. So does SIGTERM (a supervisor's stop): ``closing`` runs (producers flushed and
    closed, the compaction pool shut down) and the process exits 0; a second SIGTERM meanwhile ends it
    at once. A message handler that raised ends the process with
    :data:`~styx_py.io.tcp.EXIT_HANDLER_FAILED` (the transport logged it CRITICAL with its traceback):
    its state can no longer be trusted, and the supervisor's restart is the recovery. So does a task
    that raised anything but a :class:`~styx_py.core.errors.StyxError` (operating errors are handled
    where they happen, so that is a bug): it is logged CRITICAL with its traceback, never retried nor
    left to a task's default handler. A StyxError a task let through (a ``--deploy`` at start-up that
    was refused) is an operating error: it is raised as it is, once ``closing`` ran, for the command
    line to print in one line (exit code 2).
    """
    handler_failed = False
    task_failed = False
    refused: StyxError | None = None

    async def until_it_ends(task: Coroutine[Any, Any, object]) -> None:
        await task
        await transport.drain()
        raise _Ended

    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(transport.run())  # raises HandlerFailed when a message handler raised
            for task in tasks:
                tg.create_task(until_it_ends(task))
            tg.create_task(_until_sigterm())
    except* HandlerFailed:
        handler_failed = True
    except* _Ended:
        pass
    except* StyxError as group:
        refused = _first(group)
    except* Exception as group:  # not swallowed: logged, and the process ends (below)
        log.critical("a task raised: ending the process (exit code %d)", EXIT_HANDLER_FAILED, exc_info=group)
        task_failed = True
    finally:
        for close in closing:
            await close()
        await transport.close()
    if handler_failed or task_failed:
        raise SystemExit(EXIT_HANDLER_FAILED)
    if refused is not None:
        raise refused


def _first(group: BaseExceptionGroup[StyxError]) -> StyxError:
    """The first exception of ``group``, however deeply nested (a task's own task group nests one)."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


async def _until_sigterm() -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def terminate() -> None:
        loop.remove_signal_handler(signal.SIGTERM)  # the next one has its default effect
        log.info("SIGTERM: stopping")
        stop.set()

    loop.add_signal_handler(signal.SIGTERM, terminate)
    try:
        await stop.wait()
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
    raise _Ended
