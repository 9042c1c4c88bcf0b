"""Process plumbing shared by the coordinator and worker entry points: event loop and logging."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
from collections.abc import Coroutine, Iterator
from typing import Any

from styx_py.core.limits import SERVER_GC_GEN0


def setup_logging(name: str, level: str | None = None) -> None:
    """``level`` is the parsed ``log_level`` setting; without one (the gateway), ``STYX_LOG_LEVEL``."""
    level = (level or os.environ.get("STYX_LOG_LEVEL") or "INFO").upper()
    logging.basicConfig(level=level, format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)


@contextlib.contextmanager
def steady_gc(gen0: int = SERVER_GC_GEN0) -> Iterator[None]:
    """Freeze what exists now (start-up: modules, configuration; never scanned again) and collect the
    young generation every ``gen0`` allocations; restored on exit."""
    gc.collect()
    gc.freeze()
    threshold = gc.get_threshold()
    gc.set_threshold(gen0, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def run(main: Coroutine[Any, Any, None], server_gc: bool = False) -> None:
    """Run ``main`` on uvloop when available (faster), the stock loop otherwise; ``server_gc``: under
    :func:`steady_gc` (the coordinator and the workers)."""
    try:
        import uvloop

        factory: Any = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        factory = None
    with (
        asyncio.Runner(loop_factory=factory) as runner,
        steady_gc() if server_gc else contextlib.nullcontext(),
        contextlib.suppress(KeyboardInterrupt),
    ):
        runner.run(main)
