"""Changing the cluster's shape while it runs: workers join, are drained, or are lost for good.

A planned change (a join, a drain, ``styx scale``) waits for a barrier: the epoch loop stops after
the epoch running when the change was asked for (E), and once every worker finished it the
membership and the placement change (:func:`~styx_coordinator.placement.rebalance`, fewest
moves). A new generation opens with a view
marked *handoff*: each old owner sends what it loses straight to the new owner (styx_worker.handoff), and
``Recover(keep=True)`` says E: a worker keeps the partitions it still owns as they are and installs
the ones it gains; nothing is read from S3 nor replayed. Every transaction is before the move (epochs
≤ E, old placement) or after it (new placement): the move is a step in the serial order. Changes
asked for while a barrier is under way are applied together at it.

A lost worker (silent beyond ``takeover_after_ms``) cannot wait for a barrier: the epochs are stalled
on it. It is removed at once and a full recovery (last complete snapshot, replay of the logged
epochs by partition, whoever logged them) puts its partitions on the survivors. Any failure during a
planned change ends the same way: a full recovery is correct for any placement.

A worker that leaves must not decide anything of the old generation after the log was read: a
drained worker is told (:class:`~styx_py.core.wire.Retire`) and answers ``Fenced``; a lost one cannot
answer, so the recovery reads the log only once its lease ran out (it fences itself off after
``failure_timeout_ms`` without a word from the coordinator, which sends it nothing once it is no
longer a member).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from styx_coordinator.cluster import Cluster
from styx_coordinator.epochs import EpochLoop
from styx_coordinator.placement import rebalance
from styx_coordinator.recovery import Recovery
from styx_coordinator.tasks import Tasks
from styx_py.core.errors import StyxError
from styx_py.core.limits import MAX_RESHAPE_EVENTS, RETIRE_LEASE_MARGIN_S
from styx_py.core.ports import Clock
from styx_py.core.wire import Retire
from styx_py.core.words import counted

__all__ = ["RETIRE_LEASE_MARGIN_S", "Reshaper"]

log = logging.getLogger("styx.coordinator")


@dataclass
class _Changes:
    """Changes asked for and not applied yet (they wait for the barrier)."""

    joins: dict[str, tuple[str, int]] = field(default_factory=dict)  # node -> (host, port)
    leaves: dict[str, str] = field(default_factory=dict)  # node -> why

    def describe(self) -> str:
        parts = [f"{n} joined" for n in sorted(self.joins)]
        parts += [f"{n}: {why}" for n, why in sorted(self.leaves.items())]
        return "; ".join(parts)


class Reshaper:
    def __init__(
        self, cluster: Cluster, recovery: Recovery, epochs: EpochLoop, tasks: Tasks, clock: Clock
    ) -> None:
        self.cluster = cluster
        self.recovery = recovery
        self.epochs = epochs
        self.tasks = tasks
        self.clock = clock
        self.desired: int | None = None  # `styx scale --workers N`: None until asked
        self.events: list[dict[str, Any]] = []  # the last shape changes, newest last
        self.pending = _Changes()
        self.waiting = False  # a barrier is under way for ``pending``

    # ---- the changes --------------------------------------------------------------------------------
    def join(self, node_id: str, host: str, port: int) -> None:
        """A worker registered with a running cluster: it gets its share of the partitions."""
        self.pending.leaves.pop(node_id, None)
        self.pending.joins[node_id] = (host, port)
        self._planned()

    def drain(self, node_ids: list[str], reason: str) -> None:
        """Move every partition off ``node_ids``; they are told to stop once the others took over."""
        c = self.cluster
        members = set(c.workers) | set(self.pending.joins)
        unknown = sorted(set(node_ids) - members)
        if unknown:
            raise StyxError(f"not workers of this cluster: {', '.join(unknown)}")
        if len(members - set(self.pending.leaves) - set(node_ids)) < 1:
            raise StyxError(f"draining {', '.join(sorted(node_ids))} would leave no worker")
        for node in node_ids:
            self.pending.joins.pop(node, None)
            self.pending.leaves[node] = reason
        self._planned()

    def scale(self, workers: int) -> dict[str, Any]:
        """Run on ``workers`` workers: drain the highest-named surplus; more need registering."""
        if workers < 1:
            raise StyxError("a cluster needs at least 1 worker")
        self.desired = workers
        staying = sorted((set(self.cluster.workers) | set(self.pending.joins)) - set(self.pending.leaves))
        surplus = staying[workers:]
        if surplus:
            self.drain(surplus, f"scaled to {workers} workers")
        return {
            "desired_workers": workers,
            "draining": surplus,
            "waiting_for": max(0, workers - len(staying)),
        }

    def check(self) -> None:
        """Called by the failure monitor: take over from workers silent beyond ``takeover_after_ms``."""
        c, r = self.cluster, self.recovery
        cfg = c.config
        if not cfg.takeover_after_ms or c.degraded or c.graph_path is None:
            return
        # Never before the lost worker's lease ran out (it fences itself off after failure_timeout_ms).
        after_s = max(cfg.takeover_after_ms, 2 * cfg.failure_timeout_ms + 1000) / 1000
        now = self.clock.now()
        if r.resuming:
            # A restarted coordinator waits for the workers the cluster had; one that stays away is
            # lost like any other (the workers that are back take its partitions).
            back = set(c.membership.workers)
            if back and now - r.resume_started > after_s and not back >= r.expected:
                lost = sorted(r.expected - back)
                r.expected = back
                self._record(f"lost {', '.join(lost)} (not back after a coordinator restart)", removed=lost)
                c.placement = rebalance(c.placement, sorted(back), c.load.rates(len(c.placement)))
                r.rejoined()
            return
        lost = [w for w in c.workers if c.membership.silent_for(w, now) > after_s]
        if lost and len(lost) < len(c.workers):
            for w in lost:
                log.error("worker %s silent for %.1f s: lost; the others take its partitions", w, after_s)
                self.pending.joins.pop(w, None)
                self.pending.leaves[w] = "lost (no heartbeat for takeover_after_ms)"
            self._apply(keep=False)  # no barrier: the epochs wait for the lost worker

    # ---- mechanics ----------------------------------------------------------------------------------
    def _planned(self) -> None:
        if not self.waiting:
            self.waiting = True
            self.tasks.spawn(self._at_barrier())

    async def _at_barrier(self) -> None:
        try:
            # A recovery under way ends first: applied now, the change would cancel it and recover in
            # full once more (two workers started together register a few ms apart).
            while (task := self.recovery.task) is not None and not task.done():
                await asyncio.wait([task])
            epoch = await self.epochs.request_barrier()
        finally:
            self.waiting = False
        self._apply(keep=epoch >= 0)

    def _apply(self, *, keep: bool) -> None:
        """Apply the pending changes and open the generation that runs on the new shape (``keep``: the
        epoch loop stopped at a barrier for them, and the partitions move by handoff)."""
        c, now = self.cluster, self.clock.now()
        changes, self.pending = self.pending, _Changes()
        joins = {n: a for n, a in changes.joins.items() if n not in c.membership.workers}
        leaves = {n: why for n, why in changes.leaves.items() if n in c.membership.workers}
        if not joins and not leaves:
            if keep and c.state == "running":  # nothing left to change: the epochs go on
                self.epochs.stop()
                self.epochs.start()
            return
        for node, (host, port) in joins.items():
            c.membership.register(node, host, port, now)
        lease_s = c.config.failure_timeout_ms / 1000 + RETIRE_LEASE_MARGIN_S
        for node in leaves:
            c.membership.remove(node)
            c.load.forget(node)
            # Until its lease ran out, unless it answers Retire with Fenced first (a drained one does).
            self.recovery.retiring[node] = now + lease_s
        before = list(c.placement)
        c.placement = rebalance(before, c.workers, c.load.rates(len(before)))
        c.n_seq = max(c.n_seq, len(c.workers))
        moved = sum(1 for a, b in zip(before, c.placement, strict=True) if a != b)
        change = changes.describe()
        self._record(change, added=sorted(joins), removed=sorted(leaves), moved=moved, barrier=keep)
        workers = counted(len(c.workers), "worker")
        log.warning("reshaping: %s; %s move; %s", change, counted(moved, "partition"), workers)
        self.recovery.start(keep=keep)
        view = c.view(handoff=True) if keep else None  # a drained worker hands off what it owned
        for node, why in leaves.items():
            c.transport.send(node, Retire(why, c.gen, view))

    def _record(self, change: str, **fields: Any) -> None:
        event = {"change": change, "at_s": round(self.clock.now(), 3), "workers": self.cluster.workers}
        self.events = [*self.events, {**event, **fields}][-MAX_RESHAPE_EVENTS:]
