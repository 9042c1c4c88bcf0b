"""The bank app, with a bug planted in one worker's recovery (tests/test_restarts.py).

Every worker process imports it (its graph). When ``STYX_TEST_PLANTED_BUG`` names a file that exists
and this process is worker ``w1``, its next restore raises an ``AssertionError``, as a bug in the
recovery code would; the file is removed first, so the worker's next process recovers.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from styx_benchmarks.bank import app

__all__ = ["app"]


def _plant() -> None:
    marker = os.environ.get("STYX_TEST_PLANTED_BUG")
    if not marker or "--id" not in sys.argv or sys.argv[sys.argv.index("--id") + 1] != "w1":
        return
    from styx_worker import recovery

    real = recovery.restore

    def fire() -> bool:
        try:
            os.remove(marker)
        except FileNotFoundError:
            return False
        return True

    async def restore(*args: Any, **kw: Any) -> Any:
        if fire():  # a local file, removed once: the planted bug fires in one process only
            raise AssertionError("a planted bug in the restore")
        return await real(*args, **kw)

    recovery.restore = restore


_plant()
