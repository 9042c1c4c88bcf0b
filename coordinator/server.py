"""The coordinator: membership, placement, deploy, the epoch barrier and status.

It never touches transaction data: per epoch it broadcasts ``EpochStart``, waits for every worker's
``ExecDone`` (and broadcasts the union of logic aborts), every ``Vote`` (and broadcasts one
``Decision``: the fallback set), then every ``EpochDone``. Epochs run back to back while any worker
has pending work, spaced by at least ``epoch_interval_ms``; an idle cluster waits for a
``WorkAvailable`` instead of spinning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import msgspec

from styx_py.coordinator.barrier import Stage, combine_exec, combine_votes
from styx_py.coordinator.membership import Membership
from styx_py.coordinator.metrics import CoordinatorMetrics
from styx_py.coordinator.placement import place
from styx_py.coordinator.snapshots import (
    META_KEY,
    compact,
    empty_manifest,
    extend,
    last_complete_epoch,
    manifest_decoder,
    manifest_encoder,
    meta_decoder,
    meta_encoder,
    retain,
    with_generation,
)
from styx_py.core.blobs import BlobStore, epoch_of, manifest_key
from styx_py.core.config import Config
from styx_py.core.errors import GraphError, StyxError
from styx_py.core.graph import OperatorSpec, load_graph
from styx_py.core.ports import LogReader, Transport
from styx_py.core.wire import (
    AdminReply,
    AllExecDone,
    ClusterMeta,
    ClusterView,
    Decision,
    DeployRequest,
    EpochDone,
    EpochStart,
    ExecDone,
    Heartbeat,
    Manifest,
    Message,
    Recover,
    RecoverDone,
    Register,
    SnapshotDone,
    SnapshotResult,
    StatusRequest,
    Vote,
    WorkAvailable,
)

log = logging.getLogger("styx.coordinator")

MAX_RECOVERY_BACKOFF_S = 2.0

TopicCreator = Callable[[dict[str, int]], Awaitable[None]]


class Coordinator:
    def __init__(
        self,
        config: Config,
        transport: Transport,
        *,
        min_workers: int = 1,
        kafka_bootstrap: str | None = None,
        create_topics: TopicCreator | None = None,
        clock: Callable[[], float] = time.monotonic,
        detect_failures: bool = True,
        blobs: BlobStore | None = None,
        logs: LogReader | None = None,
    ) -> None:
        self.blobs = blobs
        self.logs = logs
        self.gen = 0
        self.state = "starting"  # starting | running | recovering
        self.manifest: Manifest | None = None  # last complete snapshot (or the empty one)
        self.snapshot_pending: dict[int, dict[str, SnapshotDone]] = {}
        self.snapshot_lc: dict[int, int] = {}
        self.last_snapshot_at = clock()
        self.last_snapshot: dict[str, Any] | None = None
        self.last_decided = -1
        self.replay_until = (
            -1
        )  # every epoch up to here was decided (replies may be out): replay, never re-form
        self.loop_task: asyncio.Task[None] | None = None
        self.recovery_task: asyncio.Task[None] | None = None
        self.recovering = False
        self.recover_done: dict[str, RecoverDone] = {}
        self.recover_event = asyncio.Event()
        self.recoveries = 0
        self.stalls = 0
        self.detected_after_s = 0.0
        self.last_recovery: dict[str, Any] | None = None
        self.recovery_started = 0.0
        self.resuming = False
        self.expected: set[str] = set()
        self.failed_recoveries = 0
        self.compactions = 0
        self.failed_snapshots = 0
        self.removed_objects = 0
        self.detect_failures = detect_failures
        self.failed: list[str] = []
        self.config = config
        self.transport = transport
        self.min_workers = min_workers
        self.kafka_bootstrap = kafka_bootstrap
        self.create_topics = create_topics
        self.clock = clock
        self.membership = Membership(config.failure_timeout_ms)
        self.graph_path: str | None = None
        self.operators: list[OperatorSpec] = []
        self.placement: list[str] = []
        self.generation = 0
        self.epoch = 0
        self.lc = 0
        self.stage: Stage[Any] | None = None
        self.stage_done = asyncio.Event()
        self.work = asyncio.Event()
        self.deployed = asyncio.Event()
        self.enough_workers = asyncio.Event()
        self.idle = asyncio.Event()  # set while no epoch runs and no worker has work
        self.tasks: asyncio.TaskGroup | None = None
        self.totals = {"committed": 0, "aborted": 0, "rescheduled": 0, "fallback": 0}
        self.epoch_times: deque[tuple[float, int, int, int]] = deque(maxlen=2000)
        self.started_at = clock()
        self.metrics = CoordinatorMetrics(self)  # read at scrape time; per epoch: a few observations

    # ---- lifecycle --------------------------------------------------------------------------------
    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self.tasks = tg
            if not self.resuming:
                self.loop_task = tg.create_task(self._epoch_loop())
            if self.detect_failures:
                tg.create_task(self._monitor_loop())
            await asyncio.Future()  # serve until cancelled; a failing child task ends the group

    async def _monitor_loop(self) -> None:
        """Declare workers failed after ``failure_timeout_ms`` without a heartbeat.

        Heartbeats are sent from the worker's event loop, so a hung loop is detected too. Recovery
        (reassigning partitions, replaying from the last snapshot) builds on this signal.
        """
        interval = self.config.heartbeat_interval_ms / 1000 / 2
        while True:
            await asyncio.sleep(interval)
            failed = self.membership.failed(self.clock())
            for node_id in failed:
                if node_id not in self.failed:
                    log.error(
                        "worker %s missed heartbeats for %d ms: failed",
                        node_id,
                        self.config.failure_timeout_ms,
                    )
            self.failed = failed

    # ---- messages ---------------------------------------------------------------------------------
    def on_message(self, src: str, msg: Message) -> None:
        match msg:
            case ExecDone() | Vote() | EpochDone() if msg.gen != self.gen:
                pass  # from a generation a recovery ended
            case ExecDone() | Vote() | EpochDone():
                stage = self.stage
                if stage is not None and stage.add(msg):
                    self.stage_done.set()
            case WorkAvailable():
                self.work.set()
            case Heartbeat():
                self.membership.heartbeat(msg.node_id, self.clock())
                if msg.node_id in self.membership.workers:
                    # The echo renews the worker's lease (see Worker._check_lease).
                    self.transport.send(msg.node_id, Heartbeat("coordinator", self.epoch))
            case Register():
                self._on_register(msg)
            case DeployRequest():
                self._spawn(self._deploy_and_reply(src, msg.import_path))
            case StatusRequest():
                self.transport.send(src, AdminReply(True, "", self.status()))
            case SnapshotDone():
                self._on_snapshot_done(msg)
            case RecoverDone():
                if msg.gen == self.gen:
                    self.recover_done[msg.node_id] = msg
                    self.recover_event.set()
            case _:
                raise AssertionError(f"coordinator: unexpected {type(msg).__name__} from {src}")

    def _on_register(self, msg: Register) -> None:
        if self.resuming:
            # Taking over from a coordinator that died: wait for the workers it had, then recover.
            if msg.node_id not in self.expected:
                log.warning("worker %s is not part of the resumed cluster; ignored", msg.node_id)
                return
            self.membership.register(msg.node_id, msg.host, msg.port, self.clock())
            if set(self.membership.workers) >= self.expected:
                self.resuming = False
                log.warning("all %d workers are back: recovering", len(self.expected))
                self.start_recovery()
            return
        if self.graph_path is not None and msg.node_id in self.membership.workers:
            # A worker came back (restarted after a crash): its state is gone, so the cluster rolls
            # back to the last complete snapshot and replays the logged epochs.
            last_seen = self.membership.last_seen.get(msg.node_id, self.clock())
            self.detected_after_s = self.clock() - last_seen
            self.membership.register(msg.node_id, msg.host, msg.port, self.clock())
            log.warning("worker %s re-registered: recovering", msg.node_id)
            self.start_recovery()
            return
        if self.graph_path is not None and msg.node_id not in self.membership.workers:
            # Joining a running cluster means moving partitions: not supported yet (see README).
            log.warning("worker %s registered after deploy; it gets no partitions", msg.node_id)
            return
        self.membership.register(msg.node_id, msg.host, msg.port, self.clock())
        log.info("worker %s registered (%d workers)", msg.node_id, len(self.membership.workers))
        if len(self.membership.workers) >= self.min_workers:
            self.enough_workers.set()
        if self.graph_path is not None:
            self._broadcast_view()

    # ---- deploy -----------------------------------------------------------------------------------
    async def deploy(self, import_path: str, timeout_s: float = 30.0) -> dict[str, Any]:
        graph = load_graph(import_path)  # validates; raises GraphError
        if self.graph_path is not None:
            if self.graph_path == import_path:
                return self.status()
            raise GraphError(f"graph {self.graph_path!r} is already deployed")
        try:
            await asyncio.wait_for(self.enough_workers.wait(), timeout_s)
        except TimeoutError as exc:
            raise GraphError(
                f"only {len(self.membership.workers)} of {self.min_workers} workers registered "
                f"after {timeout_s}s"
            ) from exc
        n = graph.n_partitions
        if self.create_topics is not None:
            cfg = self.config
            await self.create_topics({cfg.ingress_topic: n, cfg.egress_topic: n, cfg.seqlog_topic: 1})
        self.graph_path = import_path
        self.operators = graph.specs()
        self.placement = place(n, list(self.membership.workers))
        self.manifest = empty_manifest(n)
        await self._save_meta()
        self._broadcast_view()
        self.state = "running"
        self.deployed.set()
        log.info("deployed %s: %d partitions on %d workers", import_path, n, len(self.membership.workers))
        return self.status()

    async def _deploy_and_reply(self, src: str, import_path: str) -> None:
        try:
            body = await self.deploy(import_path)
        except StyxError as exc:
            self.transport.send(src, AdminReply(False, str(exc), {}))
        else:
            self.transport.send(src, AdminReply(True, "", body))

    def view(self) -> ClusterView:
        cfg = self.config
        return ClusterView(
            self.generation,
            self.membership.infos(),
            self.placement,
            self.graph_path,
            self.operators,
            self.kafka_bootstrap,
            cfg.ingress_topic,
            cfg.egress_topic,
            cfg.seqlog_topic,
            self.gen,
        )

    def _broadcast_view(self) -> None:
        self.generation += 1
        view = self.view()
        for node_id in sorted(self.membership.workers):
            self.transport.send(node_id, view)

    # ---- the epoch barrier ------------------------------------------------------------------------
    def _broadcast(self, msg: Message) -> None:
        for node_id in self.workers:
            self.transport.send(node_id, msg)

    @property
    def workers(self) -> list[str]:
        return sorted(self.membership.workers)

    async def _gather(self, stage: Stage[Any]) -> list[Any]:
        """Every worker's message for this stage. A stage that does not complete within
        ``epoch_timeout_ms`` (a lost message, a wedged worker) is treated as a failure: recover."""
        gen = self.gen
        if not stage.complete:
            try:
                async with asyncio.timeout(self.config.epoch_timeout_ms / 1000):
                    await self.stage_done.wait()
            except TimeoutError:
                missing = sorted(stage.expected - set(stage.got))
                log.error("epoch %d stalled waiting for %s: recovering", stage.epoch, missing)
                self.stalls += 1
                self.start_recovery()  # cancels this loop
                raise asyncio.CancelledError from None
        if gen != self.gen:
            # A recovery began while we waited; never act on for a generation that is over (a
            # cancellation can race with the wake-up, so this does not rely on it).
            raise asyncio.CancelledError
        self.stage_done.clear()
        return stage.messages()

    def _open(self, epoch: int, kind: type[Any]) -> Stage[Any]:
        self.stage = Stage(epoch, self.workers, kind)
        self.stage_done.clear()
        return self.stage

    async def _epoch_loop(self, replay_until: int = -1) -> None:
        """Run epochs back to back; epochs up to ``replay_until`` re-run their logged composition."""
        await self.deployed.wait()
        interval_s = self.config.epoch_interval_ms / 1000
        last_start = 0.0
        gen = self.gen
        while True:
            if gen != self.gen:
                return  # a recovery began: this loop belongs to a generation that is over
            e = self.epoch
            replay = e <= replay_until
            self.work.clear()
            self.idle.clear()
            if interval_s > 0 and not replay:
                wait = last_start + interval_s - self.clock()
                if wait > 0:
                    await asyncio.sleep(wait)
                last_start = self.clock()
                if gen != self.gen:
                    return
            stage = self._open(e, ExecDone)
            t_start = time.perf_counter()
            self._broadcast(EpochStart(e, self.lc, self.gen, replay))
            aborted, self.lc = combine_exec(await self._gather(stage))
            t_executed = time.perf_counter()
            stage = self._open(e, Vote)
            self._broadcast(AllExecDone(e, aborted, self.gen))
            fallback, uncacheable = combine_votes(await self._gather(stage))
            t_voted = time.perf_counter()
            stage = self._open(e, EpochDone)
            snapshot = not replay and self._snapshot_due()
            if snapshot:
                self.snapshot_pending[e] = {}
                self.snapshot_lc[e] = self.lc
                self.last_snapshot_at = self.clock()
            self._broadcast(Decision(e, fallback, uncacheable, self.gen, snapshot))
            self.last_decided = e
            done: list[EpochDone] = await self._gather(stage)
            self.metrics.epoch(t_start, t_executed, t_voted, time.perf_counter(), done)
            self.stage = None
            committed = sum(d.committed for d in done)
            aborts = sum(d.aborted for d in done)
            self.totals["committed"] += committed
            self.totals["aborted"] += aborts
            self.totals["rescheduled"] += sum(d.rescheduled for d in done)
            self.totals["fallback"] += len(fallback)
            self.epoch_times.append((self.clock(), committed, aborts, len(fallback)))
            self.epoch = e + 1
            if e == replay_until and self.last_recovery is not None:
                self.last_recovery["replay_s"] = round(self.clock() - self.recovery_started, 3)
                log.warning("replay done: %s", self.last_recovery)
            if e + 1 > replay_until and sum(d.pending for d in done) == 0 and not self.work.is_set():
                self.idle.set()
                await self.work.wait()

    # ---- snapshots ----------------------------------------------------------------------------------
    def _snapshot_due(self) -> bool:
        if self.blobs is None or self.snapshot_pending:
            return False
        every = self.config.snapshot_interval_epochs
        if every > 0:
            return self.epoch % every == every - 1
        return self.clock() - self.last_snapshot_at >= self.config.snapshot_interval_s

    def _on_snapshot_done(self, msg: SnapshotDone) -> None:
        parts = self.snapshot_pending.get(msg.epoch)
        if parts is None or msg.gen != self.gen:
            return
        parts[msg.node_id] = msg
        if len(parts) == len(self.workers):
            self._spawn(self._complete_snapshot(msg.epoch, self.gen))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in the coordinator's task group; dropped when the coordinator is stopping (a
        message can still arrive while its task group shuts down)."""
        assert self.tasks is not None
        try:
            self.tasks.create_task(coro)
        except RuntimeError:  # "TaskGroup ... is shutting down"
            coro.close()

    async def _complete_snapshot(self, epoch: int, gen: int) -> None:
        """Write the manifest once every part is durable; only then is the snapshot usable."""
        parts = self.snapshot_pending.get(epoch)
        if parts is None or gen != self.gen:
            return  # a recovery started since: the snapshot is abandoned (its deltas are rebuilt)
        ok = all(p.ok for p in parts.values())
        if ok:
            assert self.blobs is not None and self.manifest is not None
            seqlog_offset = min(p.seqlog_offset for p in parts.values())
            manifest = extend(self.manifest, epoch, self.snapshot_lc[epoch], seqlog_offset)
            try:
                await self.blobs.put(manifest_key(epoch), manifest_encoder.encode(manifest))
            except Exception as exc:  # noqa: BLE001 - the snapshot fails; the next one carries its deltas
                log.warning("manifest of snapshot %d not written: %s", epoch, exc)
                self.failed_snapshots += 1
                ok = False
            else:
                if gen == self.gen:
                    self.manifest = manifest
                    self.last_snapshot = {
                        "epoch": epoch,
                        "objects": sum(p.objects for p in parts.values()),
                        "bytes": sum(p.bytes for p in parts.values()),
                    }
                await self._compact(manifest, gen)
        else:
            self.failed_snapshots += 1
            errors = "; ".join(f"{n}: {p.error}" for n, p in sorted(parts.items()) if not p.ok)
            log.warning("snapshot %d failed: %s", epoch, errors)
        self.metrics.snapshot(ok, self.clock() - self.last_snapshot_at)
        self.snapshot_pending.pop(epoch, None)
        self.snapshot_lc.pop(epoch, None)
        if gen == self.gen:
            self._broadcast(SnapshotResult(epoch, ok))

    async def _compact(self, manifest: Manifest, gen: int) -> None:
        """Merge long delta chains and drop what no manifest needs (the next snapshot waits for it)."""
        assert self.blobs is not None
        try:
            cfg = self.config
            compacted = await compact(
                self.blobs, manifest, cfg.snapshot_compact_after, cfg.dedup_replies_per_partition
            )
            if compacted != manifest:
                await self.blobs.put(manifest_key(manifest.epoch), manifest_encoder.encode(compacted))
                if gen == self.gen and self.manifest is manifest:
                    self.manifest = compacted
                manifest = compacted
            # A recovery that started meanwhile may be loading the objects retention would remove.
            removed = await retain(self.blobs, manifest) if gen == self.gen else 0
        except Exception as exc:  # noqa: BLE001 - compaction is an optimisation: the chain stays valid
            log.warning("compaction after snapshot %d failed: %s", manifest.epoch, exc)
            return
        self.compactions += 1
        self.removed_objects += removed

    # ---- durable coordinator state ----------------------------------------------------------------
    async def _save_meta(self) -> None:
        """Persist what a restarted coordinator needs (written at deploy and at every recovery)."""
        if self.blobs is None or self.graph_path is None or self.manifest is None:
            return
        meta = ClusterMeta(
            self.graph_path, self.placement, self.workers, self.gen, list(self.manifest.epoch_generations)
        )
        await self.blobs.put(META_KEY, meta_encoder.encode(meta))

    async def resume(self) -> bool:
        """Take over the cluster a previous coordinator ran, from its state in S3.

        Returns False when there is none (a fresh cluster). Otherwise the graph, placement and
        generation are restored, the last complete snapshot is found, and the epochs that may have
        been decided are found in the sequencer log (every worker's entry present); once all workers
        have re-registered, a recovery replays them, exactly as after a worker crash.
        """
        if self.blobs is None:
            return False
        raw = await self.blobs.get(META_KEY)
        if raw is None:
            return False
        meta = meta_decoder.decode(raw)
        graph = load_graph(meta.graph_path)
        manifests = await self.blobs.list("manifests/")
        if manifests:
            latest = max(manifests, key=epoch_of)
            data = await self.blobs.get(latest)
            assert data is not None, f"{latest} vanished while listed"
            manifest = manifest_decoder.decode(data)
        else:
            manifest = empty_manifest(graph.n_partitions)
        self.manifest = msgspec.structs.replace(manifest, epoch_generations=meta.epoch_generations)
        self.graph_path = meta.graph_path
        self.operators = graph.specs()
        self.placement = meta.placement
        self.gen = meta.gen
        self.expected = set(meta.workers)
        if self.logs is not None:
            start = self.manifest.seqlog_offset if self.manifest.epoch >= 0 else 0
            entries = await self.logs.seqlog(start)
            self.last_decided = last_complete_epoch(entries, self.manifest, len(meta.workers))
        else:
            self.last_decided = self.manifest.epoch
        self.replay_until = self.last_decided
        self.resuming = True
        self.state = "recovering"
        self.deployed.set()
        log.warning(
            "resuming %s: generation %d, snapshot %d, epochs up to %d to replay; waiting for %d workers",
            meta.graph_path,
            self.gen,
            self.manifest.epoch,
            self.last_decided,
            len(self.expected),
        )
        return True

    # ---- recovery -----------------------------------------------------------------------------------
    def start_recovery(self) -> None:
        """(Re)start recovery (a failure during recovery simply starts it again)."""
        assert self.tasks is not None
        if self.recovery_task is not None and not self.recovery_task.done():
            self.recovery_task.cancel()
        self._new_generation()
        self.recovery_task = self.tasks.create_task(self._recover())

    def _new_generation(self) -> None:
        """Synchronously, before anything else is sent: stop the epoch loop and open a new
        generation, so no message of the old one can reach a restarted worker as if it were current."""
        if self.loop_task is not None:
            self.loop_task.cancel()
        self.state = "recovering"
        self.recoveries += 1
        self.stage = None
        self.snapshot_pending.clear()
        self.snapshot_lc.clear()
        self.gen += 1
        self._broadcast_view()

    async def _recover(self) -> None:
        """Retried for as long as it takes (S3 or a worker may be down for a while), with a capped
        backoff; the cluster reports "recovering" meanwhile."""
        while (reasons := await self._recover_once()) is not None:
            self.failed_recoveries += 1
            log.error("recovery to generation %d failed (%s); retrying", self.gen, reasons)
            await asyncio.sleep(min(MAX_RECOVERY_BACKOFF_S, 0.05 * 2**self.failed_recoveries))
            self._new_generation()
        self.failed_recoveries = 0
        assert self.tasks is not None
        self.loop_task = self.tasks.create_task(self._epoch_loop(self.replay_until))

    async def _recover_once(self) -> str | None:
        """One attempt; the reason it failed, or None."""
        assert self.manifest is not None
        # A failure during a replay must not shorten it: epochs decided before are still replayed.
        self.replay_until = replay_until = max(self.replay_until, self.last_decided)
        # Generation ``gen`` runs the epochs after the last decided one; a partially logged epoch of
        # the dead generation keeps its old generation number and is never replayed.
        self.manifest = with_generation(self.manifest, replay_until + 1, self.gen)
        m = self.manifest
        try:
            # Durable before any worker hears of it: a restarted coordinator must never reuse a
            # generation number, nor mistake a new generation's epochs for a dead one's.
            await self._save_meta()
        except Exception as exc:  # noqa: BLE001 - the attempt fails and is retried
            return f"saving the cluster state failed: {type(exc).__name__}: {exc}"
        started = self.recovery_started = self.clock()
        self.recover_done = {}
        self.recover_event.clear()
        self._broadcast(Recover(self.gen, m, replay_until))
        deadline = self.clock() + self.config.epoch_timeout_ms / 1000
        while len(self.recover_done) < len(self.workers) and self.clock() < deadline:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, deadline - self.clock())):
                    await self.recover_event.wait()
            self.recover_event.clear()
        missing = sorted(set(self.workers) - set(self.recover_done))
        if missing:
            return f"no answer from {missing}"
        reasons = ", ".join(f"{d.node_id}: {d.error}" for d in self.recover_done.values() if not d.ok)
        if reasons:
            return reasons
        self.last_recovery = {
            "generation": self.gen,
            "snapshot_epoch": m.epoch,
            "detect_s": round(self.detected_after_s, 3),
            "restore_s": round(self.clock() - started, 3),
            "replay_epochs": max(0, replay_until - m.epoch),
            "replay_s": 0.0 if replay_until <= m.epoch else None,
        }
        log.warning(
            "generation %d: restored snapshot %d in %.3fs, replaying epochs %d..%d",
            self.gen,
            m.epoch,
            self.clock() - started,
            m.epoch + 1,
            replay_until,
        )
        self.epoch = m.epoch + 1
        self.lc = m.lc
        self.state = "running"
        return None

    # ---- status -----------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        now = self.clock()
        recent = [t for t in self.epoch_times if now - t[0] <= 10.0]
        window = min(10.0, max(now - self.started_at, 1e-9))
        finished = sum(t[1] + t[2] for t in recent)
        return {
            "graph": self.graph_path,
            "epoch": self.epoch,
            "workers": [
                {
                    "node_id": w.node_id,
                    "sid": w.sid,
                    "address": f"{w.host}:{w.port}",
                    "partitions": [p for p, o in enumerate(self.placement) if o == w.node_id],
                    "last_heartbeat_s_ago": round(now - self.membership.last_seen.get(w.node_id, now), 3),
                }
                for w in self.membership.infos()
            ],
            "operators": [
                {"name": o.name, "partitions": o.partitions, "functions": o.functions} for o in self.operators
            ],
            "epochs_per_s": round(len(recent) / window, 1),
            "txn_per_s": round(finished / window, 1),
            "abort_rate": round(sum(t[2] for t in recent) / finished, 4) if finished else 0.0,
            "totals": dict(self.totals),
            "failed_workers": list(self.failed),
            "state": self.state,
            "generation": self.gen,
            "recoveries": self.recoveries,
            "stalled_epochs": self.stalls,
            "last_recovery": self.last_recovery,
            "last_snapshot": self.last_snapshot,
            "kafka_bootstrap": self.kafka_bootstrap,
            "ingress_topic": self.config.ingress_topic,
            "egress_topic": self.config.egress_topic,
        }
