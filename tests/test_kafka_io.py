"""The worker's Kafka adapters against the real broker: what recovery reads back of the egress log."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from styx_py.core.config import load_config
from styx_py.core.wire import NIL, Reply
from styx_py.io.kafka_logs import KafkaLogReader, sent_epoch
from styx_py.stack.services import TansuBroker, create_topics
from styx_py.worker.egress import KafkaSink

pytestmark = pytest.mark.services


def test_sent_epoch_reads_the_header() -> None:
    assert sent_epoch([("other", b"1"), ("styx-epoch", b"42")]) == 42
    assert sent_epoch([]) is None
    assert sent_epoch([("styx-epoch", b"x")]) is None


async def test_recovery_tells_replies_apart_by_the_epoch_that_sent_them(kafka: TansuBroker) -> None:
    """A resent request's reply equals the first one, epoch field included; only the header says
    which epoch sent it, and recovery keeps just the replies of the epochs it is going to replay."""
    suffix = uuid.uuid4().hex[:8]
    config = load_config({"egress_topic": f"out-{suffix}", "seqlog_topic": f"seq-{suffix}"}, env={})
    await create_topics(kafka.bootstrap, {config.egress_topic: 2, config.seqlog_topic: 1})
    first = Reply("r1", 7, 3, 0, "committed", NIL, None, None)
    other = Reply("r2", 9, 4, 1, "committed", NIL, None, None)
    sink = KafkaSink(kafka.bootstrap, config)
    await sink.start()
    drain = asyncio.create_task(sink.run())
    try:
        sink.send(0, first, 3)
        sink.send(1, other, 4)
        sink.send(0, first, 5)  # the same request resent, answered again by epoch 5
        assert sink.lanes.pending() == 3
        await asyncio.wait_for(sink.flush(), 30)  # what recovery waits for before reading the log
        assert not drain.done(), drain
        assert sink.offsets() == {0: 2, 1: 1}
        await asyncio.wait_for(sink.flush(), 1)  # nothing queued: at once
    finally:
        drain.cancel()
        await sink.stop()
    reader = KafkaLogReader(kafka.bootstrap, config)
    start = {0: 0, 1: 0}
    assert sorted(r.request_id for r in await reader.replies_from(start, -1)) == ["r1", "r1", "r2"]
    assert sorted(r.request_id for r in await reader.replies_from(start, 3)) == ["r1", "r2"]
    assert await reader.replies_from(start, 4) == [first]
    assert await reader.replies_from(start, 5) == []


async def test_flush_waits_for_what_was_queued_before_it_not_for_a_steady_stream(kafka: TansuBroker) -> None:
    """A snapshot is confirmed after a flush of the replies queued so far; under steady load the
    egress is never idle, so a flush that waited for idleness would hold snapshots up for good."""
    suffix = uuid.uuid4().hex[:8]
    config = load_config({"egress_topic": f"out-{suffix}", "seqlog_topic": f"seq-{suffix}"}, env={})
    await create_topics(kafka.bootstrap, {config.egress_topic: 1, config.seqlog_topic: 1})
    sink = KafkaSink(kafka.bootstrap, config)
    await sink.start()
    drain = asyncio.create_task(sink.run())

    async def feed() -> None:
        for i in range(50_000):
            sink.send(0, Reply(f"later-{i}", i, 2, 0, "committed", NIL, None, None), 2)
            await asyncio.sleep(0)  # yield to the drain: records keep arriving while batches fly

    try:
        for i in range(5):
            sink.send(0, Reply(f"first-{i}", i, 1, 0, "committed", NIL, None, None), 1)
        feeder = asyncio.create_task(feed())
        await asyncio.sleep(0)
        flush = sink.flush()
        done, _ = await asyncio.wait({flush, feeder}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        assert flush in done and not feeder.done(), "flush waited for records queued after it"
        assert sink.offsets()[0] >= 5
        feeder.cancel()
        assert not drain.done(), drain
    finally:
        drain.cancel()
        await sink.stop()
