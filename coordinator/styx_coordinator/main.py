"""Coordinator process: ``styx coordinator --port P --kafka BOOTSTRAP --workers N``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
from collections.abc import Coroutine
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from styx_coordinator.server import Coordinator
from styx_coordinator.snapshots import merge_chain
from styx_py.core.config import Config
from styx_py.core.errors import ConfigError
from styx_py.core.segments import MIN_PERIOD_S
from styx_py.core.wire import COORDINATOR, Message
from styx_py.io import lifeline
from styx_py.io.kafka_admin import TopicAdmin
from styx_py.io.kafka_logs import KafkaLogReader
from styx_py.io.logguard import KafkaLogGuard
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
    # The changelog is compacted, never deleted by time or size: read from its start it is the state.
    compacted = {config.changelog_topic: {"cleanup.policy": "compact"}} if config.changelog_topic else {}
    admin = TopicAdmin(
        kafka,
        replication_factor=config.kafka_replication_factor,
        security=config.kafka_security(),
        configs=compacted,
    )
    blobs = blob_store_from(config)
    # Compaction merges a partition's snapshot chain with its reply table: a second or more of CPU at a
    # few thousand transactions per second, which on the event loop stalled every epoch meanwhile.
    # It runs in one child process, started on first use and kept (replaced if it dies).
    pool: ProcessPoolExecutor | None = None  # created on the first compaction

    async def merge(chain: list[bytes], keep_replies: int) -> tuple[int, bytes]:
        nonlocal pool
        if pool is None:
            pool = _merge_pool()
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, merge_chain, chain, keep_replies)
        except BrokenProcessPool as exc:
            pool = None  # this compaction fails (logged); the next one gets a new child
            raise ChildProcessError(f"the compaction process died: {exc}") from exc

    async def stop_merges() -> None:
        nonlocal pool
        if pool is not None:
            # Waited for (a merge in progress is dropped), so the pool's queues are cleaned up.
            stop = asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)
            pool = None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop, 5)

    coordinator = Coordinator(
        config,
        transport,
        min_workers=min_workers,
        kafka_bootstrap=kafka,
        create_topics=admin.create,
        blobs=blobs,
        logs=KafkaLogReader(kafka, config),
        merge=merge,
        guard=KafkaLogGuard(kafka, config.seqlog_topic, config.kafka_security()),
    )
    resumed = await coordinator.resume()
    await transport.start()
    log.info("coordinator listening on %s:%d", host, transport.port)
    coordinator.metrics.registry.register(transport.collector("styx_coordinator"))
    m = coordinator.metrics
    metrics = await start_metrics(m.registry, m.readiness, config, "coordinator")
    tasks: list[Coroutine[Any, Any, object]] = [coordinator.run(), *([metrics.run()] if metrics else [])]
    if deploy is not None and not resumed:
        tasks.append(coordinator.deploy(deploy))
    await run_until_failure(
        transport, tasks, [admin.close, stop_merges, *([metrics.close] if metrics else [])]
    )


def _merge_pool() -> ProcessPoolExecutor:
    # At a lower CPU priority: compaction can wait (the next snapshot waits for it), the epochs that
    # share the cores with it cannot. The child dies with this process (styx_py.io.lifeline), and with
    # it multiprocessing's resource tracker, which ends when no process is left to hold its pipe.
    return ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_merge_child,
        initargs=(os.getpid(), 10),
    )


def _start_merge_child(parent_pid: int, niceness: int) -> None:
    lifeline.arm(parent_pid)
    os.nice(niceness)
