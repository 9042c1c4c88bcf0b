"""The changelog's Kafka side on the real broker (Tansu): the worker's sink holds changelog records for
the next sequencer-log entry's produce request and flushes them with the replies; the recovery's reader
finds the last record of each partition (from the fetch's high watermark, not ``end_offsets()``)."""

from __future__ import annotations

import asyncio
import uuid

import msgspec
import pytest
from aiokafka import TopicPartition

from styx_py.core.changelog import ChangeRecord, change_decoder, entity_key
from styx_py.core.config import load_config
from styx_py.core.wire import Phase, SeqLogEntry, encode_value
from styx_py.io.kafka_logs import KafkaLogReader, read_to_end
from styx_py.stack.services import TansuBroker, create_topics
from styx_worker.egress import KafkaSink
from tests.service_fixtures import record_produces

pytestmark = pytest.mark.services


def _record(key: str, epoch: int, tid: int, index: int) -> ChangeRecord:
    return ChangeRecord(
        "acct", key, msgspec.Raw(encode_value(tid)), False, epoch, Phase.OPTIMISTIC, tid, index
    )


async def test_changelog_records_ride_with_the_log_entry_and_the_reader_finds_each_partitions_end(
    kafka: TansuBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    suffix = uuid.uuid4().hex[:8]
    config = load_config(
        {"egress_topic": f"out-{suffix}", "seqlog_topic": f"seq-{suffix}", "changelog_topic": f"cl-{suffix}"},
        env={},
    )
    topics = {config.egress_topic: 3, config.seqlog_topic: 1, config.changelog_topic: 3}
    await create_topics(kafka.bootstrap, topics)
    reader = KafkaLogReader(kafka.bootstrap, config)
    assert await reader.changelog_tail([0, 1, 2]) == {}, "an empty changelog has no end to skip to"

    sink = KafkaSink(kafka.bootstrap, config)
    await sink.start()
    drain = asyncio.create_task(sink.run())
    produced = record_produces(sink, monkeypatch)  # the topics of each produce request, in order
    first = [_record("a", 5, 11, 0), _record("b", 5, 11, 1), _record("c", 5, 14, 2)]
    later = [_record("z", 6, 20, 0)]
    try:
        sink.changes(0, first)
        sink.changes(2, later)
        assert sink.queued == 4 and sink.lanes.pending() == 0, "held for the next log entry"
        await asyncio.wait_for(sink.append(SeqLogEntry(7, "w1", 0, [], 1, 0)), 30)
        await asyncio.wait_for(sink.flush(), 30)
        assert produced == [{config.seqlog_topic, config.changelog_topic}], "one produce request for both"
        assert sink.changelog_records == 4
        assert not drain.done(), drain
    finally:
        drain.cancel()
        await sink.stop()

    assert await reader.changelog_tail([0, 1, 2]) == {0: (5, 2), 2: (6, 0)}
    assert await reader.changelog_tail([1]) == {}
    tps = {TopicPartition(config.changelog_topic, p): 0 for p in range(3)}
    stored = sorted(await read_to_end(kafka.bootstrap, tps), key=lambda r: (r.partition, r.offset))
    assert [(r.partition, change_decoder.decode(r.value)) for r in stored] == [
        *((0, r) for r in first),
        *((2, r) for r in later),
    ]
    assert [r.key for r in stored] == [entity_key("acct", k) for k in ("a", "b", "c", "z")]


async def test_a_topic_admin_creates_the_changelog_compacted(kafka: TansuBroker) -> None:
    """The coordinator's admin creates the changelog with cleanup.policy=compact (its latest record per
    key is the table; no time or size retention), the other topics with the broker's defaults."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    suffix = uuid.uuid4().hex[:8]
    changelog, egress = f"cl-{suffix}", f"out-{suffix}"
    await create_topics(
        kafka.bootstrap, {changelog: 2, egress: 2}, configs={changelog: {"cleanup.policy": "compact"}}
    )
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    try:
        [response] = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, t) for t in (changelog, egress)]
        )
    finally:
        await admin.close()
    policies = {
        res[3]: {entry[0]: entry[1] for entry in res[4]}.get("cleanup.policy") for res in response.resources
    }
    assert policies[changelog] == "compact"
    assert policies[egress] != "compact"


async def test_a_changelog_record_stored_below_an_acknowledged_one_is_a_lost_log(kafka: TansuBroker) -> None:
    """The sink's changelog watch (styx_worker.logwatch): records acknowledged up to offset 2 of a
    partition, then one stored at 0 (a broker that lost the topic and made it again) stop the worker."""
    suffix = uuid.uuid4().hex[:8]
    config = load_config({"changelog_topic": f"cl-{suffix}"}, env={})
    await create_topics(kafka.bootstrap, {config.changelog_topic: 2})
    sink = KafkaSink(kafka.bootstrap, config)
    lost: list[str] = []
    sink.change_watch.on_lost = lost.append
    await sink.start()
    drain = asyncio.create_task(sink.run())
    try:
        sink.changes(1, [_record("a", 3, 7, 0), _record("b", 3, 7, 1), _record("c", 3, 8, 2)])
        await sink.flush()
        assert lost == []
        sink._on_change_sent(1)(0, None)  # what the broker would say of the next record, had it lost them
        assert len(lost) == 1 and f"changelog cl-{suffix} partition 1" in lost[0], lost
        assert "acknowledged up to offset 2" in lost[0], lost
    finally:
        drain.cancel()
        await sink.stop()
