"""Worker process: ``styx worker --id w1 --coordinator HOST:PORT --kafka BOOTSTRAP``."""

from __future__ import annotations

import asyncio
import logging

from styx_py.blobs import blob_store_from
from styx_py.config import Config
from styx_py.transport import TcpTransport
from styx_py.wire import ClusterView, Message
from worker.egress import KafkaSink
from worker.epoch import COORDINATOR, Worker
from worker.ingress import KafkaIngress
from worker.logreader import KafkaLogReader

log = logging.getLogger("styx.worker")


async def serve_worker(
    node_id: str, coordinator: str, kafka: str, config: Config, host: str = "127.0.0.1", port: int = 0
) -> None:
    worker: Worker | None = None

    def handle(src: str, msg: Message) -> None:
        assert worker is not None
        if isinstance(msg, ClusterView):
            for w in msg.workers:
                transport.set_address(w.node_id, w.host, w.port)
        worker.on_message(src, msg)

    transport = TcpTransport(node_id, handle, host, port)
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
        host=host,
        port=transport.port,
    )
    transport.on_disconnect = lambda peer: worker.on_coordinator_lost() if peer == COORDINATOR else None
    log.info("worker %s listening on %s:%d", node_id, host, transport.port)
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(sink.run())
            tg.create_task(ingress.run())
            tg.create_task(worker.run())
    finally:
        await ingress.stop()
        await sink.stop()
        await transport.close()
