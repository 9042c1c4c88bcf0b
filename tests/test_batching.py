"""BatchLanes against a small fake of the aiokafka producer (``create_batch`` / ``send_batch``).

Pins down: records keep their order per (topic, partition) lane and get consecutive offsets; a
batch holds at most ``max_bytes`` unless it is one record alone; a lane has one batch in flight and
what arrives meanwhile goes together in the next; ``flush()`` resolves exactly when every record
added before it is acknowledged or failed, whatever arrives after it; every record's ``on_done`` is
called exactly once, with the error when its batch fails; a failed produce is the owners' to handle,
anything else raised while sending also ends the drain.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiokafka.errors import KafkaConnectionError  # type: ignore[import-untyped,unused-ignore]
from hypothesis import given, settings
from hypothesis import strategies as st

from styx_py.io.batching import BatchLanes, Headers

Lane = tuple[str, int]


@dataclass
class Meta:
    offset: int
    timestamp_type: int = 0  # CreateTime: the records keep the timestamps they were added with


class FakeBuilder:
    """Like aiokafka's BatchBuilder: the first record always fits (unless over ``max_record``)."""

    def __init__(self, max_bytes: int, max_record: int, poison: bytes | None) -> None:
        self.max_bytes, self.max_record, self.poison = max_bytes, max_record, poison
        self.records: list[tuple[bytes | None, bytes, Headers]] = []
        self.timestamps: list[int] = []
        self.size = 0

    def append(self, *, timestamp: int, key: bytes | None, value: bytes, headers: Headers) -> Meta | None:
        if value == self.poison:
            raise TypeError("value of a type the record builder cannot encode")
        if len(value) > self.max_record or (self.records and self.size + len(value) > self.max_bytes):
            return None
        self.records.append((key, value, headers))
        self.timestamps.append(timestamp)
        self.size += len(value)
        return Meta(-1)


@dataclass
class Sent:
    lane: Lane
    records: list[tuple[bytes | None, bytes, Headers]]
    delivery: asyncio.Future[Meta]
    timestamps: list[int] = field(default_factory=list)


@dataclass
class FakeProducer:
    max_bytes: int = 10
    max_record: int = 1000
    poison: bytes | None = None
    refuse: list[BaseException] = field(default_factory=list)  # errors the next send_batch calls raise
    sent: list[Sent] = field(default_factory=list)
    offsets: dict[Lane, int] = field(default_factory=dict)
    client: FakeClient = field(default_factory=lambda: FakeClient())

    def create_batch(self) -> FakeBuilder:
        return FakeBuilder(self.max_bytes, self.max_record, self.poison)

    async def send_batch(self, builder: FakeBuilder, topic: str, *, partition: int) -> asyncio.Future[Meta]:
        if self.refuse:
            raise self.refuse.pop(0)
        delivery: asyncio.Future[Meta] = asyncio.get_running_loop().create_future()
        self.sent.append(Sent((topic, partition), builder.records, delivery, builder.timestamps))
        return delivery

    def in_flight(self, lane: Lane | None = None) -> list[Sent]:
        return [s for s in self.sent if not s.delivery.done() and lane in (None, s.lane)]

    def ack(self, sent: Sent) -> None:
        base = self.offsets.get(sent.lane, 0)
        self.offsets[sent.lane] = base + len(sent.records)
        sent.delivery.set_result(Meta(base))


@dataclass
class FakeClient:
    """aiokafka's client, as far as ``BatchLanes.retire`` uses it: the topics it keeps metadata of."""

    topics: list[str] = field(default_factory=list)

    def set_topics(self, topics: list[str]) -> None:
        self.topics = list(topics)


class Outcomes:
    """Every on_done call, by record name."""

    def __init__(self) -> None:
        self.calls: dict[str, list[tuple[int, BaseException | None]]] = {}

    def callback(self, name: str) -> Callable[[int, BaseException | None], None]:
        self.calls[name] = []
        return lambda offset, exc: self.calls[name].append((offset, exc))

    def done(self, name: str) -> bool:
        return bool(self.calls[name])


async def settle() -> None:
    """Let the drain task and the send tasks run until they wait on the fake broker."""
    for _ in range(20):
        await asyncio.sleep(0)


@asynccontextmanager
async def draining(producer: FakeProducer) -> AsyncIterator[BatchLanes]:
    lanes = BatchLanes(producer)
    async with asyncio.TaskGroup() as tg:
        drain = tg.create_task(lanes.run())
        yield lanes
        drain.cancel()


def add(lanes: BatchLanes, out: Outcomes, lane: Lane, name: str, size: int = 4) -> None:
    lanes.add(lane[0], lane[1], name.encode(), name.encode().ljust(size, b"."), out.callback(name))


A, B = ("t", 0), ("t", 1)


async def test_retiring_old_topics_keeps_every_lane_that_still_has_records() -> None:
    """A producer that moved on to a new segment forgets the old topics' lanes and narrows its
    metadata to the kept topics, but not while an old lane has records queued or in flight."""
    out = Outcomes()
    old, stuck, new = ("seg.1", 0), ("seg.2", 0), ("seg.3", 0)
    async with draining(FakeProducer()) as lanes:
        producer = lanes.producer
        add(lanes, out, old, "o")
        add(lanes, out, stuck, "s")
        await settle()
        producer.ack(producer.in_flight(old)[0])
        await settle()
        lanes.retire({new[0]})
        assert producer.client.topics == ["seg.2", "seg.3"]  # seg.2's record is in flight
        assert old not in lanes.added and stuck in lanes.added
        producer.ack(producer.in_flight(stuck)[0])
        await settle()
        assert out.done("s")
        lanes.retire({new[0]})
        assert producer.client.topics == ["seg.3"]
        assert lanes.added == {} and lanes.done == {}
        add(lanes, out, new, "n")  # the kept topic's lane works as before
        await settle()
        producer.ack(producer.in_flight(new)[0])
        await settle()
        assert out.calls["n"] == [(0, None)]


async def test_retiring_keeps_the_topics_that_other_lanes_on_the_producer_still_use() -> None:
    """Lanes that share a producer share its metadata: a topic a request lane still sends to stays in
    it while the reply lanes move on (a batch whose topic left the metadata finds no leader and, after
    the producer's request timeout, fails with NotLeaderForPartitionError)."""
    out = Outcomes()
    producer = FakeProducer()
    old, new = ("ingress.1", 0), ("ingress.2", 0)
    async with draining(producer) as replies:
        requests = BatchLanes(producer)
        async with asyncio.TaskGroup() as tg:
            drain = tg.create_task(requests.run())
            add(requests, out, old, "r")
            await settle()
            replies.retire({"egress.1", new[0]}, requests)
            assert producer.client.topics == ["egress.1", "ingress.1", "ingress.2"]  # r is in flight
            producer.ack(producer.in_flight(old)[0])
            await settle()
            assert out.calls["r"] == [(0, None)]
            replies.retire({"egress.1", new[0]}, requests)
            assert producer.client.topics == ["egress.1", "ingress.2"]
            assert requests.added == {} and requests.done == {}
            drain.cancel()


async def test_one_batch_in_flight_per_lane_within_the_size_limit() -> None:
    out = Outcomes()
    async with draining(FakeProducer(max_bytes=10)) as lanes:
        producer = lanes.producer
        for i in range(5):
            add(lanes, out, A, f"a{i}")  # 4 bytes each: two fit in 10
        add(lanes, out, A, "big", size=25)
        await settle()
        assert [[k for k, _, _ in s.records] for s in producer.sent] == [[b"a0", b"a1"]]
        add(lanes, out, A, "late")
        for expected in ([b"a2", b"a3"], [b"a4"], [b"big"], [b"late"]):
            producer.ack(producer.in_flight(A)[0])
            await settle()
            assert len(producer.in_flight(A)) == 1, "one batch at a time per lane"
            assert [k for k, _, _ in producer.in_flight(A)[0].records] == expected
        producer.ack(producer.in_flight(A)[0])
        await settle()
    assert [out.calls[n] for n in ["a0", "a1", "a2", "a3", "a4", "big", "late"]] == [
        [(i, None)] for i in range(7)
    ]
    assert (lanes.records_sent, lanes.batches_sent, lanes.pending()) == (7, 5, 0)


async def test_records_arriving_during_a_flight_go_together_next() -> None:
    out = Outcomes()
    async with draining(FakeProducer(max_bytes=100)) as lanes:
        producer = lanes.producer
        add(lanes, out, A, "r0")
        await settle()
        for name in ("r1", "r2", "r3"):
            add(lanes, out, A, name)
        add(lanes, out, B, "b0")
        await settle()
        assert [len(s.records) for s in producer.in_flight(A)] == [1], "r1..r3 wait for r0's ack"
        assert [len(s.records) for s in producer.in_flight(B)] == [1], "another lane does not wait"
        producer.ack(producer.in_flight(A)[0])
        await settle()
        assert [k for k, _, _ in producer.in_flight(A)[0].records] == [b"r1", b"r2", b"r3"]


async def test_the_lanes_know_when_the_broker_stamped_its_own_timestamps() -> None:
    """What the SDK checks before it pushes a request (styx_client.sdk.push): whether the broker kept
    the records' timestamps (CreateTime) or stamped its append time."""
    seen: list[tuple[str, bool]] = []
    async with draining(FakeProducer(max_bytes=100)) as lanes:
        producer = lanes.producer

        def note(name: str) -> Callable[[int, BaseException | None], None]:
            return lambda _offset, _exc: seen.append((name, lanes.log_append_time))

        lanes.add(*A, b"r0", b"v", note("r0"))
        await settle()
        producer.ack(producer.in_flight(A)[0])
        await settle()
        lanes.add(*A, b"r1", b"v", note("r1"))
        await settle()
        producer.in_flight(A)[0].delivery.set_result(Meta(1, timestamp_type=1))  # LogAppendTime
        await settle()
        assert seen == [("r0", False), ("r1", True)]


async def test_flush_waits_for_earlier_records_only_even_under_a_steady_stream() -> None:
    out = Outcomes()
    async with draining(FakeProducer(max_bytes=100)) as lanes:
        producer = lanes.producer
        assert lanes.flush().done(), "nothing queued: done at once"
        add(lanes, out, A, "a")
        add(lanes, out, B, "b")
        await settle()
        flushed = lanes.flush()
        for i in range(6):  # a new record on each lane before every ack: the lanes are never idle
            add(lanes, out, A, f"a{i}")
            add(lanes, out, B, f"b{i}")
            for sent in producer.in_flight():
                if sent.lane == (A if i % 2 == 0 else B):
                    producer.ack(sent)
            await settle()
            assert flushed.done() == (i >= 1), "done once a and b are acknowledged, not before"
        assert producer.in_flight(), "later records are still in flight"
        later = lanes.flush()
        producer.ack(producer.in_flight(A)[0])
        await settle()
        assert not later.done()
        producer.in_flight(B)[0].delivery.set_exception(OSError("broker gone"))
        await settle()
        assert not later.done(), "a5, added before the flush, is still in flight"
        for sent in producer.in_flight():
            producer.ack(sent)
        await settle()
        assert later.done() and later.exception() is None, "a failed record counts as finished"


async def test_a_failed_batch_reaches_every_on_done_and_the_lane_goes_on() -> None:
    out = Outcomes()
    refused = ConnectionError("send refused")
    async with draining(FakeProducer(max_bytes=8, refuse=[refused])) as lanes:
        producer = lanes.producer
        for name in ("x0", "x1", "x2", "x3", "x4"):
            add(lanes, out, A, name)
        await settle()
        assert [out.calls[n] for n in ("x0", "x1")] == [[(-1, refused)]] * 2
        broken = OSError("not leader")
        producer.in_flight(A)[0].delivery.set_exception(broken)  # x2, x3
        await settle()
        assert [out.calls[n] for n in ("x2", "x3")] == [[(-1, broken)]] * 2
        producer.ack(producer.in_flight(A)[0])
        await settle()
    assert out.calls["x4"] == [(0, None)]
    assert (lanes.records_sent, lanes.batches_sent) == (1, 1)


async def test_a_record_too_large_even_alone_fails_alone() -> None:
    out = Outcomes()
    async with draining(FakeProducer(max_bytes=8, max_record=6)) as lanes:
        for name, size in (("ok0", 4), ("huge", 7), ("ok1", 4)):
            add(lanes, out, A, name, size)
        await settle()
        while lanes.producer.in_flight():
            lanes.producer.ack(lanes.producer.in_flight()[0])
            await settle()
    [(offset, exc)] = out.calls["huge"]
    assert offset == -1 and isinstance(exc, ValueError)
    assert (out.calls["ok0"], out.calls["ok1"]) == ([(0, None)], [(1, None)])
    assert [len(s.records) for s in lanes.producer.sent] == [1, 1]


async def test_an_append_that_raises_fails_the_records_already_in_its_batch_and_ends_the_drain() -> None:
    """A builder that raises something other than a failed produce (a bug): every record's owner
    hears of it, and the drain raises it, for its task group to end, instead of carrying on."""
    out = Outcomes()
    lanes = BatchLanes(FakeProducer(max_bytes=100, poison=b"bad."))
    drain = asyncio.get_running_loop().create_task(lanes.run())
    for name in ("p0", "p1", "bad", "p2"):
        add(lanes, out, A, name)
    flushed = lanes.flush()
    await settle()
    for sent in lanes.producer.in_flight():
        lanes.producer.ack(sent)
    await settle()
    not_called = [n for n, calls in out.calls.items() if len(calls) != 1]
    assert not_called == [], f"on_done not called exactly once for {not_called}"
    assert flushed.done(), "flush waits forever for records nobody reports"
    assert drain.done() and isinstance(drain.exception(), TypeError), "the drain ran on after a bug"


async def test_a_failed_produce_is_the_owners_to_handle_and_the_drain_runs_on() -> None:
    out = Outcomes()
    async with draining(FakeProducer(refuse=[KafkaConnectionError("no broker")])) as lanes:
        add(lanes, out, A, "r0")
        await settle()
        add(lanes, out, A, "r1")
        await settle()
        lanes.producer.ack(lanes.producer.in_flight()[0])
        await settle()
        assert lanes.failure is None
    [(offset, exc)] = out.calls["r0"]
    assert offset == -1 and isinstance(exc, KafkaConnectionError)
    assert out.calls["r1"] == [(0, None)]


async def test_stopping_fails_the_batch_in_flight() -> None:
    out = Outcomes()
    async with draining(FakeProducer()) as lanes:
        add(lanes, out, A, "s0")
        await settle()
    await settle()  # the drain cancels its send tasks on the way out without waiting for them
    [(offset, exc)] = out.calls["s0"]
    assert offset == -1 and isinstance(exc, RuntimeError)


# ---- the whole contract, on random interleavings -------------------------------------------------

steps = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from([A, B, ("u", 0)]), st.integers(1, 12)),
        st.tuples(st.sampled_from(["ack", "fail"]), st.sampled_from([A, B, ("u", 0)]), st.just(0)),
        st.tuples(st.just("flush"), st.just(A), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(script=steps)
def test_order_once_only_and_flush_on_random_interleavings(script: list[tuple[str, Lane, int]]) -> None:
    async def scenario() -> None:
        out, producer = Outcomes(), FakeProducer(max_bytes=10)
        added: dict[Lane, list[str]] = {}
        flushes: list[tuple[asyncio.Future[None], list[str]]] = []
        async with draining(producer) as lanes:
            for n, (step, lane, size) in enumerate([*script, *[("drain", A, 0)] * 40]):
                if step == "add":
                    add(lanes, out, lane, f"r{n}", size)
                    added.setdefault(lane, []).append(f"r{n}")
                elif step == "flush":
                    flushes.append((lanes.flush(), [r for names in added.values() for r in names]))
                else:  # ack / fail the oldest batch in flight on ``lane`` (drain: on any lane)
                    flying = producer.in_flight(None if step == "drain" else lane)
                    if flying and step == "fail":
                        flying[0].delivery.set_exception(OSError("broker error"))
                    elif flying:
                        producer.ack(flying[0])
                await settle()
                assert all(len(producer.in_flight(ln)) <= 1 for ln in added)
                for flushed, before in flushes:
                    assert flushed.done() == all(out.done(r) for r in before)
            assert not producer.in_flight() and lanes.pending() == 0
        assert all(len(calls) == 1 for calls in out.calls.values()), "on_done exactly once per record"
        for lane, names in added.items():
            batches = [s.records for s in producer.sent if s.lane == lane]
            assert [k for batch in batches for k, _, _ in batch] == [r.encode() for r in names]
            assert all(len(b) == 1 or sum(len(v) for _, v, _ in b) <= 10 for b in batches)
            offsets = [out.calls[r][0][0] for r in names if out.calls[r][0][1] is None]
            assert offsets == list(range(len(offsets))), "acknowledged records: consecutive, in order"

    asyncio.run(scenario())


class Timers:
    """Stands in for ``loop.call_later``: records each linger, fired by the test."""

    def __init__(self) -> None:
        self.due: list[tuple[float, Callable[[], None]]] = []
        self.cancelled = 0

    def __call__(self, delay: float, callback: Callable[[], None]) -> Timers:
        self.due.append((delay, callback))
        return self

    def cancel(self) -> None:
        self.cancelled += 1

    def fire(self) -> None:
        due, self.due = self.due, []
        for _, callback in due:
            callback()


async def test_a_busy_lane_lingers_and_a_quiet_one_sends_at_once() -> None:
    """A lane whose last batch carried busy_records or more waits busy_linger_s before its next
    batch (records arriving meanwhile join it); after a smaller batch it sends at once; flush still
    completes; the linger is counted."""
    out = Outcomes()
    timers = Timers()
    producer = FakeProducer(max_bytes=1000)
    lanes = BatchLanes(producer, busy_linger_s=0.002, busy_records=3)
    lanes.call_later = timers
    async with asyncio.TaskGroup() as tg:
        drain = tg.create_task(lanes.run())
        add(lanes, out, A, "q0")  # quiet: one record
        await settle()
        add(lanes, out, A, "q1")
        producer.ack(producer.in_flight(A)[0])
        await settle()
        assert timers.due == [] and [k for k, _, _ in producer.in_flight(A)[0].records] == [b"q1"]
        for i in range(3):
            add(lanes, out, A, f"b{i}")
        producer.ack(producer.in_flight(A)[0])
        await settle()
        assert [k for k, _, _ in producer.in_flight(A)[0].records] == [b"b0", b"b1", b"b2"]
        producer.ack(producer.in_flight(A)[0])  # a batch of 3: busy
        await settle()
        assert [delay for delay, _ in timers.due] == [0.002]
        add(lanes, out, A, "late0")
        add(lanes, out, B, "other")  # another lane is not held
        add(lanes, out, A, "late1")
        flushed = lanes.flush()
        await settle()
        assert producer.in_flight(A) == [] and len(producer.in_flight(B)) == 1, "A lingers"
        timers.fire()
        await settle()
        assert [k for k, _, _ in producer.in_flight(A)[0].records] == [b"late0", b"late1"]
        for sent in producer.in_flight():
            producer.ack(sent)
        await settle()
        assert flushed.done() and timers.due == [], "a batch of 2 is quiet: no linger after it"
        for i in range(3):
            add(lanes, out, A, f"c{i}")
        await settle()
        producer.ack(producer.in_flight(A)[0])
        await settle()
        assert len(timers.due) == 1, "busy again"
        drain.cancel()
    assert timers.cancelled == 1 and lanes.lingering == {}, "closing cancels a linger in progress"
    assert (lanes.records_sent, lanes.batches_sent, lanes.lingered) == (11, 6, 2)
    assert all(len(calls) == 1 for calls in out.calls.values())


def test_busy_linger_settings_are_checked() -> None:
    for linger, records in ((-0.001, 4), (0.002, 0)):
        try:
            BatchLanes(FakeProducer(), busy_linger_s=linger, busy_records=records)
        except ValueError as exc:
            assert "busy_linger_s" in str(exc)
        else:
            raise AssertionError(f"accepted busy_linger_s={linger}, busy_records={records}")


async def test_a_record_is_stamped_when_it_is_added_not_when_its_batch_is_built() -> None:
    """As Kafka's producers do: a worker's reply record carries the time the reply was handed over (and
    pushed to its client), however long it waited for its lane's batch in flight."""
    out = Outcomes()
    now = [1_000_000_000]
    async with draining(FakeProducer(max_bytes=100)) as lanes:
        lanes.clock_ns = lambda: now[0]
        producer = lanes.producer
        add(lanes, out, A, "first")  # at 1 000 ms
        await settle()
        now[0] = 2_000_000_000
        add(lanes, out, A, "waited")  # at 2 000 ms, behind "first"
        now[0] = 3_000_000_000
        producer.ack(producer.in_flight(A)[0])  # its batch is built at 3 000 ms
        await settle()
        [second] = producer.in_flight(A)
        producer.ack(second)
        await settle()
    assert [s.timestamps for s in producer.sent] == [[1_000], [2_000]]


class Broker:
    """What the fake broker stores per lane, for ``BatchLanes.reread``: every batch acked, plus any
    stored without an answer (the broker died mid-request). Records the reads it was asked for."""

    def __init__(self, producer: FakeProducer) -> None:
        self.producer = producer
        self.log: dict[Lane, list[tuple[bytes | None, bytes]]] = {}
        self.reads: list[tuple[str, int, int]] = []

    def ack(self, sent: Sent) -> None:
        self.log.setdefault(sent.lane, []).extend((k, v) for k, v, _ in sent.records)
        self.producer.ack(sent)

    def stored_unanswered(self, sent: Sent, error: BaseException) -> None:
        self.log.setdefault(sent.lane, []).extend((k, v) for k, v, _ in sent.records)
        self.producer.offsets[sent.lane] = self.producer.offsets.get(sent.lane, 0) + len(sent.records)
        sent.delivery.set_exception(error)

    async def reread(self, topic: str, partition: int, start: int) -> list[tuple[int, bytes | None, bytes]]:
        self.reads.append((topic, partition, start))
        stored = self.log.get((topic, partition), [])
        return [(offset, k, v) for offset, (k, v) in enumerate(stored) if offset >= start]


async def test_a_batch_in_doubt_found_stored_is_done_at_its_offsets_and_not_sent_again() -> None:
    """The broker stored the batch and died before answering (the connection closed): the lane reads
    its partition back from the end of its last acknowledged batch and finds the records there."""
    out = Outcomes()
    async with draining(FakeProducer(max_bytes=100)) as lanes:
        broker = Broker(lanes.producer)
        lanes.reread = broker.reread
        add(lanes, out, A, "d0")
        await settle()
        broker.ack(lanes.producer.in_flight(A)[0])
        await settle()
        add(lanes, out, A, "d1")
        add(lanes, out, A, "d2")
        await settle()
        broker.stored_unanswered(lanes.producer.in_flight(A)[0], KafkaConnectionError("closed"))
        await settle()
        add(lanes, out, A, "d3")  # the lane goes on
        await settle()
        broker.ack(lanes.producer.in_flight(A)[0])
        await settle()
    assert broker.reads == [(A[0], A[1], 1)]
    assert [out.calls[n] for n in ("d0", "d1", "d2", "d3")] == [[(i, None)] for i in range(4)]
    assert [len(s.records) for s in lanes.producer.sent] == [1, 2, 1], "a stored batch was sent again"
    assert broker.log[A] == [(n.encode(), n.encode().ljust(4, b".")) for n in ("d0", "d1", "d2", "d3")]
    assert (lanes.found_in_doubt, lanes.resent_in_doubt) == (2, 0)


async def test_a_batch_in_doubt_not_stored_is_sent_again_once() -> None:
    from aiokafka.errors import RequestTimedOutError  # type: ignore[import-untyped,unused-ignore]

    out = Outcomes()
    async with draining(FakeProducer(max_bytes=100)) as lanes:
        broker = Broker(lanes.producer)
        lanes.reread = broker.reread
        add(lanes, out, A, "n0")
        add(lanes, out, A, "n1")
        await settle()
        lanes.producer.in_flight(A)[0].delivery.set_exception(RequestTimedOutError())  # nothing stored
        await settle()
        [again] = lanes.producer.in_flight(A)
        assert [k for k, _, _ in again.records] == [b"n0", b"n1"]
        broker.ack(again)
        await settle()
    assert broker.reads == [(A[0], A[1], 0)]
    assert (out.calls["n0"], out.calls["n1"]) == ([(0, None)], [(1, None)])
    assert (lanes.found_in_doubt, lanes.resent_in_doubt) == (0, 2)


async def test_a_batch_in_doubt_whose_read_back_fails_fails_like_a_produce() -> None:
    out = Outcomes()

    async def unreachable(topic: str, partition: int, start: int) -> list[tuple[int, bytes | None, bytes]]:
        raise KafkaConnectionError("still down")

    async with draining(FakeProducer(refuse=[KafkaConnectionError("closed")])) as lanes:
        lanes.reread = unreachable
        add(lanes, out, A, "f0")
        await settle()
        assert lanes.failure is None
    [(offset, exc)] = out.calls["f0"]
    assert offset == -1 and isinstance(exc, KafkaConnectionError) and "still down" in str(exc)


async def test_a_refused_produce_is_not_in_doubt() -> None:
    """An error that says the broker did not store the batch is the owners' as before, no read back."""
    out = Outcomes()
    async with draining(FakeProducer(refuse=[ConnectionError("refused")])) as lanes:
        broker = Broker(lanes.producer)
        lanes.reread = broker.reread
        add(lanes, out, A, "r0")
        await settle()
    assert broker.reads == []
    [(offset, exc)] = out.calls["r0"]
    assert offset == -1 and isinstance(exc, ConnectionError)
