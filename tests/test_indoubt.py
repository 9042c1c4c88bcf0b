"""A producer made with ``no_blind_retries`` fails a batch whose produce is in doubt instead of sending
it again, and still retries one the broker said it did not store (styx_py.io.indoubt)."""

from __future__ import annotations

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
