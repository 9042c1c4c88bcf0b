"""The coordinator's task group: every background task (epoch loop, recovery, snapshot completion, a
deploy request) is a child of the group :meth:`styx_coordinator.server.Coordinator.run` opens, so
stopping the coordinator cancels them all and a failing one ends the coordinator."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

__all__ = ["Tasks"]


class Tasks:
    def __init__(self) -> None:
        self.group: asyncio.TaskGroup | None = None  # set while the coordinator runs

    def start(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        assert self.group is not None, "the coordinator is not running"
        return self.group.create_task(coro)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Like :meth:`start`, but dropped when the coordinator is stopping (a message can still
        arrive while its task group shuts down)."""
        try:
            self.start(coro)
        except RuntimeError:  # "TaskGroup ... is shutting down"
            coro.close()
