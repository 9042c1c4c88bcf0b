"""What a worker's metrics and ``/readyz`` read of it, at scrape time."""

from __future__ import annotations

from styx_worker.admission import AdmissionGate
from styx_worker.core import WorkerCore
from styx_worker.feed import ReplyFeed
from styx_worker.metrics import WorkerGauges
from styx_worker.outbox import EffectRunner

__all__ = ["gauges", "readiness"]


def gauges(
    core: WorkerCore,
    ingress_pending: int,
    inflight: int,
    feed: ReplyFeed,
    effects: EffectRunner | None,
    admission: AdmissionGate,
) -> WorkerGauges:
    calls, timers = effects.pending() if effects is not None else (0, 0)
    return WorkerGauges(
        rescheduled_waiting=len(core.batch.rescheduled),
        ingress_buffered=ingress_pending,
        inflight_tasks=inflight,
        open_epochs=len(core.epochs.epochs),
        waiting_resends=sum(len(v) for v in core.replies.waiting.values()),
        partitions=len(core.table.owned()),
        generation=core.gen,
        completed_epoch=core.epochs.completed_epoch,
        push_clients=len(feed.clients),
        replies_pushed=feed.pushed,
        changelog_skipped=core.epochs.changelog.skipped,
        external_calls_pending=calls,
        external_calls_running=len(effects.calls) if effects is not None else 0,
        timers_pending=timers,
        admission_size=admission.policy.size,
    )


def readiness(core: WorkerCore, recovering: bool) -> tuple[bool, str]:
    """``/readyz``: part of a deployed cluster, not recovering, not degraded."""
    if core.halted:
        return False, f"degraded: {core.halted}"
    if core.view is None:
        return False, "not part of a deployed cluster yet"
    if recovering:
        return False, f"recovering (generation {core.gen})"
    return True, f"generation {core.gen}, partitions {core.table.owned()}"
