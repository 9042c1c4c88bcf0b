"""The effect runner (styx_worker.outbox) when writing its own requests fails.

A completion's produce can fail (aiokafka's ``NotLeaderForPartitionError`` when a batch's topic left
the producer's metadata, a broker gone): the runner must survive it and deliver the outcome once, as
one request id, never with a second effect at the service.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec
import pytest
from aiokafka.errors import NotLeaderForPartitionError

from styx_py import Context, Graph, Operator
from styx_py.core.config import load_config
from styx_py.core.effectids import OUTBOX
from styx_py.core.errors import BackendError
from styx_py.core.limits import EXTERNAL_ATTEMPTS, EXTERNAL_BACKOFF_S
from styx_py.core.wire import Phase, Reply, ReplyStatus, Request, decode_value, encode_value
from styx_worker.conflicts import EntityKey
from styx_worker.egress import KafkaSink
from styx_worker.outbox import EffectRunner, refusals_of, rewritten, settle_request
from styx_worker.state import StateStore
from tests.test_batching import FakeProducer

op = Operator("thing", partitions=2)


@op.function
async def noop(ctx: Context) -> None:
    return None


class InstantClock:
    """Backoff pauses pass at once (the loop still turns); ``pauses`` are the ones asked for."""

    def __init__(self) -> None:
        self.pauses: list[float] = []

    def now(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        await asyncio.sleep(0)

    def timeout(self, seconds: float) -> Any:
        return asyncio.timeout(None)


class FlakySink:
    """A request sink whose first ``failures`` submits fail as KafkaSink's do when the producer fails
    the batch (a BackendError from aiokafka's error); the others are written."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.attempts = 0
        self.written: list[Request] = []
        self.failed: list[str] = []  # the request ids of the submits that failed
        self.wrote = asyncio.Event()

    def submit(self, partition: int, request: Request) -> asyncio.Future[None]:
        self.attempts += 1
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.failures > 0:
            self.failures -= 1
            self.failed.append(request.request_id)
            exc = NotLeaderForPartitionError()
            failed = BackendError(f"request {request.request_id} not written: {exc!r}")
            failed.__cause__ = exc
            done.set_exception(failed)
        else:
            self.written.append(request)
            self.wrote.set()
            done.set_result(None)
        return done


class Service:
    """A payment service with a ledger by idempotency key: a key's first call takes effect."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.ledger: dict[str, str] = {}

    async def __call__(self, function: str, args: list[Any], key: str) -> str:
        self.calls.append(key)
        return self.ledger.setdefault(key, f"receipt-{len(self.ledger)}")


OWNER: EntityKey = (OUTBOX, "thing/k1")


async def turns_until(done: Callable[[], bool], turns: int = 1000) -> None:
    """Let the loop turn until ``done()``, for at most ``turns`` turns (no clock involved)."""
    for _ in range(turns):
        if done():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not done after {turns} turns of the loop")


async def run_runner(failures: int) -> tuple[FlakySink, Service, EffectRunner]:
    """One intent pending in the store; the runner calls it and writes its completion through a sink
    that fails ``failures`` times; then the completion commits (the intent is cleared, the reply
    committed) and the runner goes on scanning."""
    service = Service()
    graph = Graph("g", [op], services={"pay": service})
    store = StateStore()
    store.apply({OWNER: encode_value({"c1": ["pay", "charge", ["u1", 5], None, "req1/0"]})})
    sink = FlakySink(failures)
    async with asyncio.TaskGroup() as tg:  # a task that raises fails the test, as it would end a worker

        def spawn(coro: Coroutine[Any, Any, None]) -> None:
            tg.create_task(coro)

        runner = EffectRunner("w1", lambda: store, lambda: graph, sink, InstantClock(), spawn, lambda: 1.0)
        loop = tg.create_task(runner.run())
        await sink.wrote.wait()
        await turns_until(lambda: not runner.calls)  # the call's task is over once its write returned
        # The completion commits: it clears the intent and is answered.
        store.apply({OWNER: None})
        nil = msgspec.Raw(encode_value(None))
        status = ReplyStatus.COMMITTED
        runner.replied(Reply(sink.written[0].request_id, 1, 1, Phase.OPTIMISTIC, status, nil, None, None))
        await turns_until(lambda: not runner.owned[OUTBOX])  # the runner scanned the cleared intent
        loop.cancel()
    return sink, service, runner


async def test_a_completion_whose_write_fails_once_is_written_again_and_delivered_once() -> None:
    sink, service, runner = await run_runner(failures=1)
    assert sink.attempts == 2
    assert len(sink.written) == 1, "the completion was delivered more than once"
    completion = sink.written[0]
    assert (completion.operator, completion.function, completion.key) == (OUTBOX, "complete", OWNER[1])
    call_id, ok, value, _ = decode_value(completion.args)
    assert (call_id, ok, value) == ("c1", True, "receipt-0")
    assert service.calls == ["c1"], "the service was called again for a completion it had answered"
    assert runner.counters.writes_failed == 1 and runner.counters.completions_redriven == 0
    assert not runner.completing and not runner.calls


async def test_a_completion_never_written_calls_again_under_the_same_key_with_the_same_request_id() -> None:
    """Every attempt failed: the outcome is forgotten and the intent, still pending, is called again
    under its idempotency key; the service answers from its ledger, so the completion written has the
    request id the first one had (a first one stored after all is de-duplicated)."""
    sink, service, runner = await run_runner(failures=EXTERNAL_ATTEMPTS)
    assert sink.attempts == EXTERNAL_ATTEMPTS + 1
    assert len(sink.written) == 1
    assert service.calls == ["c1", "c1"] and len(service.ledger) == 1, "one key, one effect"
    assert runner.counters.completions_redriven == 1
    assert runner.counters.writes_failed == EXTERNAL_ATTEMPTS
    assert decode_value(sink.written[0].args)[:3] == ["c1", True, "receipt-0"]
    assert set(sink.failed) == {sink.written[0].request_id}


async def test_a_request_the_producer_fails_fails_its_submit_not_the_worker() -> None:
    """KafkaSink: a failed produce of one of the worker's own requests fails that submit with a
    BackendError (its cause aiokafka's error); the sink's failure, which ends the worker, is not set."""
    sink = KafkaSink("127.0.0.1:1", load_config({}, env={}))  # never started: the lanes get a fake
    sink.request_lanes.producer = FakeProducer(refuse=[NotLeaderForPartitionError()])
    async with asyncio.TaskGroup() as tg:
        drain = tg.create_task(sink.request_lanes.run())
        request = Request("r1", OUTBOX, "complete", "k", msgspec.Raw(encode_value(["c1", True, 1, ""])), 0)
        with pytest.raises(BackendError) as failed:
            await sink.submit(0, request)
        assert isinstance(failed.value.__cause__, NotLeaderForPartitionError)
        assert not sink.failed.is_set() and sink.error is None
        drain.cancel()
    await sink.producer.stop()


async def test_a_refused_completion_is_written_again_under_another_request_id_until_one_commits() -> None:
    """The reply table answers a refused request id with its refusal for good, so a completion written
    again under its own id would be refused however idle the cluster: each rewrite has an id of its own
    (the first id and the count of refusals), and the completion is done once one of them commits."""
    service = Service()
    graph = Graph("g", [op], services={"pay": service})
    store = StateStore()
    store.apply({OWNER: encode_value({"c1": ["pay", "charge", ["u1", 5], None, "req1/0"]})})
    sink = FlakySink(0)
    clock = InstantClock()
    nil = msgspec.Raw(encode_value(None))

    def answer(status: str) -> None:
        runner.replied(Reply(sink.written[-1].request_id, 0, 1, Phase.OPTIMISTIC, status, nil, None, None))

    async with asyncio.TaskGroup() as tg:
        runner = EffectRunner("w1", lambda: store, lambda: graph, sink, clock, tg.create_task, lambda: 1.0)
        loop = tg.create_task(runner.run())
        await turns_until(lambda: len(sink.written) == 1)
        for written in (2, 3):
            answer(ReplyStatus.REFUSED)
            await turns_until(lambda written=written: len(sink.written) == written)
        store.apply({OWNER: None})
        answer(ReplyStatus.COMMITTED)
        await turns_until(lambda: not runner.owned[OUTBOX])
        loop.cancel()
    first = sink.written[0].request_id
    assert [r.request_id for r in sink.written] == [first, f"{first}-again-1", f"{first}-again-2"]
    assert len({bytes(r.args) for r in sink.written}) == 1, "the same outcome each time"
    assert service.calls == ["c1"] and not runner.completing
    settle = settle_request(sink.written[2], "Abort: no")
    assert rewritten(settle).request_id == f"{settle.request_id}-again-1"  # a settling one keeps its id
    # Started again from the first id (its intent called again), the chain walks past the refused ids.
    assert rewritten(rewritten(sink.written[0])).request_id == f"{first}-again-2"
    assert [refusals_of(r.request_id) for r in sink.written] == [(first, 0), (first, 1), (first, 2)]
    assert clock.pauses == [EXTERNAL_BACKOFF_S, 2 * EXTERNAL_BACKOFF_S], "the pause doubles at each refusal"
