"""What a client needs of the world: :class:`ClientTransport`, and what a transport tells the client.

A transport produces the client's records to the ingress log and reports the broker's verdict on each,
reads the client's reply partitions of the egress log, says which ingress segment is the newest, and
keeps the links to the workers' ports (pushed replies one way, pushed requests the other). It decides
nothing: every event goes to the client (:class:`TransportEvents`), whose core
(:mod:`styx_client.sdk.core`) decides.

Two implementations: :class:`~styx_client.sdk.kafka_transport.KafkaTransport` (aiokafka and the
workers' TCP ports) and ``styx_py.testing.client_transport.MemoryTransport`` (the in-memory log and
network of the simulation, which so runs the real :class:`~styx_client.sdk.StyxClient`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import NamedTuple, Protocol

from styx_client.sdk.config import ClientConfig
from styx_client.sdk.entry import Pending
from styx_client.sdk.resting import EgressRest
from styx_py.core.wire import Reply

__all__ = ["Batching", "ClientTransport", "Opened", "TransportEvents"]


class Batching(NamedTuple):
    """Requests acknowledged by the broker, the Kafka batches they went in, and how many of those
    batches waited for more requests first (busy linger)."""

    records: int
    batches: int
    lingered: int


class Opened(NamedTuple):
    """What a transport found when it opened."""

    reply_partition: int  # the egress partition read (-1: every one)
    segment: int  # the newest ingress segment


class TransportEvents(Protocol):
    """What a transport tells its client (the client feeds each event to its core)."""

    def acknowledged(self, entry: Pending, segment: int, offset: int) -> None:
        """The broker stored a write of ``entry`` to ``segment`` at ``offset``."""

    def undelivered(self, entry: Pending, exc: BaseException, unavailable: bool) -> None:
        """A write of ``entry`` failed (``unavailable``: the broker could not be reached or refused)."""

    def from_log(self, key: bytes | None, value: bytes | None) -> None:
        """An egress record of the client's reply partitions."""

    def pushed(self, reply: Reply) -> None:
        """A reply a worker pushed."""

    def marks(self, ends: list[tuple[int, int]]) -> None:
        """A worker's egress acknowledgements (:class:`~styx_py.core.wire.EgressAcked`)."""


class ClientTransport(Protocol):
    """The I/O of one client (module docstring). Nothing is sent before :meth:`open`."""

    async def open(
        self,
        config: ClientConfig,
        operators: Mapping[str, int],
        events: TransportEvents,
        rest: EgressRest | None,
        reply_to: str,
    ) -> Opened:
        """Connect; position the reader at the end of the client's reply partitions, so that every reply
        to a request sent afterwards lies ahead of it. ``rest`` (when the client lets its egress reader
        rest) says when the reader may skip; ``reply_to`` is the node id the client's requests name
        for pushed replies."""

    def start(self, group: asyncio.TaskGroup) -> None:
        """Start the background tasks (reader, sender, worker links) as children of ``group``, the
        client's: a failure of any fails the client."""

    def produce(self, segment: int, partition: int, key: bytes, value: bytes, entry: Pending) -> int:
        """Queue ``value`` for ``partition`` of ingress ``segment``; its timestamp (ms). The verdict comes
        as :meth:`TransportEvents.acknowledged` or :meth:`TransportEvents.undelivered`."""

    def push_request(self, entry: Pending, segment: int, offset: int) -> None:
        """Push the acknowledged ``entry`` to the worker reading its partition (if one can be reached)."""

    @property
    def pushes_healthy(self) -> bool:
        """Every worker known pushes replies to this client."""

    def ask_workers_soon(self) -> None:
        """Ask the coordinator for the workers again without waiting for the regular look."""

    async def newest_segment(self, known: int) -> int | None:
        """The newest ingress segment, ``known`` or later; None when the broker could not be asked (the
        client looks again at its next look)."""

    async def follow_egress(self, newest: int) -> bool:
        """Read the reply segments of ``newest`` (:func:`~styx_py.core.segments.reply_segments`) from
        now on: a new one from its start, one no longer needed until read to its end. False when the
        broker could not be asked (the client moves to ``newest`` only at a later look)."""

    def retire(self, keep: set[int]) -> None:
        """Write to the ingress segments ``keep`` only (earlier ones once nothing of theirs is in
        flight)."""

    def wall_ms(self) -> int:
        """The clock requests are stamped with (ms)."""

    @property
    def batching(self) -> Batching: ...

    @property
    def requests_pushed(self) -> int: ...

    async def close(self) -> None:
        """Stop the producer and the reader (the background tasks are cancelled already)."""
