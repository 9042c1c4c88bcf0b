"""The worker process's shell: the ports, one task group, and the effects of the core carried out.

Everything the worker decides is in its core (:mod:`styx_worker.core`). The :class:`Worker` feeds it
messages, the end of each invocation (:mod:`styx_worker.runner`), log acknowledgements and ingress
records, and carries out the effects in order over the ports: sends, invocations, log appends, replies
(pushed to subscribed clients too, :mod:`styx_worker.feed`), snapshot uploads, reports once the egress is
flushed. Membership (:mod:`styx_worker.membership`), recoveries and partition moves
(:mod:`styx_worker.reconfig`) and code versions (:mod:`styx_worker.versions`) are their own modules. Every
task is a child of one task group, so a failure anywhere ends the process.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from styx_py.core.config import Config
from styx_py.core.wire import (
    COORDINATOR,
    Fenced,
    Handoff,
    Heartbeat,
    Message,
    PrepareGraph,
    PushedRequest,
    Recover,
    SubscribeReplies,
    WorkAvailable,
)
from styx_worker import effects as fx
from styx_worker import snapshot, status
from styx_worker.admission import Admission, AdmissionGate
from styx_worker.core import CORE_MESSAGES, WorkerCore
from styx_worker.effects import Effect, Event
from styx_worker.feed import ReplyFeed
from styx_worker.membership import Membership
from styx_worker.metrics import WorkerGauges, WorkerMetrics
from styx_worker.outbox import effect_runner
from styx_worker.outgoing import Outgoing
from styx_worker.ports import WorkerPorts
from styx_worker.reconfig import Reconfiguration
from styx_worker.runner import InvocationRunner
from styx_worker.state import StateStore
from styx_worker.txn import Tally
from styx_worker.versions import CodeVersions

__all__ = ["SHELL_MESSAGES", "Worker", "fence_off"]

SHELL_MESSAGES = frozenset({Heartbeat, Handoff, PrepareGraph, SubscribeReplies, PushedRequest, Recover})
"""The messages a worker's port takes that the shell handles itself (the core takes the others)."""

log = logging.getLogger("styx.worker")


class _Left(Exception):
    """The worker was told to leave the cluster (Retire): its tasks stop."""


def fence_off() -> None:
    """Leave at once, without flushing anything: this process may already have been replaced."""
    os._exit(70)


class Worker:
    def __init__(
        self,
        node_id: str,
        config: Config,
        ports: WorkerPorts,
        *,
        host: str = "",
        port: int = 0,
        heartbeats: bool = True,
        on_fenced: Callable[[], None] = fence_off,
    ) -> None:
        self.node_id = node_id
        self.config = config
        self.ports = ports
        self.core = WorkerCore(node_id, config, ports)
        self.versions = CodeVersions(node_id, self.core.epochs.graphs)
        self.membership = Membership(node_id, host, port, config.failure_timeout_ms / 1000, heartbeats)
        self.feed = ReplyFeed(ports.transport.send, ports.egress.offsets, ports.clock.now)
        self.outgoing = Outgoing(self.membership, ports.clock, ports.egress, self.feed, on_fenced)
        self.runner = InvocationRunner(self.step, self.step, self.spawn)
        policy = Admission(config.epoch_size_max, config.admission_epoch_ms, config.admission_queue_ms)
        self.admission = AdmissionGate(policy, ports.clock, self.core.batch)
        self.metrics = WorkerMetrics(self)  # read at scrape time; nothing per transaction
        self.reconfig = Reconfiguration(
            self.core,
            self.versions,
            (ports.ingress, ports.egress, ports.logs, ports.blobs, ports.clock),
            config.failure_timeout_ms / 1000,
            config.dedup_replies_per_partition,
            (self.apply, self.send_coordinator, self.cancel_inflight),
            self.metrics.recovery,
        )
        self.effects = effect_runner(node_id, lambda: self.store, self.versions.newest, ports, self.spawn)
        self.outgoing.on_reply = None if self.effects is None else self.effects.replied
        self.tasks: asyncio.TaskGroup | None = None
        self.inflight: set[asyncio.Task[None]] = set()  # invocations that wait, uploads, replay reads
        self.retired = asyncio.Event()  # no longer part of the cluster (Retire): run() returns
        self._queue: deque[Effect] = deque()  # effects not carried out yet, in order
        self._applying = False
        ports.ingress.set_listener(self._on_ingress_available)

    # ---- what the tests and the metrics read ------------------------------------------------------------
    @property
    def generation(self) -> int:
        return self.core.gen

    @property
    def totals(self) -> Tally:
        return self.core.epochs.totals

    @property
    def store(self) -> StateStore:
        return self.core.epochs.store

    @property
    def halted(self) -> str:
        return self.core.halted

    @property
    def recovering(self) -> asyncio.Task[None] | None:
        return self.reconfig.task

    # ---- lifecycle -----------------------------------------------------------------------------------
    async def run(self) -> None:
        """Serve until cancelled, or until told to leave the cluster (then it returns). Every task of
        the worker is a child of this task group."""
        try:
            async with asyncio.TaskGroup() as tg:
                self.tasks = tg
                try:
                    self.send_coordinator(self.membership.start(self.ports.clock.now()))
                    if self.membership.enabled:
                        tg.create_task(self._heartbeat_loop())
                    if self.effects is not None:
                        tg.create_task(self.effects.run())
                    await self.retired.wait()
                    raise _Left  # cancels every task of the group
                finally:
                    self.runner.close()  # queued invocations are cancelled with the tasks
        except* _Left:
            log.warning("%s: left the cluster", self.node_id)

    async def _heartbeat_loop(self) -> None:
        # Sent from the worker's own event loop: a hung loop stops heartbeats and counts as failed.
        interval = self.config.heartbeat_interval_ms / 1000
        clock = self.ports.clock
        while True:
            load = dict(self.core.batch.sequenced)
            effects = None if self.effects is None else self.effects.summary()
            for msg in self.membership.heartbeat(
                clock.now(), self.core.epochs.completed_epoch, load, effects
            ):
                self.send_coordinator(msg)
            await clock.sleep(interval)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a child of the worker's task group; a recovery or a halt cancels it."""
        assert self.tasks is not None, "worker not running"
        try:
            task = self.tasks.create_task(coro)
        except RuntimeError:  # the task group is over: the worker stops, and nothing it starts runs
            coro.close()
            return
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)

    def cancel_inflight(self) -> None:
        """Recovery or a halt: every invocation, upload and replay read in flight is cancelled."""
        self.runner.clear()
        for task in list(self.inflight):
            task.cancel()
        self.inflight.clear()

    def on_disconnect(self, peer: str) -> None:
        """A connection broke. The coordinator's: register again (delivered once it is back). A
        client's: push it nothing more."""
        if peer == COORDINATOR:
            self.send_coordinator(self.membership.register(self.ports.clock.now()))
        else:
            self.feed.drop(peer)

    def send_coordinator(self, msg: Message) -> None:
        self.ports.transport.send(COORDINATOR, msg)

    def _on_ingress_available(self) -> None:
        self.admission.arrived()
        if self.core.view is not None:
            self.send_coordinator(WorkAvailable(self.node_id))

    # ---- messages and events in --------------------------------------------------------------------
    def on_message(self, src: str, msg: Message) -> None:
        if src == COORDINATOR:
            self.membership.heard(self.ports.clock.now())
        if type(msg) in CORE_MESSAGES:
            self.apply(self.core.step(msg))
            return
        match msg:
            case Heartbeat():
                pass  # the coordinator's echo: renews the lease (above)
            case Handoff() if not self.core.halted:
                self.reconfig.pieces.add(msg, self.core.gen)
            case Handoff():
                pass
            case PrepareGraph():
                self.send_coordinator(self.versions.prepare(msg))
            case SubscribeReplies():
                self.feed.subscribe(src, msg.marks)
            case PushedRequest() if not self.core.halted:
                self.ports.ingress.offer(msg)
            case PushedRequest():
                pass
            case Recover():
                self._recover(msg)
            case _:
                raise AssertionError(
                    f"worker {self.node_id}: unexpected message {type(msg).__name__} from {src}"
                )

    def _recover(self, msg: Recover) -> None:
        core = self.core
        if core.halted:
            log.error("%s: the cluster is degraded; no recovery (%s)", self.node_id, core.halted)
        elif core.view is None or core.view.gen != msg.gen:
            # The view of this generation went to this worker's previous process (it restarted in
            # between): without it this worker knows neither placement nor graph. Its own registration
            # makes the coordinator start a newer generation.
            log.warning("%s: ignoring recovery to generation %d: no view of it", self.node_id, msg.gen)
        else:
            assert self.tasks is not None
            self.reconfig.start(self.tasks, msg)

    def log_lost(self, what: str) -> None:
        """The broker went back on an offset it gave (styx_worker.logwatch): the coordinator is told,
        and this worker runs nothing more."""
        self.core.log_lost(what)
        self.apply(self.core.flush())

    def step(self, event: Event) -> None:
        """Feed the core one event and carry out what it says."""
        self.apply(self.core.step(event))

    # ---- effects out ---------------------------------------------------------------------------------
    def apply(self, effects: list[Effect]) -> None:
        """Carry out ``effects`` in order; those of an event that an effect feeds back (a Take's records)
        come after the ones already queued."""
        queue = self._queue
        if self._applying:
            queue.extend(effects)
            return
        self._applying = True
        try:
            for effect in effects:
                _APPLY[type(effect)](self, effect)
            while queue:
                effect = queue.popleft()
                _APPLY[type(effect)](self, effect)
        finally:
            self._applying = False

    def _send(self, e: fx.Send) -> None:
        self.ports.transport.send(e.dest, e.msg)

    def _run(self, e: fx.Run) -> None:
        self.runner.start(e)

    def _deliver(self, e: fx.Deliver) -> None:
        self.runner.deliver(e)

    def _closed(self, e: fx.Closed) -> None:
        self.runner.forget(e.epoch)
        self.admission.closed(e.epoch)

    def _take(self, e: fx.Take) -> None:
        self.step(self.admission.take(e, self.ports.ingress))

    def _fetch(self, e: fx.Fetch) -> None:
        async def fetched() -> None:
            take_exact = self.ports.ingress.take_exact
            records = [await take_exact(partition, offset) for partition, offset in e.positions]
            self.step(fx.Taken(e, records))

        self.spawn(fetched())

    def _log(self, e: fx.Log) -> None:
        written = self.ports.seqlog.append(e.entry)
        acked = fx.LogAcked(e.epoch, e.gen)

        def durable(fut: asyncio.Future[None]) -> None:
            if not fut.cancelled() and fut.exception() is None:  # a failed append ends the worker (egress)
                self._guarded(self.step, acked)

        if written.done():
            durable(written)
        else:
            written.add_done_callback(durable)

    def _live(self, e: fx.Live) -> None:
        self.ports.ingress.live(e.segment)
        self.ports.egress.live(e.segment)

    def _assign(self, e: fx.Assign) -> None:
        self.ports.ingress.assign(e.partitions)

    def _load(self, e: fx.Load) -> None:
        self.versions.load(e.version.number, e.version.import_path)

    def _upload(self, e: fx.Upload) -> None:
        flushed = self.ports.egress.flush()  # the replies queued until the capture (snapshot.py)
        pace = (self.config.snapshot_step_rows, self.config.snapshot_step_pause_ms / 1000)

        async def uploaded() -> None:
            observe = self.metrics.snapshot
            done = await snapshot.upload_snapshot(self.node_id, self.ports.blobs, e, flushed, pace, observe)
            self.send_coordinator(done)

        self.spawn(uploaded())

    def _report_fenced(self, e: fx.ReportFenced) -> None:
        """Tell the coordinator this worker decides nothing of a generation before ``e.gen`` any more —
        once every reply it queued is on the log: the recovery that follows reads the log back (a
        partition's new owner among others) and must find them there."""
        fenced = Fenced(self.node_id, e.gen)

        def report() -> None:
            self.send_coordinator(fenced)
            if e.leave:
                self.retired.set()

        async def flushed() -> None:
            await self.ports.egress.flush()
            report()

        if self.tasks is None:
            report()
            return
        coro = flushed()
        try:
            self.tasks.create_task(coro)
        except RuntimeError:  # the worker is shutting down (its process ends): nothing to report
            coro.close()

    def _halt(self, e: fx.Halt) -> None:
        self.cancel_inflight()  # epoch messages are dropped from now on (the core)

    def _guarded(self, fn: Callable[[Any], None], arg: Any) -> None:
        """``fn(arg)`` from a loop callback: what it raises (a bug) ends the worker through its task
        group, as everything else the worker runs does."""
        try:
            fn(arg)
        except BaseException as exc:
            if self.tasks is None:
                raise
            self.tasks.create_task(_raise(exc))

    # ---- what the metrics read ------------------------------------------------------------------------
    def gauges(self) -> WorkerGauges:
        return status.gauges(
            self.core,
            self.ports.ingress.pending(),
            len(self.inflight),
            self.feed,
            self.effects,
            self.admission,
        )

    def readiness(self) -> tuple[bool, str]:
        """``/readyz``: part of a deployed cluster, not recovering, not degraded."""
        return status.readiness(self.core, self.reconfig.running())


async def _raise(exc: BaseException) -> None:
    raise exc


_APPLY: dict[type, Callable[[Worker, Any], None]] = {
    fx.Send: Worker._send,
    fx.Run: Worker._run,
    fx.Deliver: Worker._deliver,
    fx.Closed: Worker._closed,
    fx.Take: Worker._take,
    fx.Fetch: Worker._fetch,
    fx.Log: Worker._log,
    fx.Emit: lambda w, e: w.outgoing.emit(e),
    fx.Changes: lambda w, e: w.outgoing.changes(e),
    fx.Live: Worker._live,
    fx.Assign: Worker._assign,
    fx.Load: Worker._load,
    fx.Upload: Worker._upload,
    fx.ReportFenced: Worker._report_fenced,
    fx.Halt: Worker._halt,
}
