"""The engine's I/O ports: small protocols every process codes against.

Each has a real implementation and an in-memory one for the simulation:

| port | real | in memory (``styx_py.testing.memory``) |
|---|---|---|
| :class:`Transport` | ``styx_py.io.tcp.TcpTransport`` | ``MemoryTransport`` |
| :class:`Ingress` | ``styx_worker.ingress.KafkaIngress`` | ``MemoryIngress`` |
| :class:`Egress`, :class:`SequencerLog` | ``styx_worker.egress.KafkaSink`` | ``MemoryEgress/SeqLog`` |
| :class:`LogReader` | ``styx_py.io.kafka_logs.KafkaLogReader`` | ``MemoryLogReader`` |
| :class:`LogGuard` | ``styx_py.io.logguard.KafkaLogGuard`` | none (the in-memory log loses nothing) |
| :class:`~styx_py.core.blobs.BlobStore` | ``styx_py.io.s3.MinioBlobStore`` | ``MemoryBlobStore`` |
| :class:`Clock` | :class:`LoopClock` | the same, on a virtual-time event loop |
| :class:`RequestSink` | ``styx_worker.egress.KafkaSink`` | ``SimCluster``'s clients |

Time: every timeout, heartbeat, lease and failure check of the engine reads an injected :class:`Clock`,
never ``time.monotonic()``. :class:`LoopClock` is the running event loop's clock; the simulation runs
its whole cluster on an event loop whose time is virtual (``styx_py.testing.sim``): it jumps ahead
whenever every task waits for a timer, so timeouts, heartbeats and failure detection happen in
simulated time, deterministically, and a test never sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from styx_py.core.changelog import ChangeRecord, Position
from styx_py.core.logmarks import LogMark
from styx_py.core.segments import Cursor
from styx_py.core.wire import IngressRecord, Message, PushedRequest, Reply, Request, SeqLogEntry

__all__ = [
    "Clock",
    "Egress",
    "Ingress",
    "LogGuard",
    "LogReader",
    "LoopClock",
    "RequestSink",
    "SequencerLog",
    "Transport",
]


class Transport(Protocol):
    node_id: str

    def send(self, dest: str, msg: Message) -> None: ...


class Ingress(Protocol):
    def assign(self, partitions: list[int]) -> None: ...

    def take(self, n: int) -> list[IngressRecord]: ...

    async def take_exact(self, partition: int, offset: int) -> IngressRecord:
        """The record at (packed) ``offset``, which must be the next one of ``partition`` in its
        segment (replay)."""
        ...

    def pending(self) -> int: ...

    def buffered(self) -> Iterator[IngressRecord]:
        """The records :meth:`take` would return next, without taking them (any order)."""
        ...

    def positions(self) -> dict[int, Cursor]:
        """Per assigned partition, the next offset to take in each segment read."""
        ...

    def seek(self, positions: dict[int, Cursor]) -> None: ...

    def live(self, segment: int) -> None:
        """``segment`` is the newest ingress segment: read the ones ``core.segments.live`` names."""
        ...

    def set_listener(self, on_available: Callable[[], None]) -> None: ...

    def offer(self, pushed: PushedRequest) -> None:
        """A record its client pushed once the broker acknowledged it (core/wire/push.py): taken as if
        fetched, in offset order, or left to the fetch."""
        ...


class Egress(Protocol):
    def send(self, partition: int, reply: Reply, epoch: int, pushed: bool = False) -> None:
        """Queue ``reply``, marked as sent by ``epoch`` (recovery reads the mark back). ``pushed``: its
        client has it already, so its copy on the log may wait a little (for company)."""
        ...

    def offsets(self) -> dict[int, int]:
        """Per egress partition, a packed offset (``core.segments``) below which every reply is
        acknowledged."""
        ...

    def live(self, newest: int) -> None:
        """``newest`` is the newest ingress segment: send to ``core.segments.replies_to(newest)``."""
        ...

    def reset_offsets(self, offsets: dict[int, int]) -> None: ...

    def changes(self, partition: int, records: list[ChangeRecord]) -> None:
        """Queue ``records`` for changelog ``partition`` (in order; :mod:`styx_py.core.changelog`)."""
        ...

    def flush(self) -> asyncio.Future[None]:
        """Done when every reply and changelog record sent before this call is on the log
        (acknowledged)."""
        ...


class RequestSink(Protocol):
    """Where a worker's own requests go (the outcomes of external calls, timers that are due): the
    ingress log, in its newest segment."""

    def submit(self, partition: int, request: Request) -> Awaitable[None]:
        """Done once ``request`` is durable on ingress ``partition``."""
        ...


class SequencerLog(Protocol):
    def append(self, entry: SeqLogEntry) -> asyncio.Future[None]:
        """Done once ``entry`` is durable; failed if it cannot be (the egress then ends the worker)."""
        ...

    def acked(self) -> int:
        """An offset below which every entry this worker appended is durable."""
        ...


class LogReader(Protocol):
    """What recovery reads back: replies already sent, the sequencer log, the changelog's end."""

    async def replies_from(self, offsets: dict[int, int], after_epoch: int) -> list[Reply]:
        """Replies on the egress log from ``offsets`` on, of those sent by epochs after ``after_epoch``."""
        ...

    async def seqlog(self, from_offset: int) -> list[SeqLogEntry]: ...

    async def changelog_tail(self, partitions: list[int]) -> dict[int, Position]:
        """The position of the last record of each changelog partition in ``partitions`` that has one."""
        ...


class LogGuard(Protocol):
    """Has the broker lost the cluster's log? (:mod:`styx_py.core.logmarks`)"""

    async def stamp(self) -> str:
        """Write a new incarnation marker for the cluster (at deploy); its cluster id."""
        ...

    async def lost(self, cluster_id: str, recorded: Sequence[LogMark]) -> list[str]:
        """What the broker lost of the marker of ``cluster_id`` and of the offsets ``recorded``, one
        line each (empty: nothing)."""
        ...


class Clock(Protocol):
    """Monotonic time in seconds, and waiting on it."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> Awaitable[None]: ...

    def timeout(self, seconds: float) -> AbstractAsyncContextManager[object]:
        """Like ``asyncio.timeout``: raises ``TimeoutError`` when the block runs longer."""
        ...


class LoopClock:
    """The running event loop's clock (monotonic; virtual on the simulation's loop)."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def sleep(self, seconds: float) -> Awaitable[None]:
        return asyncio.sleep(seconds)

    def timeout(self, seconds: float) -> asyncio.Timeout:
        return asyncio.timeout(seconds)
