"""The engine on real services: Tansu (Kafka protocol) + worker and coordinator processes.

≥ 10 000 bank transfers over 4 partitions on 2 worker processes, uniform and Zipf 0.99: every request
answered exactly once (checked on the egress topic itself), money conserved, balances equal the
serial replay in commit order, insufficient-credit aborts reported to the client.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition  # type: ignore[import-untyped]

from styx_benchmarks.bank import app as bank_app
from styx_benchmarks.keys import KeyChooser
from styx_client import StyxClient
from styx_py.core.errors import Overloaded
from styx_py.core.limits import REPLY_WAIT_FOR_LOG_ENTRY_S
from styx_py.core.segments import segment_topics
from styx_py.core.serial import reply_outcome, serial_replay
from styx_py.core.wire import Reply, Request, StatusRequest, encode_value, reply_decoder, request_decoder
from styx_py.stack.local import LocalStack, admin
from tests.service_fixtures import ClusterFactory

pytestmark = pytest.mark.services

T = TypeVar("T")

ACCOUNTS = 1000
INITIAL = 100


@pytest.fixture
def stack(local_cluster: ClusterFactory) -> LocalStack:
    # Admission on, as deployed: of 2 000 transfers in flight at once, those behind a hot account's
    # queue may be refused; a refusal runs nothing, and the checks take it so.
    return local_cluster(app="styx_benchmarks.bank:app")


async def read_until(
    read: Callable[[], Awaitable[T]], enough: Callable[[T], bool], deadline_s: float = 60.0
) -> T:
    """What ``read`` returns, read again until ``enough`` says so (or ``deadline_s`` went by: the
    caller's checks then say what is missing). For the egress log: a pushed reply's copy follows it
    there with its worker's next sequencer-log entry, or at most ``REPLY_WAIT_FOR_LOG_ENTRY_S`` later
    (styx_worker.egress), so a test that read the log the moment its client had every reply could miss
    the last ones."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while True:
        got = await read()
        if enough(got) or loop.time() > end:
            return got
        await asyncio.sleep(REPLY_WAIT_FOR_LOG_ENTRY_S)


async def read_replies(read: Callable[[], Awaitable[list[Reply]]], expect: Iterable[str]) -> list[Reply]:
    """The egress log as ``read`` returns it, once it holds a reply to every request id of ``expect``
    (:func:`read_until`)."""
    wanted = set(expect)
    return await read_until(read, lambda logged: wanted <= {r.request_id for r in logged})


async def read_topic(bootstrap: str, topic: str) -> list[Reply]:
    """Every reply of an egress topic and its segments (:func:`read_values`)."""
    return [reply_decoder.decode(value) for value in await read_values(bootstrap, topic)]


async def ingress_ids(bootstrap: str, topic: str) -> set[str]:
    """The request id of every record of an ingress topic and its segments (:func:`read_values`)."""
    return {request_decoder.decode(value).request_id for value in await read_values(bootstrap, topic)}


async def read_values(bootstrap: str, topic: str) -> list[bytes]:
    """The value of every record of a topic and its segments (core.segments), up to the fetch high
    watermark (end_offsets is wrong on Tansu)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, fetch_max_wait_ms=10
    )
    await consumer.start()
    try:
        names = segment_topics(await consumer.topics(), topic)  # also fetches the metadata of every topic
        parts = sorted(consumer.partitions_for_topic(topic) or ())
        assert parts, f"no partitions of {topic!r}"
        tps = [TopicPartition(name, p) for name in names for p in parts]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        out: list[bytes] = []
        done: set[TopicPartition] = set()
        while len(done) < len(tps):
            batches = await consumer.getmany(timeout_ms=200)
            for recs in batches.values():
                out.extend(r.value for r in recs)
            for tp in tps:
                hw = consumer.highwater(tp)
                if hw is not None and await consumer.position(tp) >= hw:
                    done.add(tp)
        return out
    finally:
        await consumer.stop()


async def run_transfers(stack: LocalStack, zipf: float, n: int, seed: int) -> None:
    keys = KeyChooser(ACCOUNTS, zipf=zipf, seed=seed)
    requests: dict[str, Request] = {}
    client_replies: dict[str, Reply] = {}
    # Every request is sent (none shed by the client's window); one the cluster refuses is answered.
    async with await StyxClient.connect(stack.coordinator, timeout_s=120, shed_when_refused=False) as client:

        async def submit(operator: str, key: str, function: str, *args: object) -> None:
            rid = uuid.uuid4().hex
            requests[rid] = Request(rid, operator, function, key, msgspec.Raw(encode_value(list(args))))
            try:
                client_replies[rid] = await client.submit(operator, key, function, *args, request_id=rid)
            except Overloaded as exc:  # refused by admission control: nothing ran
                assert isinstance(exc.reply, Reply), f"{rid} shed by the client"
                client_replies[rid] = exc.reply

        await asyncio.gather(*(submit("account", f"a{i}", "deposit", INITIAL) for i in range(ACCOUNTS)))
        window = asyncio.Semaphore(2000)

        async def transfer() -> None:
            a, b = keys.distinct(2)
            async with window:
                await submit("account", f"a{a}", "transfer", f"a{b}", keys.rng.randint(1, 60))

        await asyncio.gather(*(transfer() for _ in range(n)))
        balances = await asyncio.gather(
            *(client.call("account", f"a{i}", "balance") for i in range(ACCOUNTS))
        )

    assert sum(balances) == ACCOUNTS * INITIAL, "money not conserved"
    statuses = Counter(r.status for r in client_replies.values())
    assert statuses["aborted"] > 0, "expected some insufficient-credit aborts"
    assert statuses["failed"] == 0, statuses
    aborted = next(r for r in client_replies.values() if r.status == "aborted")
    assert aborted.error is not None and "insufficient credit" in aborted.error
    assert aborted.error_type == "Abort"

    # Exactly once, on the egress log itself: one reply per request, none unknown.
    logged = await read_replies(lambda: read_topic(stack.kafka, stack.env["STYX_EGRESS_TOPIC"]), requests)
    counts = Counter(r.request_id for r in logged)
    assert set(counts) >= set(requests), f"{len(set(requests) - set(counts))} requests never answered"
    logged_by_id: dict[str, list[Reply]] = {}
    for r in logged:
        logged_by_id.setdefault(r.request_id, []).append(r)
    dupes = [rid for rid, c in counts.items() if c > 1]
    assert not dupes, f"{len(dupes)} requests answered more than once"
    for rid, reply in client_replies.items():
        assert reply in logged_by_id[rid], "the client saw a reply that is not on the egress log"

    # Serial replay in commit order (epoch, phase, tid) gives the same replies and balances.
    by_id = {r.request_id: r for r in logged if r.request_id in requests}
    serial_state, outcomes = await serial_replay(bank_app, requests, by_id.values())
    for rid, reply in by_id.items():
        assert reply_outcome(reply) == outcomes[rid], rid
    expected = [serial_state.get(("account", f"a{i}"), 0) for i in range(ACCOUNTS)]
    assert balances == expected


async def test_10k_uniform_transfers(stack: LocalStack) -> None:
    await run_transfers(stack, zipf=0.0, n=10_000, seed=1)


async def test_10k_zipf_transfers(stack: LocalStack) -> None:
    await run_transfers(stack, zipf=0.99, n=10_000, seed=2)
    status = await admin(stack.coordinator, StatusRequest())
    assert status["totals"]["fallback"] > 0, "Zipf 0.99 should produce conflicts and fallback runs"
