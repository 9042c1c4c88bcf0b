"""Kafka topics: creating them (the coordinator at deploy and for every log segment, the local stack's
readiness probe, tests) and asking which of some named topics exist (clients following segments).

Both avoid the metadata of *every* topic, whose cost grows with the broker's topic count: with log
segments (:mod:`styx_py.core.segments`) a broker gains a topic a second while requests flow, and at 1 000
topics one listing cost a client 60 ms of CPU and one fresh admin client's ``create_topics`` 80 ms
(aiokafka asks for every topic's metadata to find the controller).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from aiokafka.admin import (  # type: ignore[import-untyped,unused-ignore]
    AIOKafkaAdminClient,
    NewTopic,
)
from aiokafka.errors import (  # type: ignore[import-untyped,unused-ignore]
    IncompatibleBrokerVersion,
    KafkaConnectionError,
    KafkaError,
    TopicAlreadyExistsError,
    for_code,
)
from aiokafka.protocol.metadata import MetadataRequest  # type: ignore[import-untyped,unused-ignore]

from styx_py.core.errors import BackendError
from styx_py.core.security import PLAINTEXT, KafkaSecurity
from styx_py.io.tls import kafka_options

__all__ = ["TopicAdmin", "create_topics", "existing_topics"]

# An admin client that stays up asks for every topic's metadata once (to find the controller) and then
# again only when the controller moves or a connection breaks, not every five minutes.
_ADMIN_METADATA_MAX_AGE_MS = 24 * 3600 * 1000


class TopicAdmin:
    """One admin client kept for a process that creates topics again and again (the coordinator)."""

    def __init__(
        self,
        bootstrap: str,
        *,
        request_timeout_ms: int = 10000,
        replication_factor: int = 1,
        security: KafkaSecurity = PLAINTEXT,
        configs: dict[str, dict[str, str]] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.security = security
        self.request_timeout_ms = request_timeout_ms
        self.replication_factor = replication_factor
        # Topic name -> the configs it is created with (the changelog: cleanup.policy=compact).
        self.configs = configs or {}
        self._admin: Any = None
        self._lock = asyncio.Lock()

    async def create(self, topics: dict[str, int]) -> None:
        """Create topics (name -> partition count); existing ones are left alone (start-up code calls
        this every time). Any other per-topic error, or a broker that cannot be reached, is raised as a
        :class:`~styx_py.core.errors.BackendError` (its cause: the aiokafka error). A failed call drops
        the admin client: the next one starts a new one."""
        if not topics:
            return
        try:
            await self._create(topics)
        except KafkaError as exc:
            names = ", ".join(sorted(topics))
            raise BackendError(f"creating topics {names} failed: {type(exc).__name__}: {exc}") from exc

    async def _create(self, topics: dict[str, int]) -> None:
        async with self._lock:
            if self._admin is None:
                admin = AIOKafkaAdminClient(
                    bootstrap_servers=self.bootstrap,
                    request_timeout_ms=self.request_timeout_ms,
                    metadata_max_age_ms=_ADMIN_METADATA_MAX_AGE_MS,
                    **kafka_options(self.security),
                )
                await admin.start()
                self._admin = admin
            new = [
                NewTopic(
                    t,
                    num_partitions=n,
                    replication_factor=self.replication_factor,
                    topic_configs=self.configs.get(t, {}),
                )
                for t, n in topics.items()
            ]
            try:
                response = await self._admin.create_topics(new)
            except BaseException:
                await self._drop()
                raise
        _raise_errors(response)

    async def close(self) -> None:
        async with self._lock:
            await self._drop()

    async def _drop(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            await admin.close()


async def create_topics(
    bootstrap: str,
    topics: dict[str, int],
    *,
    request_timeout_ms: int = 10000,
    replication_factor: int = 1,
    security: KafkaSecurity = PLAINTEXT,
    configs: dict[str, dict[str, str]] | None = None,
) -> None:
    """Create topics once (a :class:`TopicAdmin` for this call alone)."""
    admin = TopicAdmin(
        bootstrap,
        request_timeout_ms=request_timeout_ms,
        replication_factor=replication_factor,
        security=security,
        configs=configs,
    )
    try:
        await admin.create(topics)
    finally:
        await admin.close()


def _raise_errors(response: Any) -> None:
    for topic_error in response.topic_errors:
        topic, code = topic_error[0], topic_error[1]
        if code == 0 or code == TopicAlreadyExistsError.errno:
            continue
        message = topic_error[2] if len(topic_error) > 2 else None
        raise for_code(code)(f"CreateTopics {topic!r} failed: {message or code}")


class _NamedMetadata(MetadataRequest):  # type: ignore[misc]
    """The metadata of the named topics alone, creating none: from version 4 the request says so
    (``allow_auto_topic_creation``); an older version would auto-create what it names, so it is refused
    before anything is sent."""

    def build(self, request_struct_class: Any) -> Any:
        if request_struct_class.API_VERSION < 4:
            raise IncompatibleBrokerVersion(
                "the broker's metadata requests would create the topics they name"
            )
        return super().build(request_struct_class)


async def existing_topics(client: Any, names: Iterable[str]) -> set[str]:
    """Which of ``names`` exist, asked of one broker through a started aiokafka client (a producer's
    ``client``) for those topics alone, so what it costs does not grow with the broker's other topics.
    A broker that cannot be asked without creating them (metadata version < 4) is asked for every
    topic instead. Raises a ``KafkaError`` if it cannot be reached."""
    wanted = list(dict.fromkeys(names))
    if not wanted:
        return set()
    node = client.get_random_node()
    if node is None:
        raise KafkaConnectionError("no broker known")
    try:
        response = await client.send(node, _NamedMetadata(wanted, allow_auto_topic_creation=False))
    except IncompatibleBrokerVersion:
        return set(wanted) & set((await client.fetch_all_metadata()).topics())
    # (error_code, name, ...) per topic; a topic still being created reports an error and counts as
    # missing until it is usable.
    return {t[1] for t in response.topics if t[0] == 0 and t[1] in wanted}
