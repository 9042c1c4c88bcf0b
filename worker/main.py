"""Worker process: ``styx worker --id w1 --coordinator HOST:PORT --kafka BOOTSTRAP``.

The worker listens on ``host:port`` and tells the coordinator (and so its peers) to reach it at
``advertise_host:port``: behind a wildcard bind (``0.0.0.0`` in a container) that is the worker's
stable DNS name, e.g. ``$(POD_NAME).styx-worker`` in a StatefulSet.
"""

from __future__ import annotations

import asyncio
import logging

from styx_py.core.config import Config
from styx_py.core.wire import COORDINATOR, ClusterView, Message
from styx_py.io.handshake import require_secret
from styx_py.io.kafka_logs import KafkaLogReader
from styx_py.io.links import TransportLimits
from styx_py.io.metrics import MetricsServer
from styx_py.io.s3 import blob_store_from
from styx_py.io.tcp import EXIT_HANDLER_FAILED, HandlerFailed, TcpTransport
from styx_py.worker.egress import KafkaSink
from styx_py.worker.ingress import KafkaIngress
from styx_py.worker.service import Worker

log = logging.getLogger("styx.worker")


async def serve_worker(
    node_id: str,
    coordinator: str,
    kafka: str,
    config: Config,
    host: str = "127.0.0.1",
    port: int = 0,
    advertise_host: str | None = None,
) -> None:
    worker: Worker | None = None

    def handle(src: str, msg: Message) -> None:
        assert worker is not None
        if isinstance(msg, ClusterView):
            for w in msg.workers:
                transport.set_address(w.node_id, w.host, w.port)
        worker.on_message(src, msg)

    require_secret(config.cluster_secret, host, f"worker {node_id}")
    transport = TcpTransport(
        node_id,
        handle,
        host,
        port,
        inbox="worker",
        secret=config.cluster_secret,
        limits=TransportLimits.from_config(config),
    )
    await transport.start()
    chost, _, cport = coordinator.rpartition(":")
    transport.set_address(COORDINATOR, chost or "127.0.0.1", int(cport))
    ingress = KafkaIngress(kafka, config)
    sink = KafkaSink(kafka, config)
    await ingress.start()
    await sink.start()
    blobs = blob_store_from(config)
    worker = Worker(
        node_id,
        config,
        transport,
        ingress,
        sink,
        sink,
        blobs=blobs,
        logs=KafkaLogReader(kafka, config),
        host=advertise_host or host,
        port=transport.port,
    )
    transport.on_disconnect = lambda peer: worker.on_coordinator_lost() if peer == COORDINATOR else None
    log.info("worker %s listening on %s:%d", node_id, host, transport.port)
    if not config.cluster_secret:
        log.warning("no cluster_secret (STYX_CLUSTER_SECRET): any local process can join (loopback only)")
    worker.metrics.registry.register(transport.collector("styx_worker"))
    metrics: MetricsServer | None = None
    if config.metrics_port:
        worker.metrics.watch_kafka(ingress, sink)
        m = worker.metrics
        metrics = MetricsServer(m.registry, m.readiness, config.metrics_host, config.metrics_port)
        await metrics.start()
        log.info("worker %s metrics on http://%s:%d/metrics", node_id, config.metrics_host, metrics.port)
    handler_failed = False
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(transport.run())  # raises HandlerFailed when a message handler raised
            tg.create_task(sink.run())
            tg.create_task(ingress.run())
            tg.create_task(worker.run())
    except* HandlerFailed:
        handler_failed = True  # logged CRITICAL with its traceback by the transport
    finally:
        if metrics is not None:
            await metrics.close()
        await ingress.stop()
        await sink.stop()
        await transport.close()
    if handler_failed:
        raise SystemExit(EXIT_HANDLER_FAILED)
