"""Coordinator process: ``styx coordinator --port P --kafka BOOTSTRAP --workers N``."""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import Any

from styx_py.coordinator.server import Coordinator
from styx_py.core.config import Config
from styx_py.core.errors import ConfigError
from styx_py.core.segments import MIN_PERIOD_S
from styx_py.core.wire import COORDINATOR, Message
from styx_py.io.kafka_admin import TopicAdmin
from styx_py.io.kafka_logs import KafkaLogReader
from styx_py.io.s3 import blob_store_from
from styx_py.io.serving import cluster_transport, run_until_failure, start_metrics

log = logging.getLogger("styx.coordinator")


async def serve_coordinator(
    config: Config,
    kafka: str,
    min_workers: int,
    host: str = "127.0.0.1",
    port: int = 0,
    deploy: str | None = None,
) -> None:
    if 0 < config.log_segment_s < MIN_PERIOD_S:
        # Clients count on segments at least this far apart (core.segments.FRESH_S).
        raise ConfigError(f"log_segment_s={config.log_segment_s} must be 0 or >= {MIN_PERIOD_S}")
    coordinator: Coordinator | None = None

    def handle(src: str, msg: Message) -> None:
        assert coordinator is not None
        coordinator.on_message(src, msg)

    transport = cluster_transport(
        COORDINATOR, handle, config, host, port, inbox="coordinator", who="coordinator"
    )

    # One admin client for the process: the coordinator creates two topics per log segment.
    admin = TopicAdmin(kafka, replication_factor=config.kafka_replication_factor)
    blobs = blob_store_from(config)
    coordinator = Coordinator(
        config,
        transport,
        min_workers=min_workers,
        kafka_bootstrap=kafka,
        create_topics=admin.create,
        blobs=blobs,
        logs=KafkaLogReader(kafka, config),
    )
    resumed = await coordinator.resume()
    await transport.start()
    log.info("coordinator listening on %s:%d", host, transport.port)
    coordinator.metrics.registry.register(transport.collector("styx_coordinator"))
    m = coordinator.metrics
    metrics = await start_metrics(m.registry, m.readiness, config, "coordinator")
    tasks: list[Coroutine[Any, Any, object]] = [coordinator.run()]
    if deploy is not None and not resumed:
        tasks.append(coordinator.deploy(deploy))
    await run_until_failure(transport, tasks, [admin.close, *([metrics.close] if metrics else [])])
