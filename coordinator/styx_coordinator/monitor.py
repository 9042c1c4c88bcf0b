"""Failure detection: a worker that sent no heartbeat for ``failure_timeout_ms`` is reported failed.

Heartbeats are sent from the worker's event loop, so a hung loop is detected too. The verdict is
reported by ``styx status`` (``failed_workers``) and the metrics; one silent beyond
``takeover_after_ms`` is lost for good (:mod:`~styx_coordinator.reshape`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from styx_coordinator.membership import Membership
from styx_py.core.config import Config
from styx_py.core.ports import Clock

__all__ = ["FailureMonitor"]

log = logging.getLogger("styx.coordinator")


class FailureMonitor:
    def __init__(
        self,
        membership: Membership,
        config: Config,
        clock: Clock,
        on_checked: Callable[[], None] = lambda: None,
    ) -> None:
        self.membership = membership
        self.config = config
        self.clock = clock
        self.on_checked = on_checked  # after every check (the takeover of workers lost for good)
        self.failed: list[str] = []  # sorted node ids

    async def run(self) -> None:
        interval_s = self.config.heartbeat_interval_ms / 1000 / 2
        while True:
            await self.clock.sleep(interval_s)
            self.check()
            self.on_checked()

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
