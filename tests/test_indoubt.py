"""A producer made with ``no_blind_retries`` fails a batch whose produce is in doubt instead of sending
it again, and still retries one the broker said it did not store (styx_py.io.indoubt)."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (  # type: ignore[import-untyped,unused-ignore]
    KafkaConnectionError,
    NodeNotReadyError,
    NotLeaderForPartitionError,
    RequestTimedOutError,
)
from aiokafka.producer.sender import Sender  # type: ignore[import-untyped,unused-ignore]

from styx_py.io.indoubt import _Handler, no_blind_retries
from styx_py.io.kafka_admin import create_topics
from styx_py.io.kafka_logs import read_back
from styx_py.stack.services import TansuBroker


class Batch:
    def expired(self) -> bool:
        return False


async def test_a_produce_in_doubt_is_not_retried_and_a_refused_one_is() -> None:
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1")
    no_blind_retries(producer)
    assert isinstance(producer._sender, Sender)
    handler = _Handler(producer._sender, {})
    for doubt in (KafkaConnectionError("closed"), RequestTimedOutError()):
        assert not handler._can_retry(doubt, Batch()), doubt
    for refused in (NodeNotReadyError("not ready"), NotLeaderForPartitionError()):
        assert handler._can_retry(refused, Batch()), refused


async def test_an_idempotent_producer_is_refused() -> None:
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", enable_idempotence=True)
    with pytest.raises(TypeError):
        no_blind_retries(producer)


@pytest.mark.services
async def test_read_back_gives_what_the_partition_holds_from_an_offset(kafka: TansuBroker) -> None:
    """The read a lane settles a produce in doubt with, on the real broker: every record from the
    offset on, with its offset, key and value (and nothing from a partition that ends there)."""
    topic = f"doubt-{uuid.uuid4().hex[:8]}"
    await create_topics(kafka.bootstrap, {topic: 2})
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(5):
            await producer.send_and_wait(topic, f"v{i}".encode(), key=f"k{i}".encode(), partition=1)
    finally:
        await producer.stop()
    assert await read_back(kafka.bootstrap, topic, 1, 2) == [
        (i, f"k{i}".encode(), f"v{i}".encode()) for i in (2, 3, 4)
    ]
    assert await read_back(kafka.bootstrap, topic, 1, 5) == []
    assert await read_back(kafka.bootstrap, topic, 0, 0) == []
