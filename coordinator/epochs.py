"""The epoch loop: drive every epoch through the three barrier stages.

Per epoch the coordinator broadcasts ``EpochStart``, waits for every worker's ``ExecDone`` (and
broadcasts the union of logic aborts), every ``Vote`` (and broadcasts one ``Decision``: the fallback
set, and whether the epoch snapshots), then every ``EpochDone``. It never touches transaction data.
Epochs run back to back while any worker has pending work, spaced by at least ``epoch_interval_ms``;
an idle cluster waits for a ``WorkAvailable`` instead of spinning. A stage that does not complete
within ``epoch_timeout_ms`` (a lost message, a wedged worker) is a stall: a recovery takes over.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from styx_py.coordinator.barrier import Stage, combine_exec, combine_revotes, combine_votes
from styx_py.coordinator.cluster import Cluster
from styx_py.coordinator.metrics import CoordinatorMetrics
from styx_py.coordinator.snapshotter import Snapshotter
from styx_py.coordinator.status import Throughput
from styx_py.coordinator.tasks import Tasks
from styx_py.core.ports import Clock
from styx_py.core.wire import AllExecDone, Decision, EpochDone, EpochStart, ExecDone, Recheck, Revote, Vote

__all__ = ["EpochLoop"]

log = logging.getLogger("styx.coordinator")


class EpochLoop:
    def __init__(
        self,
        cluster: Cluster,
        clock: Clock,
        tasks: Tasks,
        snapshots: Snapshotter,
        metrics: CoordinatorMetrics,
        on_stall: Callable[[], None],
    ) -> None:
        self.cluster = cluster
        self.clock = clock
        self.tasks = tasks
        self.snapshots = snapshots
        self.metrics = metrics
        self.on_stall = on_stall  # starts a recovery, which stops this loop
        self.epoch = 0  # the next epoch to run
        self.lc = 0  # the sequencer counter after the last epoch
        self.last_decided = -1  # the last epoch whose Decision went out (a recovery replays up to it)
        self.stalls = 0
        self.pipelined = 0  # epochs started together with the previous epoch's Decision
        # Open stages with the event set once each is complete: at most two (an epoch's EpochDone and
        # the next epoch's ExecDone, when that one was started early).
        self.stages: dict[Stage[Any], asyncio.Event] = {}
        self.work = asyncio.Event()  # a worker has work (WorkAvailable)
        self.idle = asyncio.Event()  # set while no epoch runs and no worker has work
        self.throughput = Throughput()
        self.task: asyncio.Task[None] | None = None

    def start(self, replay_until: int = -1, on_replayed: Callable[[], None] | None = None) -> None:
        self.task = self.tasks.start(self._run(replay_until, on_replayed))

    def stop(self) -> None:
        """Synchronously, before a new generation opens: no stage of the old one completes."""
        if self.task is not None:
            self.task.cancel()
        self.stages = {}

    def on_report(self, msg: ExecDone | Vote | Revote | EpochDone) -> None:
        if msg.gen != self.cluster.gen:
            return  # from a generation a recovery ended
        for stage, done in self.stages.items():
            if stage.add(msg):
                done.set()

    async def _run(self, replay_until: int, on_replayed: Callable[[], None] | None) -> None:
        """Run epochs back to back; epochs up to ``replay_until`` re-run their logged composition.

        An epoch with work waiting starts together with the previous epoch's Decision (workers hold
        it until they finished the previous one): the EpochDone → EpochStart round trip leaves the
        path of every epoch under load.
        """
        await self.cluster.deployed.wait()
        interval_s = self.cluster.config.epoch_interval_ms / 1000
        last_start = -math.inf
        gen = self.cluster.gen
        started: Stage[ExecDone] | None = None  # the next epoch, if it was started early
        while True:
            if gen != self.cluster.gen:
                return  # a recovery began: this loop belongs to a generation that is over
            e = self.epoch
            replay = e <= replay_until
            self.idle.clear()
            if started is None:
                self.work.clear()
                if interval_s > 0 and not replay:
                    wait = last_start + interval_s - self.clock.now()
                    if wait > 0:
                        await self.clock.sleep(wait)
                    if gen != self.cluster.gen:
                        return
                last_start = self.clock.now()
                started = self._open(e, ExecDone)
                self.cluster.broadcast(EpochStart(e, self.lc, replay, gen))

            def early(executed: list[ExecDone], e: int = e) -> bool:
                """Start the next epoch with this one's Decision: work waits and no replay or pacing
                stands in the way."""
                nonlocal last_start
                if e + 1 <= replay_until or self.clock.now() < last_start + interval_s:
                    return False
                if not self.work.is_set() and sum(x.pending for x in executed) == 0:
                    return False
                last_start = self.clock.now()
                self.work.clear()
                return True

            done, started = await self._epoch(e, replay, started, early)
            self.epoch = e + 1
            if e == replay_until and on_replayed is not None:
                on_replayed()
            waiting = sum(d.pending for d in done) > 0 or self.work.is_set()
            if started is None and e + 1 > replay_until and not waiting:
                self.idle.set()
                await self.work.wait()

    async def _epoch(
        self,
        e: int,
        replay: bool,
        executing: Stage[ExecDone],
        early: Callable[[list[ExecDone]], bool],
    ) -> tuple[list[EpochDone], Stage[ExecDone] | None]:
        """One epoch through the barrier, from its started ExecDone stage: every worker's
        ``EpochDone``, and the next epoch's ExecDone stage if it was started with the Decision."""
        gen = self.cluster.gen
        t_start = time.perf_counter()
        executed: list[ExecDone] = await self._gather(executing)
        aborted, self.lc = combine_exec(executed)
        t_executed = time.perf_counter()
        stage = self._open(e, Vote)
        self.cluster.broadcast(AllExecDone(e, aborted, gen))
        fallback, serial = combine_votes(await self._gather(stage))
        if serial:
            # Their optimistic writes may depend on the order their branches arrived in: decide
            # everyone else's conflicts without them (an extra round, only in such epochs).
            stage = self._open(e, Revote)
            self.cluster.broadcast(Recheck(e, serial, gen))
            fallback = combine_revotes(await self._gather(stage), serial)
        t_voted = time.perf_counter()
        finishing = self._open(e, EpochDone)
        snapshot = not replay and self.snapshots.begin(e, self.lc)
        self.cluster.broadcast(Decision(e, fallback, serial, snapshot, gen))
        self.last_decided = e
        following: Stage[ExecDone] | None = None
        if early(executed):
            following = self._open(e + 1, ExecDone)
            self.cluster.broadcast(EpochStart(e + 1, self.lc, False, gen))
            self.pipelined += 1
        done: list[EpochDone] = await self._gather(finishing)
        self.metrics.epoch(t_start, t_executed, t_voted, time.perf_counter(), done)
        self.throughput.record(self.clock.now(), done, len(fallback) + len(serial))
        return done, following

    def _open(self, epoch: int, kind: type[Any]) -> Stage[Any]:
        stage: Stage[Any] = Stage(epoch, self.cluster.workers, kind)
        self.stages[stage] = asyncio.Event()
        return stage

    async def _gather(self, stage: Stage[Any]) -> list[Any]:
        """Every worker's message for this stage; a stage that times out starts a recovery."""
        gen = self.cluster.gen
        done = self.stages.get(stage)
        if done is not None and not stage.complete:
            try:
                async with self.clock.timeout(self.cluster.config.epoch_timeout_ms / 1000):
                    await done.wait()
            except TimeoutError:
                missing = sorted(stage.expected - set(stage.got))
                log.error("epoch %d stalled waiting for %s: recovering", stage.epoch, missing)
                self.stalls += 1
                self.on_stall()  # cancels this loop
                raise asyncio.CancelledError from None
        if gen != self.cluster.gen or done is None:
            # A recovery began while we waited; never act for a generation that is over (a
            # cancellation can race with the wake-up, so this does not rely on it).
            raise asyncio.CancelledError
        del self.stages[stage]
        return stage.messages()
