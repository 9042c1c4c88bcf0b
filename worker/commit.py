"""Turning a finished transaction into its reply (the early commit reply).

Applying committed writes is ``StateStore.apply``; which transactions commit is decided by the
coordinator from the union of every worker's conflicts (``coordinator.barrier``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from styx_py.core.wire import NIL, ST_ABORT, ST_BAD, Reply

if TYPE_CHECKING:
    from styx_py.worker.epoch import RootTxn

_ERROR_TYPES = {ST_ABORT: "Abort", ST_BAD: "BadRequest"}


def reply_for(root: RootTxn, epoch: int, phase: int) -> Reply:
    req = root.request
    if not root.failed:
        result = NIL if root.result is None else root.result
        return Reply(req.request_id, root.tid, epoch, phase, "committed", result, None, None, req.ts_ms)
    status = "aborted" if root.error_status == ST_ABORT else "failed"
    error_type = _ERROR_TYPES.get(root.error_status, "UserError")
    return Reply(req.request_id, root.tid, epoch, phase, status, NIL, root.error, error_type, req.ts_ms)
