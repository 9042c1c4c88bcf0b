"""Coordinator process: ``styx coordinator --port P --kafka BOOTSTRAP --workers N``."""

from __future__ import annotations

import asyncio
import logging

from styx_py.coordinator.server import Coordinator
from styx_py.core.config import Config
from styx_py.core.wire import COORDINATOR
from styx_py.io.kafka_admin import create_topics
from styx_py.io.kafka_logs import KafkaLogReader
from styx_py.io.metrics import MetricsServer
from styx_py.io.s3 import blob_store_from
from styx_py.io.tcp import TcpTransport

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

    transport = TcpTransport(COORDINATOR, handle, host, port, inbox="coordinator")

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
    metrics: MetricsServer | None = None
    if config.metrics_port:
        m = coordinator.metrics
        metrics = MetricsServer(m.registry, m.readiness, config.metrics_host, config.metrics_port)
        await metrics.start()
        log.info("coordinator metrics on http://%s:%d/metrics", config.metrics_host, metrics.port)
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(coordinator.run())
            if deploy is not None and not resumed:
                tg.create_task(coordinator.deploy(deploy))
    finally:
        if metrics is not None:
            await metrics.close()
        await transport.close()
