"""Recovery, the coordinator's side: roll every worker back to the last complete snapshot and replay
the epochs that may have been decided, in a new generation.

A recovery starts when a worker re-registers after a crash, when an epoch stage stalls, or once every
worker is back after the coordinator itself restarted (:meth:`Recovery.resume`, from its state in
S3). Opening the generation is synchronous (the epoch loop stops and the new view goes out before
anything else is sent); the rest is retried, with a capped backoff, while it fails on operating
errors: S3 or the broker away (an ``OSError``: :class:`~styx_py.core.errors.BackendError`, a timeout),
a worker that did not answer or could not restore (its ``RecoverDone`` says why). The retries are
bounded: once ``recovery_max_attempts`` attempts in a row failed, or ``recovery_max_s`` passed since the
first of them, the recovery gives up and the cluster stops, degraded, saying why and what the last
attempt failed on (:meth:`styx_coordinator.server.Coordinator.give_up`). Anything else raised in an
attempt is a bug: it ends the coordinator (its task group), whose supervisor restarts it.

How long an attempt waits for the workers' answers adapts to how long restores really take: at least
``epoch_timeout_ms``, at least :data:`RESTORE_TIMEOUT_FACTOR` times the last successful restore, and
twice as long after each attempt that some worker did not answer in time (up to
:data:`MAX_RECOVERY_TIMEOUT_FACTOR` times ``epoch_timeout_ms``). A fixed timeout shorter than a restore
fails every attempt, each one cancelling the restores of the last (restores of a durable-mode cluster
took up to 28 s against 30 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import msgspec

from styx_coordinator.cluster import Cluster
from styx_coordinator.epochs import EpochLoop
from styx_coordinator.logcheck import LogCheck
from styx_coordinator.meta import MetaStore
from styx_coordinator.snapshots import empty_manifest, last_complete_epoch, with_generation
from styx_coordinator.snapshotter import Snapshotter
from styx_coordinator.tasks import Tasks
from styx_py.core.graph import GraphVersion, load_graph
from styx_py.core.limits import MAX_RECOVERY_BACKOFF_S, MAX_RECOVERY_TIMEOUT_FACTOR, RESTORE_TIMEOUT_FACTOR
from styx_py.core.ports import Clock, LogReader
from styx_py.core.wire import Fenced, Manifest, Recover, RecoverDone

__all__ = ["MAX_RECOVERY_BACKOFF_S", "MAX_RECOVERY_TIMEOUT_FACTOR", "RESTORE_TIMEOUT_FACTOR", "Recovery"]

log = logging.getLogger("styx.coordinator")


class Recovery:
    def __init__(
        self,
        cluster: Cluster,
        clock: Clock,
        tasks: Tasks,
        epochs: EpochLoop,
        snapshots: Snapshotter,
        store: MetaStore,
        logs: LogReader | None,
        give_up: Callable[[str], None],
    ) -> None:
        self.cluster = cluster
        self.clock = clock
        self.tasks = tasks
        self.epochs = epochs
        self.snapshots = snapshots
        self.store = store
        self.logs = logs
        self.task: asyncio.Task[None] | None = None
        self.answers: dict[str, RecoverDone] = {}  # this attempt's RecoverDone, per worker
        self.fenced: set[str] = set()  # workers that saw this generation's view (Fenced)
        self.answered = asyncio.Event()
        self.count = 0  # recoveries started (a generation each; a planned shape change is not one)
        self.moves = 0  # planned shape changes begun (a generation each, partitions moved at a barrier)
        self.give_up = give_up  # the retries are spent: stop the cluster, degraded, saying why
        self.failed_attempts = 0  # in a row, for the backoff
        # Since the last successful recovery: attempts begun (one cut short by a newer start counts:
        # a worker that crashes in every recovery must not restart it for ever), and when the first
        # began (None: no recovery under way).
        self.attempts = 0
        self.first_attempt_at: float | None = None
        self.unanswered_attempts = 0  # in a row, attempts some worker did not answer in time
        self.last_restore_s = 0.0  # how long the last successful attempt took
        self.replay_until = (
            -1
        )  # every epoch up to here was decided (replies may be out): replay, never re-form
        self.detected_after_s = 0.0  # last failure to its worker's re-registration
        self.started_at = 0.0  # when the last successful attempt began
        self.last: dict[str, Any] | None = None  # the last recovery, as ``styx status`` shows it
        self.last_move: dict[str, Any] | None = None  # the last planned shape change's, likewise
        self.resuming = False  # taking over from a dead coordinator: waiting for ``expected`` to register
        self.expected: set[str] = set()
        self.resume_started = 0.0
        # Workers that left the cluster (drained or lost) -> until when their lease may still run: the
        # log is read only once each answered Retire with Fenced or its lease ran out
        # (styx_coordinator.reshape).
        self.retiring: dict[str, float] = {}
        self.keep = False  # this recovery is a shape change at a barrier (see start)
        # Has the broker lost the log? Checked first in every attempt; a loss stops the cluster for
        # good (set by the coordinator; none in a bare Recovery).
        self.logcheck: LogCheck | None = None
        self.lose_log: Callable[[list[str]], None] = lambda lost: None

    def start(self, *, keep: bool = False) -> None:
        """(Re)start recovery (a failure during recovery simply starts it again, within the bound of
        the module docstring: the attempt it cuts short counts). ``keep``: a shape
        change at a barrier (styx_coordinator.reshape): every worker finished the last epoch that ran,
        keeps the partitions it still owns and hands the others to their new owners (styx_worker.handoff);
        nothing is restored from S3 nor replayed. If that fails, the retry is a full recovery."""
        if self.cluster.degraded:
            log.error("not recovering: the cluster is degraded (%s)", self.cluster.degraded)
            return
        if self.task is not None and not self.task.done():
            self.task.cancel()
            keep = False  # the recovery under way may have rolled some worker back already
            if (spent := self._spent()) is not None:
                self.give_up(f"{spent}; the last attempt was cut short by a newer failure")
                return
        self.keep = keep
        self._new_generation()
        self.task = self.tasks.start(self._run())

    def rejoined(self) -> None:
        """While resuming, a worker of the resumed cluster registered: recover once all are back."""
        if self.resuming and set(self.cluster.membership.workers) >= self.expected:
            self.resuming = False
            log.warning("all %d workers are back: recovering", len(self.expected))
            self.start()

    def on_fenced(self, msg: Fenced) -> None:
        if msg.gen == self.cluster.gen:
            self.fenced.add(msg.node_id)
            self.answered.set()

    def on_done(self, msg: RecoverDone) -> None:
        if msg.gen == self.cluster.gen:
            self.answers[msg.node_id] = msg
            self.answered.set()

    def _new_generation(self) -> None:
        """Synchronously, before anything else is sent: stop the epoch loop and open a new
        generation, so no message of the old one can reach a restarted worker as if it were current."""
        self.epochs.stop()
        self.cluster.state = "recovering"
        if self.keep:
            self.moves += 1
        else:
            self.count += 1
        self.snapshots.abandon()
        self.cluster.gen += 1
        self.fenced = set()
        self.cluster.broadcast_view(handoff=self.keep)

    async def _run(self) -> None:
        """Retried while it fails on operating errors (S3 or a worker may be down for a while), with a
        capped backoff, within the bound (module docstring); the cluster reports "recovering"
        meanwhile, and the attempts so far in ``styx status``."""
        while (reasons := await self._counted_attempt()) is not None:
            self.failed_attempts += 1
            backoff_s = min(MAX_RECOVERY_BACKOFF_S, 0.05 * 2**self.failed_attempts)
            if (spent := self._spent(backoff_s)) is not None:
                self.give_up(f"{spent}; the last attempt failed: {reasons}")
                return
            log.error("recovery to generation %d failed (%s); retrying", self.cluster.gen, reasons)
            await self.clock.sleep(backoff_s)
            self.keep = False  # a planned change that failed ends in a full recovery
            self._new_generation()
        if self.cluster.halted:  # the broker lost the log: the cluster stopped for good
            return
        self.failed_attempts = self.attempts = 0
        self.first_attempt_at = None
        if self.keep and self.last_move is not None:
            # A planned change: from the barrier asked for to the end of its epoch (which ran as usual),
            # and how long no epoch ran after it, until now.
            self.last_move["barrier_s"] = round(self.epochs.parked_at - self.epochs.barrier_at, 3)
            self.last_move["stopped_s"] = round(self.clock.now() - self.epochs.parked_at, 3)
        self.epochs.start(self.replay_until, on_replayed=self._replayed)

    async def _counted_attempt(self) -> str | None:
        if self.first_attempt_at is None:
            self.first_attempt_at = self.clock.now()
        self.attempts += 1
        return await self._attempt()

    def _spent(self, wait_s: float = 0.0) -> str | None:
        """Why the recovery under way must give up rather than begin another attempt in ``wait_s``
        (its retries are spent), or None."""
        if self.first_attempt_at is None:
            return None
        cfg = self.cluster.config
        elapsed_s = self.clock.now() - self.first_attempt_at
        if self.attempts < cfg.recovery_max_attempts and elapsed_s + wait_s < cfg.recovery_max_s:
            return None
        return (
            f"recovery gave up after {self.attempts} attempts in {elapsed_s:.1f}s (recovery_max_attempts="
            f"{cfg.recovery_max_attempts}, recovery_max_s={cfg.recovery_max_s:g}); restart the "
            "coordinator to try again once the cause is mended"
        )

    async def _attempt(self) -> str | None:
        """One attempt; the reason it failed on an operating error, or None. Raises on anything else
        (a bug)."""
        c, snapshots = self.cluster, self.snapshots
        assert snapshots.manifest is not None
        # Workers decide from each other's votes, so one may have decided (and replied) an epoch whose
        # votes did not all reach this coordinator: every epoch that every worker logged is replayed
        # (a worker votes only once its entry is durable). A failure during a replay must not shorten
        # it: epochs decided before are still replayed.
        # At a barrier no epoch runs and nothing is read from the log: the workers fence (flush their
        # replies) while the state is saved and the partitions move; the epochs start once both are
        # done. Otherwise only once no worker decides an epoch of an older generation any more (each
        # said so when it saw this generation's view) is the log read: nothing decided after it can
        # be missed.
        if not self.keep and self.logcheck is not None:
            try:
                lost = await self.logcheck.lost(snapshots.manifest)
            except OSError as exc:  # the broker: unreachable, failing the read
                return f"checking the broker's log failed: {type(exc).__name__}: {exc}"
            if lost:
                self.lose_log(lost)  # halts the cluster (and cancels this task)
                return None
        if not self.keep and (why := await self._fence()) is not None:
            return why
        try:
            logged = -1 if self.keep else await self._last_logged(snapshots.manifest)
        except OSError as exc:  # the broker: unreachable, failing the read, or a record that does not decode
            return f"reading the sequencer log failed: {type(exc).__name__}: {exc}"
        try:
            # Durable before any worker hears of it: a restarted coordinator must never reuse a
            # generation number, nor mistake a new generation's epochs for a dead one's.
            m = await self._save(logged)
        except OSError as exc:  # S3: unreachable, refusing, timed out
            return f"saving the cluster state failed: {type(exc).__name__}: {exc}"
        replay_until = self.replay_until
        started = self.started_at = self.clock.now()
        self.answers = {}
        self.answered.clear()
        c.broadcast(Recover(m, replay_until, c.gen, self.keep, c.segment))
        timeout_s = self.timeout_s()
        await self._until(lambda: len(self.answers) >= len(c.workers), timeout_s)
        missing = sorted(set(c.workers) - set(self.answers))
        if missing:
            self.unanswered_attempts += 1
            return f"no answer from {missing} within {timeout_s:.1f}s"
        self.unanswered_attempts = 0
        reasons = ", ".join(f"{d.node_id}: {d.error}" for d in self.answers.values() if not d.ok)
        if reasons:
            return reasons
        # A partition's new owner writes replies to its lane only once its old owner's are on the log.
        if self.keep and (why := await self._fence()) is not None:
            return why
        restore_s = self.last_restore_s = self.clock.now() - started
        if self.keep:  # ``styx status`` shows it with the shape changes, not as a recovery
            self.last_move = {"generation": c.gen, "after_epoch": replay_until, "move_s": round(restore_s, 3)}
        else:
            self.last = {
                "generation": c.gen,
                "snapshot_epoch": m.epoch,
                "detect_s": round(self.detected_after_s, 3),
                "restore_s": round(restore_s, 3),
                "replay_epochs": max(0, replay_until - m.epoch),
                "replay_s": 0.0 if replay_until <= m.epoch else None,
            }
        if self.keep:  # every worker is at the last epoch that ran: the next one follows it
            log.warning(
                "generation %d: partitions moved after epoch %d in %.3fs", c.gen, replay_until, restore_s
            )
            self.epochs.epoch = replay_until + 1
        else:
            log.warning(
                "generation %d: restored snapshot %d in %.3fs, replaying epochs %d..%d",
                c.gen,
                m.epoch,
                restore_s,
                m.epoch + 1,
                replay_until,
            )
            self.epochs.epoch = m.epoch + 1
            self.epochs.lc = m.lc
        self.retiring.clear()
        c.state = "running"
        return None

    async def _fence(self) -> str | None:
        """Until every worker answered this generation's view with Fenced (it decides nothing of an
        older one any more, and every reply it queued is on the log), and every worker that left did
        or its lease ran out; why not, on a timeout."""
        c = self.cluster
        await self._until(lambda: set(c.workers) <= self.fenced, self.timeout_s())
        if missing := sorted(set(c.workers) - self.fenced):
            self.unanswered_attempts += 1
            return f"no Fenced from {missing}: they did not see generation {c.gen}'s view"
        if self.retiring:
            left_s = max(self.retiring.values()) - self.clock.now()
            if left_s > 0.001:
                await self._until(lambda: set(self.retiring) <= self.fenced, left_s)
        return None

    async def _save(self, logged: int) -> Manifest:
        """Decide what the new generation replays (up to the last decided or logged epoch) and save the
        cluster state with it; returns the manifest the workers recover from."""
        c, snapshots = self.cluster, self.snapshots
        assert snapshots.manifest is not None
        self.replay_until = replay_until = max(self.replay_until, self.epochs.last_decided, logged)
        # Generation ``gen`` runs the epochs after the last decided one; a partially logged epoch of
        # the dead generation keeps its old generation number and is never replayed.
        snapshots.manifest = m = with_generation(snapshots.manifest, replay_until + 1, c.gen)
        await self.store.save(c, m)
        return m

    async def _last_logged(self, m: Manifest) -> int:
        """The last epoch after snapshot ``m`` that every worker logged in the generation that ran it."""
        if self.logs is None:
            return -1
        entries = await self.logs.seqlog(m.seqlog_offset if m.epoch >= 0 else 0)
        return last_complete_epoch(entries, m, len(self.cluster.workers))

    def timeout_s(self) -> float:
        """How long the next attempt waits for every worker's answer (module docstring)."""
        base = self.cluster.config.epoch_timeout_ms / 1000
        wait: float = max(base, RESTORE_TIMEOUT_FACTOR * self.last_restore_s) * 2.0**self.unanswered_attempts
        return min(wait, MAX_RECOVERY_TIMEOUT_FACTOR * base)

    async def _until(self, done: Callable[[], bool], timeout_s: float) -> None:
        """Until ``done()`` holds (checked whenever a worker answers), or ``timeout_s`` passed (one
        timeout, not a loop over remainders: on a clock of finite resolution a remainder can be too
        small to ever fire)."""
        with contextlib.suppress(TimeoutError):
            async with self.clock.timeout(timeout_s):
                while not done():
                    self.answered.clear()
                    await self.answered.wait()

    def _replayed(self) -> None:
        """The epoch loop finished replaying the epochs decided before the recovery."""
        if self.last is not None:
            self.last["replay_s"] = round(self.clock.now() - self.started_at, 3)
            log.warning("replay done: %s", self.last)

    async def resume(self) -> bool:
        """Take over the cluster a previous coordinator ran, from its state in S3.

        Returns False when there is none (a fresh cluster). Otherwise the graph, placement and
        generation are restored, the last complete snapshot is found, and the epochs that may have
        been decided are found in the sequencer log (every worker's entry present); once all workers
        have re-registered (:meth:`rejoined`), a recovery replays them, exactly as after a worker crash.
        """
        saved = await self.store.load()
        if saved is None:
            return False
        meta, manifest = saved
        c, epochs = self.cluster, self.epochs
        graph = load_graph(meta.graph_path)
        if manifest is None:
            manifest = empty_manifest(graph.n_partitions)
        m = msgspec.structs.replace(manifest, epoch_generations=meta.epoch_generations)
        self.snapshots.manifest = m
        c.graph_path = meta.graph_path
        c.versions = list(meta.versions) or [GraphVersion(1, meta.graph_path, 0)]
        assert c.versions[-1].import_path == meta.graph_path, "saved state: the last version is not the graph"
        c.operators = graph.specs()
        c.placement = meta.placement
        c.gen = meta.gen
        c.n_seq = meta.n_seq or len(meta.workers)
        c.segment = meta.segment
        self.expected = set(meta.workers)
        if self.logs is not None:
            entries = await self.logs.seqlog(m.seqlog_offset if m.epoch >= 0 else 0)
            epochs.last_decided = last_complete_epoch(entries, m, len(meta.workers))
        else:
            epochs.last_decided = m.epoch
        self.replay_until = epochs.last_decided
        self.resuming = True
        self.resume_started = self.clock.now()
        c.state = "recovering"
        c.deployed.set()
        log.warning(
            "resuming %s: generation %d, snapshot %d, epochs up to %d to replay; waiting for %d workers",
            meta.graph_path,
            c.gen,
            m.epoch,
            epochs.last_decided,
            len(self.expected),
        )
        return True
