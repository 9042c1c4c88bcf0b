"""The lock-based fallback of an epoch: conflicting transactions re-run under deterministic locks (pure).

After the decision, each fallback transaction re-runs taking locks on the keys its optimistic run
touched, granted in tid order (:mod:`styx_worker.locks`). With call-graph caching every worker
re-invokes its cached invocations of the transaction in parallel; otherwise (or for a transaction
that touched one entity twice) the root worker re-executes the root function. A root whose call
graph changed is rescheduled into the next epoch, keeping its tid. The root worker announces each
outcome with a :class:`~styx_py.core.wire.Final`; every worker then applies that transaction's
fallback writes (if it committed) and releases its locks.

A transaction that invoked one entity twice is not in the fallback but in the serial set: its
branches could reach that entity in either order, so its optimistic run may not be reproducible. It
re-runs after the fallback, alone (serial transactions one at a time, in tid order), each call's
whole subtree before the next (Phase.SERIAL; see :mod:`styx_worker.executor`).
"""

from __future__ import annotations

import msgspec

from styx_py.core.wire import Final, Invoke, Outcome, Phase
from styx_worker.conflicts import EntityKey
from styx_worker.locks import LockTable
from styx_worker.scan import guard_of
from styx_worker.state import StateStore
from styx_worker.txn import CachedInvocation, EpochState, RootTxn, root_invoke

Start = tuple[Invoke, CachedInvocation | None]


def open_fallback(es: EpochState, fallback: list[int], serial: list[int]) -> None:
    """Take the fallback's locks (from the learned read/write sets, with the scan locks of the scanned
    partitions: :mod:`styx_worker.scan`) and forget the roots' first runs.

    Serial transactions take no locks: each runs alone, after the fallback (Phase.SERIAL)."""
    fb = es.fb
    assert es.graph is not None
    partitions = {name: op.partitions for name, op in es.graph.operators.items()}
    fb.locks = LockTable(fallback, es.opt.touched, guard_of(partitions), es.opt.writes)
    fb.pending = set(fallback) | set(serial)
    fb.serial = sorted(serial)
    for tids, phase in ((fallback, Phase.FALLBACK), (serial, Phase.SERIAL)):
        for tid in tids:
            root = es.roots.get(tid)
            if root is not None:
                root.reset(phase)


def fallback_runs(es: EpochState, fallback: list[int], caching: bool, node_id: str) -> list[Start]:
    """The invocations this worker starts for the fallback, in tid order."""
    runs: list[Start] = []
    for tid in fallback:
        if caching:
            for cinv in es.opt.cache.get(tid, ()):
                runs.append((msgspec.structs.replace(cinv.inv, phase=Phase.FALLBACK), cinv))
        else:
            root = es.roots.get(tid)
            if root is not None:
                runs.append((root_invoke(es, root, Phase.FALLBACK, node_id), None))
    return runs


def outcome_of(root: RootTxn) -> Outcome:
    if root.changed:
        return Outcome.RESCHEDULE
    return Outcome.ABORT if root.failed else Outcome.COMMIT


def apply_final(
    es: EpochState, final: Final, store: StateStore, phase: Phase = Phase.FALLBACK
) -> list[tuple[EntityKey, int]]:
    """Apply a fallback (or serial) transaction's writes (and note their digests) if it committed and
    release its locks; the keys whose lock another tid holds now (its waiting invocations may start)."""
    fb = es.fb
    writes = fb.writes.pop(final.tid, None)
    if final.outcome == Outcome.COMMIT and writes:
        store.apply(writes, es.epoch)
        es.committed.add(final.tid, writes, phase)
    fb.pending.discard(final.tid)
    return fb.locks.release(final.tid)
