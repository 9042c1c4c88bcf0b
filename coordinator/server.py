"""The coordinator: membership, placement, deploy, the epoch barrier and status.

It never touches transaction data: per epoch it broadcasts ``EpochStart``, waits for every worker's
``ExecDone`` (and broadcasts the union of logic aborts), every ``Vote`` (and broadcasts one
``Decision``: the fallback set), then every ``EpochDone``. Epochs run back to back while any worker
has pending work, spaced by at least ``epoch_interval_ms``; an idle cluster waits for a
``WorkAvailable`` instead of spinning.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from coordinator.barrier import Stage, combine_exec, combine_votes
from coordinator.membership import Membership
from coordinator.placement import place
from styx_py.config import Config
from styx_py.errors import GraphError, StyxError
from styx_py.graph import OperatorSpec, load_graph
from styx_py.wire import (
    AdminReply,
    AllExecDone,
    ClusterView,
    Decision,
    DeployRequest,
    EpochDone,
    EpochStart,
    ExecDone,
    Heartbeat,
    Message,
    Register,
    StatusRequest,
    Vote,
    WorkAvailable,
)
from worker.epoch import Transport

log = logging.getLogger("styx.coordinator")

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
    ) -> None:
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

    # ---- lifecycle --------------------------------------------------------------------------------
    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self.tasks = tg
            tg.create_task(self._epoch_loop())
            if self.detect_failures:
                tg.create_task(self._monitor_loop())

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
            case ExecDone() | Vote() | EpochDone():
                stage = self.stage
                if stage is not None and stage.add(msg):
                    self.stage_done.set()
            case WorkAvailable():
                self.work.set()
            case Heartbeat():
                self.membership.heartbeat(msg.node_id, self.clock())
            case Register():
                self._on_register(msg)
            case DeployRequest():
                assert self.tasks is not None
                self.tasks.create_task(self._deploy_and_reply(src, msg.import_path))
            case StatusRequest():
                self.transport.send(src, AdminReply(True, "", self.status()))
            case _:
                raise AssertionError(f"coordinator: unexpected {type(msg).__name__} from {src}")

    def _on_register(self, msg: Register) -> None:
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
        self._broadcast_view()
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
        if not stage.complete:
            await self.stage_done.wait()
        self.stage_done.clear()
        return stage.messages()

    def _open(self, epoch: int) -> Stage[Any]:
        self.stage = Stage(epoch, self.workers)
        self.stage_done.clear()
        return self.stage

    async def _epoch_loop(self) -> None:
        await self.deployed.wait()
        interval_s = self.config.epoch_interval_ms / 1000
        last_start = 0.0
        while True:
            e = self.epoch
            self.work.clear()
            self.idle.clear()
            if interval_s > 0:
                wait = last_start + interval_s - self.clock()
                if wait > 0:
                    await asyncio.sleep(wait)
                last_start = self.clock()
            stage = self._open(e)
            self._broadcast(EpochStart(e, self.lc))
            aborted, self.lc = combine_exec(await self._gather(stage))
            stage = self._open(e)
            self._broadcast(AllExecDone(e, aborted))
            fallback, uncacheable = combine_votes(await self._gather(stage))
            stage = self._open(e)
            self._broadcast(Decision(e, fallback, uncacheable))
            done: list[EpochDone] = await self._gather(stage)
            self.stage = None
            committed = sum(d.committed for d in done)
            aborts = sum(d.aborted for d in done)
            self.totals["committed"] += committed
            self.totals["aborted"] += aborts
            self.totals["rescheduled"] += sum(d.rescheduled for d in done)
            self.totals["fallback"] += len(fallback)
            self.epoch_times.append((self.clock(), committed, aborts, len(fallback)))
            self.epoch = e + 1
            if sum(d.pending for d in done) == 0 and not self.work.is_set():
                self.idle.set()
                await self.work.wait()

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
            "last_snapshot": None,
            "kafka_bootstrap": self.kafka_bootstrap,
            "ingress_topic": self.config.ingress_topic,
            "egress_topic": self.config.egress_topic,
        }
