"""Creating Kafka topics (the coordinator at deploy, the local stack's readiness probe, tests)."""

from __future__ import annotations

from aiokafka.admin import (  # type: ignore[import-untyped,unused-ignore]
    AIOKafkaAdminClient,
    NewTopic,
)
from aiokafka.errors import (  # type: ignore[import-untyped,unused-ignore]
    TopicAlreadyExistsError,
    for_code,
)

__all__ = ["create_topics"]


async def create_topics(
    bootstrap: str, topics: dict[str, int], *, request_timeout_ms: int = 10000, replication_factor: int = 1
) -> None:
    """Create topics (name -> partition count) with ``replication_factor``; existing ones are left alone.

    An existing topic is not an error so that start-up code can call this every time.
    Other per-topic errors are raised as the matching aiokafka error.
    """
    if not topics:
        return
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=request_timeout_ms)
    await admin.start()
    try:
        response = await admin.create_topics(
            [
                NewTopic(name, num_partitions=n, replication_factor=replication_factor)
                for name, n in topics.items()
            ]
        )
    finally:
        await admin.close()
    for topic_error in response.topic_errors:
        topic, code = topic_error[0], topic_error[1]
        if code == 0 or code == TopicAlreadyExistsError.errno:
            continue
        message = topic_error[2] if len(topic_error) > 2 else None
        raise for_code(code)(f"CreateTopics {topic!r} failed: {message or code}")
