"""The epoch loop: start every epoch and follow it through the barrier stages.

Per epoch the coordinator broadcasts ``EpochStart`` (with whether the epoch snapshots), then collects
every worker's ``Vote`` [``Revote``] and ``EpochDone``. It does not announce decisions: workers send
their reports to each other and each decides from the same set (:mod:`styx_py.core.barrier`), so
replies leave one hop after the last vote. The workers' ``ExecDone`` goes to their peers only: the
``Vote`` carries what the coordinator needs of it (the sequencer counter, the work waiting), one
message fewer to it per worker and epoch. The coordinator counts an
epoch decided once it holds every vote itself (recovery replays up to there, and up to the last epoch
every worker logged, which covers an epoch some worker decided before the coordinator heard all votes).
Epochs run back to back while any worker has pending work, spaced by at least ``epoch_interval_ms``;
under load the next epoch starts as soon as this one is decided (workers hold it until they finished
this one); an idle cluster waits for a ``WorkAvailable`` instead of spinning. A stage that does not
complete within ``epoch_timeout_ms`` (a lost message, a wedged worker) is a stall: a recovery takes over.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from styx_coordinator.barrier import Stage
from styx_coordinator.cluster import Cluster
from styx_coordinator.metrics import CoordinatorMetrics
from styx_coordinator.snapshotter import Snapshotter
from styx_coordinator.status import Throughput
from styx_coordinator.tasks import Tasks
from styx_py.core.barrier import combine_votes, highest_lc
from styx_py.core.ports import Clock
from styx_py.core.wire import EpochDone, EpochStart, Revote, Vote

__all__ = ["EpochLoop"]

log = logging.getLogger("styx.coordinator")


@dataclass
class EpochRun:
    """The stages of one started epoch, all open from its start (workers report to each other and
    to the coordinator as soon as they can, in any order)."""

    epoch: int
    replay: bool
    voted: Stage[Vote]
    revoted: Stage[Revote]
    done: Stage[EpochDone]
    started_at: float


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
        self.last_decided = -1  # the last epoch whose every vote reached the coordinator
        self.stalls = 0
        self.pipelined = 0  # epochs started as soon as the previous one was decided
        # Open stages with the event set once each is complete: an epoch's EpochDone and the next
        # epoch's stages, when that one was started early.
        self.stages: dict[Stage[Any], asyncio.Event] = {}
        self.replay_until = -1  # the last epoch the running loop replays
        self.work = asyncio.Event()  # a worker has work (WorkAvailable)
        self.idle = asyncio.Event()  # set while no epoch runs and no worker has work
        self.throughput = Throughput()
        self.task: asyncio.Task[None] | None = None
        # A barrier asked for (a planned shape change): no epoch starts after the one running (or the
        # last one, when idle), and this is resolved with it once every worker finished it (-1: a
        # recovery came first).
        self.barrier: asyncio.Future[int] | None = None
        # A code update waiting for its barrier: called with the next epoch to start, once every
        # earlier epoch is over and before that one starts (no epoch is started early meanwhile).
        self.before_start: Callable[[int], Awaitable[None]] | None = None
        self.barrier_at = 0.0  # when the last barrier was asked for
        self.parked_at = 0.0  # when its epoch ended (no epoch runs until a recovery restarts the loop)
        self.on_finished: Callable[[int], None] | None = None  # called with each epoch every worker finished

    def request_barrier(self) -> asyncio.Future[int]:
        """Stop once the epoch running is over (see ``barrier``); resolved with its number."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if self.task is None or self.task.done() or self.cluster.state != "running":
            fut.set_result(-1)  # no epoch loop runs (a recovery does): nothing to stop at
            return fut
        if self.barrier is not None and not self.barrier.done():
            return self.barrier
        self.barrier = fut
        self.barrier_at = self.clock.now()
        self.work.set()  # an idle loop runs the barrier epoch now
        return fut

    def start(self, replay_until: int = -1, on_replayed: Callable[[], None] | None = None) -> None:
        self.idle.clear()  # not idle until the new loop says so (it may have epochs to replay)
        self.replay_until = replay_until
        self.task = self.tasks.start(self._run(replay_until, on_replayed))

    def stop(self) -> None:
        """Synchronously, before a new generation opens: no stage of the old one completes."""
        self.idle.clear()
        if self.task is not None:
            self.task.cancel()
        self.stages = {}
        self._resolve_barrier(-1)

    def _resolve_barrier(self, epoch: int) -> None:
        barrier, self.barrier = self.barrier, None
        if barrier is not None and not barrier.done():
            barrier.set_result(epoch)

    def on_report(self, msg: Vote | Revote | EpochDone) -> None:
        if msg.gen != self.cluster.gen:
            return  # from a generation a recovery ended
        for stage, done in self.stages.items():
            if stage.add(msg) and not done.is_set():
                done.set()
                if isinstance(msg, Vote):
                    # Synchronously: before any part of the epoch's snapshot can arrive (a worker
                    # sends its part after its Vote, on the same connection).
                    self.snapshots.voted(stage.epoch, highest_lc(stage.messages()))

    async def _run(self, replay_until: int, on_replayed: Callable[[], None] | None) -> None:
        """Run epochs back to back; epochs up to ``replay_until`` re-run their logged composition."""
        await self.cluster.deployed.wait()
        interval_s = self.cluster.config.epoch_interval_ms / 1000
        last_start = -math.inf
        gen = self.cluster.gen
        started: EpochRun | None = None  # the next epoch, if it was started early
        finished = -1  # the last epoch this loop saw every worker finish
        while True:
            if gen != self.cluster.gen:
                return  # a recovery began: this loop belongs to a generation that is over
            e = self.epoch
            if self.barrier is not None and started is None and replay_until < finished == e - 1:
                # A barrier: no epoch runs (none started early once it was asked for), every worker
                # finished the last one. Stopped here: the shape change's recovery ends this loop.
                self.parked_at = self.clock.now()
                self._resolve_barrier(finished)
                await asyncio.Future()
            self.idle.clear()
            if started is None:
                self.work.clear()
                if interval_s > 0 and e > replay_until:
                    wait = last_start + interval_s - self.clock.now()
                    if wait > 0:
                        await self.clock.sleep(wait)
                    if gen != self.cluster.gen:
                        return
                if self.before_start is not None and e > replay_until:
                    barrier, self.before_start = self.before_start, None
                    await barrier(e)
                    if gen != self.cluster.gen:
                        return
                last_start = self.clock.now()
                started = self._start(e, e <= replay_until)

            def early(voted: list[Vote], e: int = e) -> EpochRun | None:
                """Start the next epoch now that this one is decided, if work waits and no replay or
                pacing stands in the way."""
                nonlocal last_start
                if e + 1 <= replay_until or self.clock.now() < last_start + interval_s:
                    return None
                if self.barrier is not None or self.before_start is not None:
                    return None  # a shape change or a code update takes its barrier first
                if not self.work.is_set() and sum(v.pending for v in voted) == 0:
                    return None
                last_start = self.clock.now()
                self.work.clear()
                self.pipelined += 1
                return self._start(e + 1, False)

            done, started = await self._epoch(started, early)
            self.epoch = e + 1
            finished = e
            if self.on_finished is not None:
                self.on_finished(e)
            if e == replay_until and on_replayed is not None:
                on_replayed()
            # A barrier asked for during a replay (whose epochs cleared ``work``) still waits for an epoch.
            waiting = sum(d.pending for d in done) > 0 or self.work.is_set()
            waiting = waiting or self.barrier is not None or self.before_start is not None
            if started is None and e + 1 > replay_until and not waiting:
                self.idle.set()
                await self.work.wait()

    def _start(self, e: int, replay: bool) -> EpochRun:
        """Open every stage of epoch ``e``, then broadcast its start."""
        snapshot = not replay and self.snapshots.begin(e)
        run = EpochRun(
            e,
            replay,
            self._open(e, Vote),
            self._open(e, Revote),
            self._open(e, EpochDone),
            time.perf_counter(),
        )
        c = self.cluster
        c.broadcast(EpochStart(e, self.lc, replay, snapshot, c.gen, c.version_of(e), c.segment))
        return run

    async def _epoch(
        self, run: EpochRun, early: Callable[[list[Vote]], EpochRun | None]
    ) -> tuple[list[EpochDone], EpochRun | None]:
        """Follow one started epoch to its end: every worker's ``EpochDone``, and the next epoch if it
        was started as soon as this one was decided."""
        e = run.epoch
        voted: list[Vote] = await self._gather(run.voted)
        self.lc = highest_lc(voted)
        fallback, serial = combine_votes(voted)
        if serial:
            # Every worker votes again without the serial transactions' writes (an extra round, only in
            # epochs that have some); the decision is made from these.
            await self._gather(run.revoted)
        else:
            self.stages.pop(run.revoted, None)
        self.last_decided = e
        t_voted = time.perf_counter()
        following = early(voted)
        done: list[EpochDone] = await self._gather(run.done)
        self.metrics.epoch(run.started_at, t_voted, time.perf_counter(), done)
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
