"""Worker process: ``styx worker --id w1 --coordinator HOST:PORT --kafka BOOTSTRAP``.

The worker listens on ``host:port`` and tells the coordinator (and so its peers) to reach it at
``advertise_host:port``: behind a wildcard bind (``0.0.0.0`` in a container) that is the worker's
stable DNS name, e.g. ``$(POD_NAME).styx-worker`` in a StatefulSet.
"""

from __future__ import annotations

import logging

from styx_py.core.addresses import host_port
from styx_py.core.config import Config
from styx_py.core.wire import COORDINATOR, ClusterView, Message, Retire
from styx_py.io.kafka_logs import KafkaLogReader
from styx_py.io.s3 import blob_store_from
from styx_py.io.serving import cluster_transport, run_until_failure, start_metrics
from styx_worker.egress import KafkaSink
from styx_worker.ingress import KafkaIngress
from styx_worker.ports import WorkerPorts
from styx_worker.shell import Worker

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
        view = msg.view if isinstance(msg, Retire) else msg
        if isinstance(view, ClusterView):  # a retiring worker hands its partitions to the new owners
            for w in view.workers:
                transport.set_address(w.node_id, w.host, w.port)
        worker.on_message(src, msg)

    transport = cluster_transport(
        node_id, handle, config, host, port, inbox="worker", who=f"worker {node_id}"
    )
    await transport.start()
    transport.set_address(COORDINATOR, *host_port(coordinator, "--coordinator"))
    ingress = KafkaIngress(kafka, config)
    sink = KafkaSink(kafka, config)
    await ingress.start()
    await sink.start()
    blobs = blob_store_from(config)
    ports = WorkerPorts(transport, ingress, sink, sink, blobs, KafkaLogReader(kafka, config), requests=sink)
    worker = Worker(node_id, config, ports, host=advertise_host or host, port=transport.port)
    transport.on_disconnect = worker.on_disconnect
    sink.on_request_stored = lambda pushed: worker.on_message(node_id, pushed)  # see KafkaSink.submit
    for watch in (ingress.watch, sink.reply_watch, sink.log_watch, sink.change_watch):
        watch.on_lost = worker.log_lost
    log.info("worker %s listening on %s:%d", node_id, host, transport.port)
    worker.metrics.registry.register(transport.collector("styx_worker"))
    if config.metrics_port:
        worker.metrics.watch_kafka(ingress, sink)
    m = worker.metrics
    metrics = await start_metrics(m.registry, m.readiness, config, f"worker {node_id}")
    closing = [metrics.close] if metrics else []
    tasks = [sink.run(), ingress.run(), worker.run(), *([metrics.run()] if metrics else [])]
    await run_until_failure(transport, tasks, [*closing, ingress.stop, sink.stop])
