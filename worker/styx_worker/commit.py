"""The lock-free commit of an epoch (Aria) and the replies it sends right away.

Which transactions commit follows from the union of every worker's conflicts, which each worker combines
itself from the same reports (:mod:`styx_py.core.barrier`); here a worker applies the committed
transactions' buffered writes in tid order (and their digests: :mod:`styx_worker.digests`) and
turns every finished root into its reply (the early commit reply). A transaction's blind adds
(``Context.add``) are added again to the state the lower tids left, as adds of one key commute.
"""

from __future__ import annotations

from styx_py.core.context import Number
from styx_py.core.wire import NIL, Phase, Reply, ReplyStatus, Status
from styx_worker.conflicts import EntityKey
from styx_worker.state import StateStore, Writes
from styx_worker.txn import EpochState, RootTxn, added_raw

_ERROR_TYPES = {Status.ABORT: "Abort", Status.BAD: "BadRequest"}


def commit_lock_free(
    es: EpochState, fallback: frozenset[int], store: StateStore
) -> list[tuple[RootTxn, Reply]]:
    """Apply the writes of every transaction that neither conflicted nor aborted, in tid order (their
    digests go to ``es.committed``), and return the replies of this worker's roots outside
    ``fallback`` (as ``(root, reply)``), in tid order. The epoch's tally counts them."""
    aborted = es.reports.aborted
    writes = es.opt.writes
    adds = es.opt.adds
    committed = es.committed
    for tid in sorted(writes):
        if tid not in fallback and tid not in aborted:
            w = writes[tid]
            if w:  # every invocation opens its transaction's buffer, a read-only one too
                if tid in adds:
                    _add_to_committed(w, adds[tid], store)
                store.apply(w, es.epoch)
                committed.add(tid, w)
    replies: list[tuple[RootTxn, Reply]] = []
    for tid in sorted(es.roots):
        if tid in fallback:
            continue
        root = es.roots[tid]
        replies.append((root, reply_for(root, es.epoch, Phase.OPTIMISTIC)))
        es.tally.finished(root)
    return replies


def _add_to_committed(
    writes: Writes, adds: dict[EntityKey, list[tuple[Number, str | None]]], store: StateStore
) -> None:
    """A transaction's blind adds, applied again to the state the lower tids' commits of the epoch left
    (its run saw the state before them): adds of lower tids to the same key are in it, and nothing
    else of a lower tid wrote it, or this one would have conflicted; so the value's type is the one
    its run checked, and the add cannot fail here."""
    for key, ops in adds.items():
        writes[key] = added_raw(store.data.get(key), ops)


def reply_for(root: RootTxn, epoch: int, phase: Phase) -> Reply:
    req = root.request
    if not root.failed:
        result = NIL if root.result is None else root.result
        return Reply(
            req.request_id, root.tid, epoch, phase, ReplyStatus.COMMITTED, result, None, None, req.ts_ms
        )
    status = ReplyStatus.ABORTED if root.error_status == Status.ABORT else ReplyStatus.FAILED
    error_type = _ERROR_TYPES.get(root.error_status, "UserError")
    return Reply(req.request_id, root.tid, epoch, phase, status, NIL, root.error, error_type, req.ts_ms)
