"""Failure detection: a worker that sent no heartbeat for ``failure_timeout_ms`` is reported failed.

Heartbeats are sent from the worker's event loop, so a hung loop is detected too. The verdict is
reported by ``styx status`` (``failed_workers``) and the metrics.
"""

from __future__ import annotations

import logging

from styx_py.coordinator.membership import Membership
from styx_py.core.config import Config
from styx_py.core.ports import Clock

__all__ = ["FailureMonitor"]

log = logging.getLogger("styx.coordinator")


class FailureMonitor:
    def __init__(self, membership: Membership, config: Config, clock: Clock) -> None:
        self.membership = membership
        self.config = config
        self.clock = clock
        self.failed: list[str] = []  # sorted node ids

    async def run(self) -> None:
        interval_s = self.config.heartbeat_interval_ms / 1000 / 2
        while True:
            await self.clock.sleep(interval_s)
            self.check()

    def check(self) -> None:
        failed = self.membership.failed(self.clock.now())
        for node_id in failed:
            if node_id not in self.failed:
                log.error(
                    "worker %s missed heartbeats for %d ms: failed",
                    node_id,
                    self.config.failure_timeout_ms,
                )
        self.failed = failed
