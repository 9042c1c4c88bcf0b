"""The effect runner: a worker performs the external calls and fires the timers its partitions hold.

What is pending is committed state of the system operators (:mod:`styx_py.core.effects`): the intents
of ``styx.outbox`` and the timers of ``styx.timers``, in the partitions this worker owns. The store
tells the runner which of their keys a commit, a snapshot load or a hand-off wrote
(:attr:`~styx_worker.state.StateStore.touched`); a store that a recovery replaced is scanned whole. So
the runner of a partition moves with it, and after a recovery the new owner finds every intent still
pending and calls again under the same idempotency key.

An intent's call runs after its commit, never inside an epoch: bounded concurrency
(:data:`~styx_py.core.limits.EXTERNAL_CONCURRENCY`) and queue (:data:`~styx_py.core.limits.EXTERNAL_QUEUE`;
beyond it an intent waits in the state for a later scan), each attempt bounded in time, retries with
capped exponential backoff, then the failure is the outcome. The outcome goes to the ingress log as the
request ``styx.outbox.complete`` (its id derived from the outcome: a repeat is answered from the reply
table). A timer whose due time the runner's wall clock has passed is fired by the request
``styx.timers.fire``, stamped with that clock; the transaction decides on its sequenced time, and one
that finds it early leaves the timer, which is fired again later.

Writing one of these requests can fail (the broker refused or is gone: the sink's ``OSError``). That
never ends the worker: what the runner writes is made again from the state. A write is tried
:data:`~styx_py.core.limits.EXTERNAL_ATTEMPTS` times with the calls' capped backoff; a completion still
not written is forgotten, and its intent, still pending in the state, is called again under the same
idempotency key (the service answers from its ledger, so the same outcome gives the same completion
request id, de-duplicated if the first was stored after all); a timer's firing not written is fired
again :data:`~styx_py.core.limits.TIMER_REFIRE_S` later, as one found early is.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec

from styx_py.core.effectids import OUTBOX, SYSTEM_OPERATORS, TIMERS
from styx_py.core.effects import completion_request_id, fire_request_id
from styx_py.core.graph import Graph
from styx_py.core.limits import (
    EFFECT_POLL_S,
    EXTERNAL_ATTEMPTS,
    EXTERNAL_BACKOFF_MAX_S,
    EXTERNAL_BACKOFF_S,
    EXTERNAL_CONCURRENCY,
    EXTERNAL_QUEUE,
    EXTERNAL_TIMEOUT_S,
    MAX_LISTED_OWNERS,
    TIMER_REFIRE_S,
)
from styx_py.core.partitioning import partition_of
from styx_py.core.ports import Clock, RequestSink
from styx_py.core.wire import Reply, ReplyStatus, Request, decode_value, encode_value
from styx_worker.conflicts import EntityKey
from styx_worker.ports import WorkerPorts
from styx_worker.state import StateStore

__all__ = ["EffectRunner", "effect_runner", "settle_request"]

log = logging.getLogger("styx.effects")
WATCHED = frozenset(SYSTEM_OPERATORS)


def effect_runner(
    node_id: str,
    store: Callable[[], StateStore],
    graph: Callable[[], Graph | None],
    ports: WorkerPorts,
    spawn: Callable[[Coroutine[Any, Any, None]], None],
) -> EffectRunner | None:
    """The worker's runner, on its ports (None when they have no way to write requests)."""
    if ports.requests is None:
        return None
    return EffectRunner(node_id, store, graph, ports.requests, ports.clock, spawn, ports.wall)


def settle_request(completion: Request, failure: str) -> Request:
    """The completion that records ``completion``'s outcome without its continuation, which failed
    (``failure``: the failed reply's error): the same arguments and ``failure``, under a request id
    derived from ``completion``'s (the same failure, the same id)."""
    args = decode_value(completion.args)
    digest = hashlib.sha256(failure.encode()).hexdigest()[:16]
    return Request(
        f"{completion.request_id}-settle-{digest}",
        completion.operator,
        completion.function,
        completion.key,
        msgspec.Raw(encode_value([*args[:4], failure])),
        completion.ts_ms,
    )


AGAIN = "-again-"  # joins a refused completion's first request id and how often it was refused


def refusals_of(request_id: str) -> tuple[str, int]:
    """A completion's first request id and how often it was refused before (``<first id>-again-<n>``)."""
    head, sep, count = request_id.rpartition(AGAIN)
    return (head, int(count)) if sep and count.isdigit() else (request_id, 0)


def rewritten(completion: Request) -> Request:
    """``completion``, refused, to write again under a request id of its own: the reply table answers a
    request id it refused with that refusal for good (as a client's resend under the same id is), so the
    same id would be refused again however idle the cluster. The id counts up from the refused one's
    (:func:`refusals_of`), so a chain started again from the first id (its intent called again after a
    write failed) walks past the ids refused before instead of repeating one. Whichever copy commits
    first clears the intent; a later one finds it cleared and does nothing."""
    first, n = refusals_of(completion.request_id)
    return msgspec.structs.replace(completion, request_id=f"{first}{AGAIN}{n + 1}")


class EffectCounters(msgspec.Struct):
    calls_started: int = 0
    attempts: int = 0
    attempt_failures: int = 0
    calls_failed: int = 0  # outcomes that are failures (after the bounded attempts)
    completions_sent: int = 0
    timers_fired: int = 0  # fire requests sent (a timer found early is fired again)
    continuations_failed: int = 0  # completions whose continuation failed (then settled without it)
    writes_failed: int = 0  # attempts to write a completion or a firing that the sink failed
    completions_redriven: int = 0  # completions not written after every attempt: their intents called again


class EffectRunner:
    def __init__(
        self,
        node_id: str,
        store: Callable[[], StateStore],
        graph: Callable[[], Graph | None],
        sink: RequestSink,
        clock: Clock,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.spawn = spawn  # a child task of the worker (a failure ends it)
        self.node_id = node_id
        self._get_store = store
        self._get_graph = graph
        self.sink = sink
        self.clock = clock
        self.wall = wall
        self._store: StateStore | None = None
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(EXTERNAL_CONCURRENCY)
        self.calls: dict[str, EntityKey] = {}  # idempotency key -> its owner, while its call runs
        # Intents whose completion was written, by owner: key -> the place that recorded the intent.
        self.sent: dict[EntityKey, dict[str, str]] = {}
        self.deferred: set[EntityKey] = set()  # owners with intents beyond the queue
        self.completing: dict[str, Request] = {}  # completions written, by request id, until answered
        self.timers: dict[str, int] = {}  # timer id -> due (ms), known here
        self._due: list[tuple[int, str, EntityKey]] = []  # heap of (when to fire, timer id, owner)
        self.counters = EffectCounters()
        self.owned: dict[str, dict[EntityKey, int]] = {OUTBOX: {}, TIMERS: {}}  # pending, per owner

    # ---- what status and metrics read -----------------------------------------------------------
    def pending(self) -> tuple[int, int]:
        """(intents, timers) pending in the partitions this worker holds, as of its last scan."""
        return sum(self.owned[OUTBOX].values()), sum(self.owned[TIMERS].values())

    def summary(self) -> tuple[list[int], list[str]]:
        """What the heartbeat tells the coordinator: [intents pending, calls running, timers pending],
        and the entities (their system-operator keys, :func:`~styx_py.core.effectids.owner_of`) that
        have some pending, the first :data:`MAX_LISTED_OWNERS` in key order (the console lists them)."""
        calls, timers = self.pending()
        owners = sorted({str(key[1]) for counts in self.owned.values() for key in counts})
        return [calls, len(self.calls), timers], owners[:MAX_LISTED_OWNERS]

    # ---- the loop ------------------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            self._scan()
            self._fire_due()
            wait = EFFECT_POLL_S
            if self._due:  # at least 1 ms: a due time the clock's rounding keeps ahead must not spin
                wait = min(wait, max(0.001, self._due[0][0] / 1000 - self.wall()))
            self._wake.clear()
            try:
                async with asyncio.timeout(wait):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _attach(self) -> StateStore:
        store = self._get_store()
        if store is not self._store:  # a recovery installed another store: look at all of it
            self._store = store
            store.watched = WATCHED
            store.on_touched = self._wake.set
            store.touched.update(k for k, _ in store.items() if k[0] in WATCHED)
            store.touched.update(k for counts in self.owned.values() for k in counts)
        return store

    def _scan(self) -> None:
        store = self._attach()
        graph = self._get_graph()
        if graph is None or (not store.touched and not self.deferred):
            return
        touched, store.touched = store.touched | self.deferred, set()
        self.deferred = set()
        for key in touched:
            raw = store.get(key)
            pending: dict[str, Any] = {} if raw is None else decode_value(raw)
            if pending:
                self.owned[key[0]][key] = len(pending)
            else:
                self.owned[key[0]].pop(key, None)
            if key[0] == OUTBOX:
                self._intents(graph, key, pending)
            else:
                for timer, entry in pending.items():
                    if self.timers.get(timer) != entry[0]:
                        self.timers[timer] = entry[0]
                        heapq.heappush(self._due, (entry[0], timer, key))

    def _intents(self, graph: Graph, owner: EntityKey, intents: dict[str, Any]) -> None:
        sent = self.sent.get(owner, {})
        for call_id in [c for c in sent if c not in intents]:
            del sent[call_id]  # completed
        if not sent:
            self.sent.pop(owner, None)
        for call_id, (service, function, args, _, place) in intents.items():
            if call_id in self.calls or sent.get(call_id) == place:
                continue  # under way, or completed already (a later intent under the key is a new call)
            if len(self.calls) >= EXTERNAL_QUEUE:
                self.deferred.add(owner)
                continue
            self.counters.calls_started += 1
            self.calls[call_id] = owner
            self.spawn(self._call(graph, owner, call_id, place, service, function, args))

    async def _call(
        self,
        graph: Graph,
        owner: EntityKey,
        call_id: str,
        place: str,
        service: str,
        function: str,
        args: list[Any],
    ) -> None:
        try:
            ok, value, error = await self._attempts(graph, call_id, service, function, args)
            request = Request(
                completion_request_id(call_id + "@" + place, ok, value),
                OUTBOX,
                "complete",
                owner[1],
                msgspec.Raw(encode_value([call_id, ok, value, error])),
                int(self.wall() * 1000),
            )
            self.completing[request.request_id] = request
            if await self._write(partition_of(owner[1], graph.operators[OUTBOX].partitions), request):
                self.counters.completions_sent += 1
                self.sent.setdefault(owner, {})[call_id] = place
            else:
                self._redrive(request)
        except asyncio.CancelledError:  # a recovery cancelled it: called again, from the state
            self.deferred.add(owner)
            raise
        finally:
            self.calls.pop(call_id, None)

    async def _attempts(
        self, graph: Graph, call_id: str, service: str, function: str, args: list[Any]
    ) -> tuple[bool, Any, str]:
        """(ok, response, error) of the call after at most :data:`EXTERNAL_ATTEMPTS` attempts."""
        handler = graph.services.get(service)
        if handler is None:
            self.counters.calls_failed += 1
            return False, None, f"UnknownService: no external service {service!r} in the graph"
        backoff = EXTERNAL_BACKOFF_S
        error = ""
        for attempt in range(EXTERNAL_ATTEMPTS):
            if attempt:
                await self.clock.sleep(backoff)
                backoff = min(2 * backoff, EXTERNAL_BACKOFF_MAX_S)
            self.counters.attempts += 1
            async with self._slots:
                try:
                    async with asyncio.timeout(EXTERNAL_TIMEOUT_S):
                        value = await handler(function, list(args), call_id)
                    encode_value(value)
                    return True, value, ""
                except TimeoutError:
                    error = f"Timeout: no answer within {EXTERNAL_TIMEOUT_S} s"
                except Exception as exc:  # noqa: BLE001 - the service's failure is the call's outcome, by design
                    error = f"{type(exc).__name__}: {exc}"
            self.counters.attempt_failures += 1
            log.info("%s: external call %s attempt %d failed: %s", self.node_id, call_id, attempt + 1, error)
        self.counters.calls_failed += 1
        return False, None, error

    # ---- the answers to completions -------------------------------------------------------------------
    def replied(self, reply: Reply) -> None:
        """A reply this worker sent: if it answers a completion it wrote, that completion is done, unless
        refused (overload: written again under another request id, :func:`rewritten`, after a pause
        that doubles at each refusal of it, up to :data:`EXTERNAL_BACKOFF_MAX_S`: a fixed short pause
        would rewrite every waiting completion many times a second into the overloaded cluster) or
        failed: its continuation failed (raised, aborted, an unknown target). Then the outcome is
        recorded all the same, by a completion that clears the intent without the continuation
        (:func:`settle_request`), so the intent is neither called again nor left pending; the
        continuation's error is its reply's."""
        request = self.completing.pop(reply.request_id, None)
        if request is None or reply.status == ReplyStatus.COMMITTED:
            return
        graph = self._get_graph()
        if graph is None:
            return
        partition = partition_of(request.key, graph.operators[OUTBOX].partitions)
        if reply.status == ReplyStatus.REFUSED:
            again = rewritten(request)
            self.completing[again.request_id] = again
            pause = min(EXTERNAL_BACKOFF_S * 2 ** refusals_of(request.request_id)[1], EXTERNAL_BACKOFF_MAX_S)
            self.spawn(self._complete(partition, again, pause))
            return
        if len(decode_value(request.args)) > 4:
            return  # a settling completion failed: nothing runs in it that could (left to a recovery)
        self.counters.continuations_failed += 1
        log.info("%s: the continuation of %s failed: %s", self.node_id, request.request_id, reply.error)
        settle = settle_request(request, reply.error or str(reply.status))
        self.completing[settle.request_id] = settle  # written again if refused
        self.spawn(self._complete(partition, settle))

    # ---- timers ------------------------------------------------------------------------------------
    def _fire_due(self) -> None:
        graph = self._get_graph()
        if graph is None or self._store is None:
            return
        now_ms = int(self.wall() * 1000)
        while self._due and self._due[0][0] <= now_ms:
            when, timer, owner = heapq.heappop(self._due)
            raw = self._store.get(owner)
            entry = None if raw is None else decode_value(raw).get(timer)
            if entry is None:  # fired, cancelled, or its partition moved away
                self.timers.pop(timer, None)
                continue
            request = Request(
                fire_request_id(timer, now_ms),
                TIMERS,
                "fire",
                owner[1],
                msgspec.Raw(encode_value([timer])),
                now_ms,
            )
            partition = partition_of(owner[1], graph.operators[TIMERS].partitions)
            self.counters.timers_fired += 1
            self.spawn(self._fire(partition, request))
            # Still there later (found early, or its request still on the way): fire it again then.
            heapq.heappush(self._due, (max(when, now_ms) + int(TIMER_REFIRE_S * 1000), timer, owner))

    # ---- writing the runner's requests -----------------------------------------------------------------
    async def _complete(self, partition: int, completion: Request, after_s: float = 0.0) -> None:
        """Write ``completion`` again (refused, or a settling one), after ``after_s``."""
        if after_s:
            await self.clock.sleep(after_s)
        if not await self._write(partition, completion):
            self._redrive(completion)

    async def _fire(self, partition: int, firing: Request) -> None:
        await self._write(partition, firing)  # not written: the timer is fired again later (_fire_due)

    async def _write(self, partition: int, request: Request) -> bool:
        """Write ``request`` to ingress ``partition``, in at most :data:`EXTERNAL_ATTEMPTS` attempts with
        capped exponential backoff (module docstring); whether it was written."""
        backoff = EXTERNAL_BACKOFF_S
        for attempt in range(EXTERNAL_ATTEMPTS):
            if attempt:
                await self.clock.sleep(backoff)
                backoff = min(2 * backoff, EXTERNAL_BACKOFF_MAX_S)
            try:
                await self.sink.submit(partition, request)
                return True
            except OSError as exc:  # the broker refused or is gone (BackendError): an operating error
                self.counters.writes_failed += 1
                log.warning(
                    "%s: writing %s failed (attempt %d of %d): %s",
                    self.node_id,
                    request.request_id,
                    attempt + 1,
                    EXTERNAL_ATTEMPTS,
                    exc,
                )
        return False

    def _redrive(self, completion: Request) -> None:
        """``completion`` could not be written: forget that it was, so that the next scan calls its
        intent, still pending in the state, again under the same idempotency key."""
        self.counters.completions_redriven += 1
        self.completing.pop(completion.request_id, None)
        owner: EntityKey = (OUTBOX, completion.key)
        call_id = decode_value(completion.args)[0]
        sent = self.sent.get(owner)
        if sent is not None:
            sent.pop(call_id, None)
            if not sent:
                del self.sent[owner]
        self.deferred.add(owner)
        self._wake.set()
