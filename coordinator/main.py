"""Coordinator process: ``styx coordinator --port P --kafka BOOTSTRAP --workers N``."""

from __future__ import annotations

import asyncio
import logging

from styx_py.coordinator.server import Coordinator
from styx_py.core.config import Config
from styx_py.core.wire import COORDINATOR
from styx_py.io.handshake import require_secret
from styx_py.io.kafka_admin import create_topics
from styx_py.io.kafka_logs import KafkaLogReader
from styx_py.io.links import TransportLimits
from styx_py.io.metrics import MetricsServer
from styx_py.io.s3 import blob_store_from
from styx_py.io.tcp import EXIT_HANDLER_FAILED, HandlerFailed, TcpTransport

log = logging.getLogger("styx.coordinator")


async def serve_coordinator(
    config: Config,
    kafka: str,
    min_workers: int,
    host: str = "127.0.0.1",
    port: int = 0,
    deploy: str | None = None,
) -> None:
    coordinator: Coordinator | None = None

    def handle(src: str, msg: object) -> None:
        assert coordinator is not None
        coordinator.on_message(src, msg)  # type: ignore[arg-type]

    require_secret(config.cluster_secret, host, "coordinator")
    transport = TcpTransport(
        COORDINATOR,
        handle,
        host,
        port,
        inbox="coordinator",
        secret=config.cluster_secret,
        limits=TransportLimits.from_config(config),
    )

    async def topics(spec: dict[str, int]) -> None:
        await create_topics(kafka, spec, replication_factor=config.kafka_replication_factor)

    blobs = blob_store_from(config)
    coordinator = Coordinator(
        config,
        transport,
        min_workers=min_workers,
        kafka_bootstrap=kafka,
        create_topics=topics,
        blobs=blobs,
        logs=KafkaLogReader(kafka, config),
    )
    resumed = await coordinator.resume()
    await transport.start()
    log.info("coordinator listening on %s:%d", host, transport.port)
    if not config.cluster_secret:
        log.warning("no cluster_secret (STYX_CLUSTER_SECRET): any local process can join (loopback only)")
    coordinator.metrics.registry.register(transport.collector("styx_coordinator"))
    metrics: MetricsServer | None = None
    if config.metrics_port:
        m = coordinator.metrics
        metrics = MetricsServer(m.registry, m.readiness, config.metrics_host, config.metrics_port)
        await metrics.start()
        log.info("coordinator metrics on http://%s:%d/metrics", config.metrics_host, metrics.port)
    handler_failed = False
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(transport.run())  # raises HandlerFailed when a message handler raised
            tg.create_task(coordinator.run())
            if deploy is not None and not resumed:
                tg.create_task(coordinator.deploy(deploy))
    except* HandlerFailed:
        handler_failed = True  # logged CRITICAL with its traceback by the transport
    finally:
        if metrics is not None:
            await metrics.close()
        await transport.close()
    if handler_failed:
        raise SystemExit(EXIT_HANDLER_FAILED)
