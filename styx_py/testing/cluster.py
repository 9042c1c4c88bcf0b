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
from collections import Counter
from collections.abc import Coroutine
from typing import Any, TypeVar

import looptime
import msgspec

from styx_coordinator.server import Coordinator
from styx_py.core.config import Config, load_config
from styx_py.core.effectids import SYSTEM_OPERATORS
from styx_py.core.graph import Graph, load_graph, version_at
from styx_py.core.partitioning import Key, partition_of
from styx_py.core.segments import segment_topic
from styx_py.core.serial import Writes, reply_outcome, serial_replay
from styx_py.core.wire import COORDINATOR, Reply, Request, decode_value, encode_value
from styx_py.testing.changelog import check_changelog
from styx_py.testing.clients import CLIENT_TIMEOUT_S, SimClients
from styx_py.testing.logguard import MemoryLogGuard
from styx_py.testing.memory import (
    MemoryBlobStore,
    MemoryEgress,
    MemoryIngress,
    MemoryLog,
    MemoryLogReader,
    MemoryNetwork,
)
from styx_py.testing.submissions import Submissions
from styx_worker.ports import WorkerPorts
from styx_worker.shell import Worker

__all__ = ["CLIENT_TIMEOUT_S", "SimCluster", "check_against_serial", "run_simulated", "virtual_time"]

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
    """``async with SimCluster("pkg.mod:app", workers=3, seed=7) as c: c.submit(...); await c.wait()``.

    The processes (the coordinator, the workers) run on the in-memory fakes; the requests go through
    :attr:`clients` (:class:`~styx_py.testing.clients.SimClients`, real StyxClients), and :attr:`sent`
    (:class:`~styx_py.testing.submissions.Submissions`) records what was asked and answered for the
    checks. Faults are seeded on :attr:`network` (``network.faults``), :attr:`blobs` and by
    :meth:`crash`, :meth:`lose` and :meth:`crash_coordinator`. ``resting_clients``: the clients with
    pushed replies let their egress reader rest (:class:`~styx_py.testing.clients.SimClients`).
    """

    def __init__(
        self,
        graph_path: str,
        *,
        workers: int = 3,
        seed: int = 0,
        egress_ack_lag: int = 0,
        seqlog_ack_lag: int = 0,
        resting_clients: bool | None = None,
        network: MemoryNetwork | None = None,
        **config: Any,
    ) -> None:
        self.graph_path = graph_path
        self.egress_ack_lag = egress_ack_lag
        self.seqlog_ack_lag = seqlog_ack_lag  # loop hops before a sequencer-log entry is durable
        self.graph: Graph = load_graph(graph_path)
        self.n_workers = workers
        self.seed = seed
        # Admission control is off unless a test turns it on (tests/test_admission.py): its batch sizes
        # follow virtual epoch durations, which would move every seed's fault points.
        # The changelog is on (every check_against_serial compares it with the serial writes).
        defaults = {
            "epoch_interval_ms": 0,
            "heartbeat_interval_ms": 200,
            "admission_epoch_ms": 0,
            "changelog_topic": "styx-changelog",
        }
        self.config: Config = load_config({**defaults, **config}, env={})
        self.network = network or MemoryNetwork(seed)  # a TimedNetwork: with a latency model
        self.log = MemoryLog()
        # The log-loss check, on every recovery: the in-memory log loses nothing (no false alarm).
        self.guard = MemoryLogGuard(self.log, self.config.seqlog_topic)
        self._reply_event = asyncio.Event()
        self.network.on_error = self._reply_event.set
        cfg = self.config
        self.sent = Submissions(self.log, cfg.ingress_topic, cfg.egress_topic)
        self.clients = SimClients(
            seed,
            cfg,
            self.log,
            self.network,
            self.sent,
            self._placement,
            self._reply_event.set,
            resting_clients,
        )
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
        await self.clients.start(self._operators(), n)
        return self

    @property
    def requests(self) -> dict[str, Request]:
        """Every request id submitted, and the request as it ran (:class:`Submissions`)."""
        return self.sent.requests

    @property
    def submissions(self) -> Counter[str]:
        """The sends of each request id, by a client or raw."""
        return self.sent.submissions

    @property
    def replies(self) -> list[Reply]:
        """Every reply the egress log got, in order."""
        return self.sent.replies

    def _operators(self) -> dict[str, int]:
        return {name: op.partitions for name, op in self.graph.operators.items()}

    def _placement(self) -> dict[str, list[int]]:
        """Each worker and the ingress partitions it reads, as the coordinator's status lists them."""
        out: dict[str, list[int]] = {}
        for p, node in enumerate(self.coordinator.cluster.placement):
            out.setdefault(node, []).append(p)
        return out

    def _new_coordinator(self) -> Coordinator:
        cfg = self.config
        return Coordinator(
            cfg,
            self.network.endpoint(COORDINATOR),
            min_workers=self.n_workers,
            blobs=self.blobs,
            logs=MemoryLogReader(self.log, cfg.egress_topic, cfg.seqlog_topic, cfg.changelog_topic),
            create_topics=self._create_topics,
            guard=self.guard,
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
            MemoryEgress(
                self.log, cfg.egress_topic, self._on_reply, self.egress_ack_lag, cfg.changelog_topic
            ),
            self.network.seqlog(self.log, cfg.seqlog_topic, self.seqlog_ack_lag, node),
            self.blobs,
            MemoryLogReader(self.log, cfg.egress_topic, cfg.seqlog_topic, cfg.changelog_topic),
            requests=_ClientSink(self),
            wall=_virtual_wall,  # the clients stamp requests with it too: a seed's run repeats exactly
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
        """A worker told to leave (Retire) returns from run(): it is gone, like its process. A crash
        fired between its retiring and its end already started a new process of the same id (as a
        supervisor restarts an exited one): that one keeps its place on the network."""
        if not task.cancelled() and task.exception() is None and w.retired.is_set():
            self.retired.append(w.node_id)
            self.workers = [x for x in self.workers if x is not w]
            current = self.worker_tasks.get(w.node_id)
            if current is None or current is task:
                self.network.unregister(w.node_id, drained=True)
                self.worker_tasks.pop(w.node_id, None)
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
            await self.clients.close()  # raises what failed in one of a client's tasks
            tasks = [self.coordinator_task, *self.worker_tasks.values()]
            for t in tasks:
                t.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(*self._dead, return_exceptions=True)  # their failures were reported
            for r in results:
                if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                    raise r

    def _on_reply(self, reply: Reply) -> None:
        self.sent.on_reply(reply)
        self._reply_event.set()

    def submit(
        self, operator: str, function: str, key: Key, *args: Any, request_id: str | None = None
    ) -> str:
        """Send a request through one of the clients (seeded); its request id."""
        rid = request_id or self.sent.new_id()
        known = operator in self.graph.operators
        partitions = self.graph.operators[operator].partitions if known else 1
        partition = partition_of(key, partitions)  # raises TypeError for a bad key, before recording
        req = self.requests.get(rid)
        if req is None:
            req = Request(rid, operator, function, key, msgspec.Raw(encode_value(list(args))))
            self.requests[rid] = req
        if not known:
            # No client sends it (it refuses an unknown operator locally): written as a raw record, as a
            # client of another SDK could, for the workers to answer BadRequest.
            self.submissions[rid] += 1
            self.sent.routes.setdefault(rid, set()).add(-1)
            newest = self.sent.newest_segment()
            self.log.append(segment_topic(self.config.ingress_topic, newest), partition, req)
            self.sent.on_write(rid, newest)
            return rid
        self.clients.send(req)
        return rid

    def submit_request(self, request: Request) -> str:
        """Send ``request`` (its id, operator, function, key and arguments) through one of the clients."""
        args = msgspec.msgpack.decode(request.args)
        return self.submit(
            request.operator, request.function, request.key, *args, request_id=request.request_id
        )

    def resubmit(self, request_id: str) -> None:
        """A client resending a request id it already sent (the same request; through another client, or
        the same one once answered, it may name another reply partition)."""
        self.clients.send(self.requests[request_id])

    def _unanswered(self) -> bool:
        """A client still waits, or some submission has no reply on the log yet (:class:`Submissions`)."""
        return self.clients.waiting() or self.sent.unanswered()

    async def deploy(self, import_path: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """Deploy ``import_path`` to the running cluster (a code update; raises GraphError when it is
        refused); requests submitted after it use its partition counts."""
        coordinator = self.coordinator
        # A coordinator started after a crash answers admin requests once it resumed (as its server
        # does: it listens only then).
        await asyncio.wait_for(coordinator.cluster.deployed.wait(), timeout_s)
        body = await coordinator.deploy(import_path, timeout_s)
        self.graph = load_graph(import_path)
        self.clients.set_deployment(self._operators())
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
                self._reply_event.clear()
                if self.network.errors:
                    raise self.network.errors[0]
                if self.coordinator.cluster.halted:  # for good: a replay diverged
                    raise AssertionError(f"the cluster stopped: {self.coordinator.cluster.degraded}")
                leaving = {w.node_id for w in self.workers if w.retired.is_set()}
                live = [t for n, t in self.worker_tasks.items() if n not in leaving]
                for t in [self.coordinator_task, *live]:
                    if t.done():
                        t.result()
                        raise AssertionError("a cluster task ended")
                # The clients' own loops (segment looks, resubscriptions) run on virtual time too.
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

    def effects_pending(self) -> bool:
        """An external call or a timer is pending in the state, or a call is under way."""
        if any(w.effects is not None and w.effects.calls for w in self.workers):
            return True
        return any(op in SYSTEM_OPERATORS for op, _ in self.state())

    async def settle(self, timeout_s: float = 600.0) -> None:
        """Until every request is answered and no external call or timer is pending (timers wait for
        the virtual time the workers' effect runners read)."""

        async def until() -> None:
            while True:
                await self.wait(timeout_s)
                if not self.effects_pending():
                    return
                await asyncio.sleep(0.05)

        await asyncio.wait_for(until(), timeout_s)

    def _recovering(self) -> bool:
        """A recovery runs, or is still to come: a worker restarted after a crash (or just started)
        and is not in the running generation yet, or a worker lost for good still holds partitions
        (the others take them over once ``takeover_after_ms`` passed)."""
        r = self.coordinator.recovery
        if self.coordinator.state != "running" or r.resuming or (r.task is not None and not r.task.done()):
            return True
        if set(self.coordinator.cluster.placement) - set(self.worker_tasks):
            return True
        return any(w.generation != self.coordinator.cluster.gen for w in self.workers)

    def state(self) -> dict[tuple[str, Key], Any]:
        merged: dict[tuple[str, Key], Any] = {}
        for w in self.workers:
            for k, v in w.store.items():
                assert k not in merged, f"key {k} on two workers"
                merged[k] = decode_value(v)
        return merged

    def fingerprint(self) -> str:
        """A hash of the final state and every reply: equal for two runs of the same seed."""
        h = hashlib.sha256()
        for k, v in sorted(self.state().items(), key=repr):
            h.update(repr((k, v)).encode())
        for r in sorted(self.replies, key=lambda r: r.request_id):
            h.update(msgspec.msgpack.encode(r))
        return h.hexdigest()


def _virtual_wall() -> float:
    """The simulation's wall clock, in s: its event loop's virtual time, which the clients' transports
    stamp requests with (``SimClientTransport.wall_ms``); the effect runners read due timers on it."""
    return asyncio.get_running_loop().time()


class _ClientSink:
    """The workers' own requests (external calls' outcomes, due timers) go through the simulation's
    clients like every other request: ordinary inputs of the serial execution."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster

    def submit(self, partition: int, request: Request) -> asyncio.Future[None]:
        self.cluster.submit_request(request)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


async def check_against_serial(cluster: SimCluster) -> None:
    """Every request answered (resends identically), nothing answered twice, and every reply and the
    final state equal to the serial execution in commit order, each transaction running the graph
    version of its epoch."""
    c = cluster
    # On a quiet cluster: a fault not fired by now (a crash scheduled past the end of the work) would
    # fire while the check runs and catch a restarted worker mid-recovery.
    c.network.faults.points.clear()
    await c.wait()
    assert not c.sent.duplicate_replies(), "a request was answered twice, or differently"
    assert not c.sent.misrouted_replies(), "a reply went to an egress partition its request did not name"
    assert {r.request_id for r in c.replies} == set(c.requests), "a request was not answered"
    commits: list[tuple[Reply, Writes]] = []
    serial_state, serial_outcomes = await serial_replay(
        c.graph_at, c.requests, c.sent.unique_replies(), commits
    )
    for reply in sorted(c.replies, key=lambda r: (r.epoch, r.phase, r.tid)):
        got, serial = reply_outcome(reply), serial_outcomes[reply.request_id]
        if got != serial:
            req = c.requests[reply.request_id]
            raise AssertionError(
                f"seed {c.seed}: the reply to {req.operator}.{req.function}(key={req.key!r}) request "
                f"{reply.request_id} (epoch {reply.epoch}, tid {reply.tid}) differs from the serial "
                f"execution: {got[0]} {got[1]!r}, serially {serial[0]} {serial[1]!r}"
            )
    state = c.state()
    if state != serial_state:
        differ = sorted(k for k in state.keys() | serial_state.keys() if state.get(k) != serial_state.get(k))
        shown = ", ".join(f"{k}: {state.get(k)!r} (serially {serial_state.get(k)!r})" for k in differ[:5])
        raise AssertionError(f"seed {c.seed}: the final state differs from the serial execution at {shown}")
    if c.config.changelog_topic:
        # Changelog records leave after their epoch's replies: wait until they are all on the log.
        await asyncio.wait_for(asyncio.gather(*(w.ports.egress.flush() for w in c.workers)), CLIENT_TIMEOUT_S)
        check_changelog(c.seed, c.log.topics.get(c.config.changelog_topic, []), commits, c.graph_at, state)
    c.clients.check()
