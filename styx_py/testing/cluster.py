"""A whole styx-py cluster in one process: the real coordinator and workers on in-memory fakes.

The simulation runs on virtual time. While a :class:`SimCluster` is open, its event loop's clock
is virtual (the ``looptime`` library): it stands still while anything can run and jumps to the next
timer when every task waits for one. Heartbeats, the coordinator's failure detection, the workers'
leases, epoch and recovery timeouts all run on it, so a lost message costs an epoch timeout of
simulated time and no real time, and a run is a pure function of its seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import random
from collections import Counter
from collections.abc import Coroutine
from typing import Any, TypeVar

import looptime
import msgspec

from styx_coordinator.server import Coordinator
from styx_py.core.config import Config, load_config
from styx_py.core.graph import Graph, load_graph, version_at
from styx_py.core.partitioning import Key, partition_of
from styx_py.core.segments import segment_topic, segments_in, unread
from styx_py.core.serial import reply_outcome, serial_replay
from styx_py.core.wire import COORDINATOR, Reply, Request, decode_value, encode_value
from styx_py.testing.memory import (
    MemoryBlobStore,
    MemoryEgress,
    MemoryIngress,
    MemoryLog,
    MemoryLogReader,
    MemoryNetwork,
    MemorySeqLog,
)
from styx_worker.ports import WorkerPorts
from styx_worker.shell import Worker

T = TypeVar("T")


def virtual_time() -> contextlib.AbstractContextManager[None]:
    """Make the running event loop's clock virtual until the returned context exits.

    Under pytest the looptime plugin prepares every test's event loop; a plain asyncio loop is
    prepared here. uvloop cannot run the simulation (its clock cannot be replaced).
    """
    loop = asyncio.get_running_loop()
    if not isinstance(loop, looptime.LoopTimeEventLoop):
        if not isinstance(loop, asyncio.BaseEventLoop):
            raise RuntimeError(
                f"the simulation needs an asyncio event loop with a replaceable clock, not {type(loop)}"
            )
        loop = looptime.patch_event_loop(loop, _enabled=False)
    return contextlib.nullcontext() if loop.looptime_on else loop.looptime_enabled()


def run_simulated(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` (which opens SimClusters) on a fresh event loop, e.g. from a seed-sweep script."""
    with asyncio.Runner(loop_factory=looptime.new_event_loop) as runner:
        return runner.run(main)


class SimCluster:
    """``async with SimCluster("pkg.mod:app", workers=3, seed=7) as c: c.submit(...); await c.wait()``."""

    def __init__(
        self,
        graph_path: str,
        *,
        workers: int = 3,
        seed: int = 0,
        egress_ack_lag: int = 0,
        seqlog_ack_lag: int = 0,
        **config: Any,
    ) -> None:
        self.graph_path = graph_path
        self.egress_ack_lag = egress_ack_lag
        self.seqlog_ack_lag = seqlog_ack_lag  # loop hops before a sequencer-log entry is durable
        self.graph: Graph = load_graph(graph_path)
        self.n_workers = workers
        self.seed = seed
        self.config: Config = load_config(
            {"epoch_interval_ms": 0, "heartbeat_interval_ms": 200, **config}, env={}
        )
        self.network = MemoryNetwork(seed)
        self.log = MemoryLog()
        self.requests: dict[str, Request] = {}
        self.submissions: Counter[str] = Counter()
        # Ingress segments (core.segments): where each request id was last written (segment, partition,
        # record, and whether late: not to the newest segment, as by a client that lags), and the
        # copies written again because the workers may have stopped reading a segment with a late copy
        # (the SDK's rule): the late copy may have been read after all, or not.
        self.segment_of: dict[str, tuple[int, int, Request, bool]] = {}
        self.segment_resends: Counter[str] = Counter()
        self.late_segment: dict[str, int] = {}  # the oldest segment a late copy of a request id went to
        # Each submission names a seeded reply partition, as SDK clients do (-1: none, the reply goes
        # to a partition of its worker's choosing); the partitions each request id may be answered on
        # (-1: any).
        self._reply_routes = random.Random(seed)
        self.routes: dict[str, set[int]] = {}
        self.replies: list[Reply] = []
        self._reply_event = asyncio.Event()
        self.network.on_error = self._reply_event.set
        self._ids = itertools.count()
        self.workers: list[Worker] = []
        self.worker_tasks: dict[str, asyncio.Task[None]] = {}
        self._dead: list[asyncio.Task[None]] = []  # tasks of crashed workers and coordinators
        self._closing = False
        self.blobs = MemoryBlobStore()
        self.crashes = 0
        self.retired: list[str] = []  # workers that left the cluster when told to (Retire)
        self.coordinator = self._new_coordinator()
        self._clock = contextlib.ExitStack()

    async def __aenter__(self) -> SimCluster:
        self._clock.enter_context(virtual_time())
        cfg = self.config
        n = self.graph.n_partitions
        self.log.create(cfg.ingress_topic, n)
        self.log.create(cfg.egress_topic, n)
        self.log.create(cfg.seqlog_topic, 1)
        self.network.register(COORDINATOR, self.coordinator.on_message)
        self.coordinator_task = asyncio.create_task(self.coordinator.run())
        self.coordinator_task.add_done_callback(lambda _: self._reply_event.set())
        for i in range(1, self.n_workers + 1):
            self._start_worker(f"w{i}")
        await self.coordinator.deploy(self.graph_path)
        return self

    def _new_coordinator(self) -> Coordinator:
        cfg = self.config
        return Coordinator(
            cfg,
            self.network.endpoint(COORDINATOR),
            min_workers=self.n_workers,
            blobs=self.blobs,
            logs=MemoryLogReader(self.log, cfg.egress_topic, cfg.seqlog_topic),
            create_topics=self._create_topics,
        )

    async def _create_topics(self, topics: dict[str, int]) -> None:
        for topic, n in topics.items():
            self.log.create(topic, n)

    def crash_coordinator(self) -> None:
        """Kill the coordinator and start a new one that resumes from its state in the blob store."""
        self.crashes += 1
        self._reply_event.set()  # wake a wait() that watches the old coordinator
        self.network.unregister(COORDINATOR)
        self.coordinator.transport.dead = True  # type: ignore[attr-defined]
        self.coordinator_task.cancel()
        self._dead.append(self.coordinator_task)
        self.coordinator = coordinator = self._new_coordinator()

        async def resume() -> None:
            assert await coordinator.resume(), "no coordinator state to resume from"
            self.network.register(COORDINATOR, coordinator.on_message)
            for w in self.workers:
                w.on_disconnect(COORDINATOR)  # what a broken TCP connection tells a worker
            await coordinator.run()

        self.coordinator_task = asyncio.create_task(resume())
        self.coordinator_task.add_done_callback(lambda _: self._reply_event.set())

    def _start_worker(self, node: str) -> Worker:
        cfg = self.config
        ports = WorkerPorts(
            self.network.endpoint(node),
            MemoryIngress(self.log, cfg.ingress_topic),
            MemoryEgress(self.log, cfg.egress_topic, self._on_reply, self.egress_ack_lag),
            MemorySeqLog(self.log, cfg.seqlog_topic, self.seqlog_ack_lag),
            self.blobs,
            MemoryLogReader(self.log, cfg.egress_topic, cfg.seqlog_topic),
        )
        # A fenced worker exits (its supervisor restarts it): here, a crash and a restart.
        w = Worker(node, cfg, ports, on_fenced=lambda: self.crash(node))
        self.network.register(node, w.on_message)
        self.workers = [x for x in self.workers if x.node_id != node] + [w]
        self.workers.sort(key=lambda x: x.node_id)
        self.worker_tasks[node] = task = asyncio.create_task(w.run())
        task.add_done_callback(functools.partial(self._worker_ended, w))
        return w

    def _worker_ended(self, w: Worker, task: asyncio.Task[None]) -> None:
        """A worker told to leave (Retire) returns from run(): it is gone, like its process."""
        if not task.cancelled() and task.exception() is None and w.retired.is_set():
            self.retired.append(w.node_id)
            self.network.unregister(w.node_id, drained=True)
            self.workers = [x for x in self.workers if x is not w]
            if self.worker_tasks.get(w.node_id) is task:
                del self.worker_tasks[w.node_id]
            self._dead.append(task)
        self._reply_event.set()  # wake wait() to report a crash

    def add_worker(self, node: str) -> None:
        """Start a new worker process: it registers with the running cluster and gets partitions."""
        assert node not in self.worker_tasks, f"{node} runs already"
        self._start_worker(node)

    def lose(self, node: str) -> None:
        """Kill a worker for good (no restart): the others take over once ``takeover_after_ms`` passed."""
        if node in self.worker_tasks:
            self.crash(node, restart=False)

    def crash(self, node: str, *, restart: bool = True) -> None:
        """Kill a worker at this very point (state, in-flight work and undelivered messages are lost)
        and start a fresh process with the same id, which re-registers and triggers recovery."""
        if node not in self.worker_tasks:
            return  # it left the cluster (or was lost) already
        self.crashes += 1
        self.network.unregister(node)
        old = next(w for w in self.workers if w.node_id == node)
        old.ports.transport.dead = True  # type: ignore[attr-defined]
        old.ports.egress.lose_unacked()  # type: ignore[attr-defined]
        old.ports.seqlog.lose_unacked()  # type: ignore[attr-defined]
        dead = self.worker_tasks.pop(node)
        dead.cancel()
        self._dead.append(dead)  # awaited at exit: never left for the garbage collector to close
        if not self._closing and restart:
            self._start_worker(node)
        elif not restart:
            self.workers = [x for x in self.workers if x is not old]

    async def __aexit__(self, *exc: object) -> None:
        with self._clock:
            self._closing = True  # a worker that fences itself now is not restarted
            tasks = [self.coordinator_task, *self.worker_tasks.values()]
            for t in tasks:
                t.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(*self._dead, return_exceptions=True)  # their failures were reported
            for r in results:
                if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                    raise r

    def _on_reply(self, reply: Reply) -> None:
        self.replies.append(reply)
        self._reply_event.set()

    def submit(
        self, operator: str, function: str, key: Key, *args: Any, request_id: str | None = None
    ) -> str:
        rid = request_id or f"r{next(self._ids)}"
        partitions = self.graph.operators[operator].partitions if operator in self.graph.operators else 1
        partition = partition_of(key, partitions)  # raises TypeError for a bad key, before recording
        req = self.requests.get(rid)
        if req is None:
            req = Request(
                rid, operator, function, key, msgspec.Raw(encode_value(list(args))), len(self.requests)
            )
            self.requests[rid] = req
        self._append(req, partition)
        return rid

    def resubmit(self, request_id: str) -> None:
        """A client resending a request id it already sent (same request, again on the log; it may name
        another reply partition, as a resend by another client would)."""
        req = self.requests[request_id]
        partitions = (
            self.graph.operators[req.operator].partitions if req.operator in self.graph.operators else 1
        )
        self._append(req, partition_of(req.key, partitions))

    def _append(self, req: Request, partition: int) -> None:
        reply_partition = self._reply_routes.randrange(-1, self.graph.n_partitions)
        self.routes.setdefault(req.request_id, set()).add(max(-1, reply_partition))
        self.submissions[req.request_id] += 1
        routed = msgspec.structs.replace(req, reply_partition=reply_partition)
        # Into the newest ingress segment, which the workers may not read yet (the coordinator created
        # it and has not named it in an epoch yet, or died in between), or, late, into an older one
        # they read (a client that has not noticed the newest yet).
        segment = segments_in(self.log.topics, self.config.ingress_topic)[-1]
        older = self.coordinator.cluster.segment - 1
        late = older >= 0 and self._reply_routes.random() < 0.3
        if late:
            segment = older
            self.late_segment.setdefault(req.request_id, segment)
        self.segment_of[req.request_id] = (segment, partition, routed, late)
        self.log.append(segment_topic(self.config.ingress_topic, segment), partition, routed)

    def _resend_from_old_segments(self) -> None:
        """What an SDK client does once the newest ingress segment is ``n``: write again, to ``n``, every
        request without a reply that it last wrote late to a segment the workers may no longer read
        (core.segments.unread). One written on time is never left unread: workers drain a segment."""
        newest = segments_in(self.log.topics, self.config.ingress_topic)[-1]
        answered = {r.request_id for r in self.replies}
        for rid, (segment, partition, routed, late) in list(self.segment_of.items()):
            if late and unread(segment, newest) and rid not in answered:
                self.segment_of[rid] = (newest, partition, routed, False)
                self.segment_resends[rid] += 1
                self.log.append(segment_topic(self.config.ingress_topic, newest), partition, routed)

    def _unanswered(self) -> bool:
        """Some submission of a request id has no reply yet. Of a request id with a late copy in a
        segment the workers may no longer read, one reply will do: that copy may have been left unread."""
        newest = segments_in(self.log.topics, self.config.ingress_topic)[-1]
        if not unread(0, newest):
            return len(self.replies) < self.submissions.total()
        counts = Counter(r.request_id for r in self.replies)
        return any(
            counts[rid] < (1 if unread(self.late_segment.get(rid, newest), newest) else n)
            for rid, n in self.submissions.items()
        )

    def misrouted_replies(self) -> list[tuple[int, Reply]]:
        """Replies on an egress partition that no submission of their request id named (a submission
        that named none may be answered on any), in every egress segment."""
        egress = self.config.egress_topic
        out = []
        for s in segments_in(self.log.topics, egress):
            for q, part in enumerate(self.log.topics[segment_topic(egress, s)]):
                for r in part:
                    routes = self.routes.get(r.request_id, ())
                    if q not in routes and -1 not in routes:
                        out.append((q, r))
        return out

    async def deploy(self, import_path: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """Deploy ``import_path`` to the running cluster (a code update; raises GraphError when it is
        refused); requests submitted after it use its partition counts."""
        coordinator = self.coordinator
        # A coordinator started after a crash answers admin requests once it resumed (as its server
        # does: it listens only then).
        await asyncio.wait_for(coordinator.cluster.deployed.wait(), timeout_s)
        body = await coordinator.deploy(import_path, timeout_s)
        self.graph = load_graph(import_path)
        return body

    def graph_at(self, epoch: int) -> Graph:
        """The graph version that ran ``epoch`` (from the coordinator's committed versions)."""
        versions = self.coordinator.cluster.versions
        return load_graph(version_at(versions, epoch).import_path) if versions else self.graph

    async def wait_for_replies(self, n: int, timeout_s: float = 60.0) -> None:
        """Until at least ``n`` replies arrived (e.g. to act while the rest still runs)."""

        async def until() -> None:
            while len(self.replies) < n:
                self._reply_event.clear()
                await self._reply_event.wait()

        await asyncio.wait_for(until(), timeout_s)

    async def wait(self, timeout_s: float = 60.0) -> list[Reply]:
        """Until every submitted request has a reply (fails loudly on a timeout or a crashed task)."""

        async def until_done() -> None:
            while self._unanswered():
                self._resend_from_old_segments()
                self._reply_event.clear()
                if self.network.errors:
                    raise self.network.errors[0]
                leaving = {w.node_id for w in self.workers if w.retired.is_set()}
                live = [t for n, t in self.worker_tasks.items() if n not in leaving]
                for t in [self.coordinator_task, *live]:
                    if t.done():
                        t.result()
                        raise AssertionError("a cluster task ended")
                if self.coordinator.cluster.segment == 0:
                    await self._reply_event.wait()
                else:  # also look again for requests to write again (virtual time)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.05):
                            await self._reply_event.wait()
            # Replies leave before the epoch ends (early commit); state is final once it has, and
            # once no recovery (a worker that restarted after its last reply) is rebuilding it.
            while not self.coordinator.idle.is_set() or self._recovering():
                if self.coordinator.idle.is_set():
                    # A recovery is still to come (a restarted worker registers on its own timer):
                    # let virtual time pass, or nothing that waits for it ever runs.
                    await asyncio.sleep(0.05)
                    continue
                self._reply_event.clear()
                idle = asyncio.ensure_future(self.coordinator.idle.wait())
                changed = asyncio.ensure_future(self._reply_event.wait())
                # A recovery ends without a reply or an idle loop to wake on: look again (virtual time).
                await asyncio.wait([idle, changed], timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
                idle.cancel()
                changed.cancel()

        await asyncio.wait_for(until_done(), timeout_s)
        return self.replies

    def _recovering(self) -> bool:
        """A recovery runs, or is still to come: a worker restarted after a crash (or just started)
        and is not in the running generation yet."""
        r = self.coordinator.recovery
        if self.coordinator.state != "running" or r.resuming or (r.task is not None and not r.task.done()):
            return True
        return any(w.generation != self.coordinator.cluster.gen for w in self.workers)

    def state(self) -> dict[tuple[str, Key], Any]:
        merged: dict[tuple[str, Key], Any] = {}
        for w in self.workers:
            for k, v in w.store.items():
                assert k not in merged, f"key {k} on two workers"
                merged[k] = decode_value(v)
        return merged

    def duplicate_replies(self) -> list[str]:
        """Request ids answered more often than they were submitted, or answered differently."""
        counts = Counter(r.request_id for r in self.replies)
        first: dict[str, Reply] = {}
        differing = {r.request_id for r in self.replies if first.setdefault(r.request_id, r) != r}
        allowed = self.submissions + self.segment_resends
        return sorted({rid for rid, n in counts.items() if n > allowed[rid]} | differing)

    def unique_replies(self) -> list[Reply]:
        """One reply per request id (resent ids are answered with an identical reply)."""
        return list({r.request_id: r for r in self.replies}.values())

    def fingerprint(self) -> str:
        """A hash of the final state and every reply: equal for two runs of the same seed."""
        h = hashlib.sha256()
        for k, v in sorted(self.state().items(), key=repr):
            h.update(repr((k, v)).encode())
        for r in sorted(self.replies, key=lambda r: r.request_id):
            h.update(msgspec.msgpack.encode(r))
        return h.hexdigest()


async def check_against_serial(cluster: SimCluster) -> None:
    """Every request answered (resends identically), nothing answered twice, and every reply and the
    final state equal to the serial execution in commit order, each transaction running the graph
    version of its epoch."""
    c = cluster
    # On a quiet cluster: a fault not fired by now (a crash scheduled past the end of the work) would
    # fire while the check runs and catch a restarted worker mid-recovery.
    c.network.faults.clear()
    await c.wait()
    assert not c.duplicate_replies(), "a request was answered twice, or differently"
    assert not c.misrouted_replies(), "a reply went to an egress partition its request did not name"
    assert {r.request_id for r in c.replies} == set(c.requests), "a request was not answered"
    serial_state, serial_outcomes = await serial_replay(c.graph_at, c.requests, c.unique_replies())
    for reply in c.replies:
        assert reply_outcome(reply) == serial_outcomes[reply.request_id], (c.seed, reply)
    assert c.state() == serial_state, f"seed {c.seed}: final state differs from the serial execution"
