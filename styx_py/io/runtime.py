"""Process plumbing shared by the coordinator and worker entry points: event loop and logging."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Coroutine
from typing import Any


def setup_logging(name: str, level: str | None = None) -> None:
    """``level`` is the parsed ``log_level`` setting; without one (the gateway), ``STYX_LOG_LEVEL``."""
    level = (level or os.environ.get("STYX_LOG_LEVEL") or "INFO").upper()
    logging.basicConfig(level=level, format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop when available (faster), the stock loop otherwise."""
    try:
        import uvloop

        factory: Any = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner, contextlib.suppress(KeyboardInterrupt):
        runner.run(main)
