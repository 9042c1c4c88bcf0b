"""What a :class:`~styx_py.io.tcp.TcpTransport` keeps per connection, and the limits it enforces.

- :class:`TransportLimits`: timeouts (from the configuration) and byte/connection bounds
  (``styx_py.core.limits``).
- :class:`Link`: one authenticated connection, its peer and where it is in its current frame; the
  transport's watchdog closes it when a started frame does not complete within ``frame_timeout_s`` or
  no frame arrives within ``idle_timeout_s``.
- :class:`InboundBudget`: the bytes of incomplete frames the process holds, across connections. A
  connection reserves its frame's announced length before reading it and waits (not reading, so the
  rest stays in the kernel and the sender) while the budget is spent.
- :func:`read_payload` reads a frame's bytes into one buffer of its size; :func:`refusal_of` tells a
  frame of another channel from garbage.
- :class:`Refusals`: counts of refused connections by reason, logged at WARNING with the peer's
  address at most once per ``log_interval_s``; exported by :class:`ConnectionCollector`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

import msgspec
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from styx_py.core.errors import ProtocolError
from styx_py.core.limits import (
    HANDSHAKE_TIMEOUT_S,
    MAX_CONNECTIONS,
    MAX_FRAME_BYTES,
    MAX_INBOUND_BYTES,
    SMALL_FRAME_BYTES,
)
from styx_py.core.ports import Clock
from styx_py.core.wire import UNDECODABLE, Batch, Message
from styx_py.io.handshake import Refused

if TYPE_CHECKING:
    from styx_py.core.config import Config

__all__ = [
    "ConnectionCollector",
    "InboundBudget",
    "Link",
    "Refusals",
    "Stage",
    "TransportLimits",
    "read_payload",
    "refusal_of",
]

log = logging.getLogger("styx.transport")

REFUSAL_REASONS = (
    "unauthenticated",  # no Hello, a wrong proof of the secret, or a large frame before authenticating
    "handshake_timeout",
    "tls",  # TLS required: a plain peer, or a certificate the cluster's CA did not sign
    "too_many_connections",
    "oversized_frame",  # announced more than MAX_FRAME_BYTES
    "undecodable",
    "wrong_channel",  # a valid message of another channel (e.g. a worker's message to a worker port)
    "spoofed_source",  # a frame whose src is not the node the connection authenticated as
    "frame_timeout",
)


@dataclass(frozen=True)
class TransportLimits:
    idle_timeout_s: float = 60.0
    frame_timeout_s: float = 30.0
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S
    inbound_bytes: int = MAX_INBOUND_BYTES
    connections: int = MAX_CONNECTIONS

    def __post_init__(self) -> None:
        assert self.inbound_bytes >= MAX_FRAME_BYTES, "the budget must fit the largest frame"
        assert min(self.idle_timeout_s, self.frame_timeout_s, self.handshake_timeout_s) > 0

    @classmethod
    def from_config(cls, config: Config) -> TransportLimits:
        return cls(idle_timeout_s=config.connection_idle_timeout_s, frame_timeout_s=config.frame_timeout_s)

    @property
    def keepalive_s(self) -> float:
        """Each side sends an empty frame this often, so a live link is never idle."""
        return self.idle_timeout_s / 3

    @property
    def tick_s(self) -> float:
        """How often the watchdog looks: a timeout fires within this much of its deadline."""
        return min(self.keepalive_s, self.frame_timeout_s) / 4


class Stage(Enum):
    BETWEEN = "between"  # waiting for the next frame's header (idle timeout)
    WAITING = "waiting"  # its header read, waiting for budget (no timeout: bounded by the others')
    READING = "reading"  # reading its frame's payload (frame timeout)


class Link:
    """One authenticated TCP connection."""

    __slots__ = ("address", "last_keepalive", "peer", "since", "stage", "writer")

    def __init__(self, writer: asyncio.StreamWriter, peer: str, address: str, now: float) -> None:
        self.writer = writer
        self.peer = peer
        self.address = address
        self.stage = Stage.BETWEEN
        self.since = now  # when the current stage began
        self.last_keepalive = now

    def overdue(self, now: float, limits: TransportLimits) -> str:
        """Why the watchdog must close this link now ("" when it need not)."""
        if self.stage is Stage.READING and now - self.since > limits.frame_timeout_s:
            return "frame_timeout"
        if self.stage is Stage.BETWEEN and now - self.since > limits.idle_timeout_s:
            return "idle_timeout"
        return ""

    def abort(self) -> None:
        transport = self.writer.transport
        if not transport.is_closing():
            transport.abort()


# ---- reading one frame ------------------------------------------------------------------------------------

_PIECE_BYTES = 1024 * 1024


async def _read_large(reader: asyncio.StreamReader, n: int) -> bytes:
    frame = bytearray(n)
    with memoryview(frame) as view:
        got = 0
        while got < n:
            piece = await reader.read(min(n - got, _PIECE_BYTES))
            if not piece:
                raise asyncio.IncompleteReadError(b"", n)
            view[got : got + len(piece)] = piece
            got += len(piece)
    return bytes(frame)  # one copy, when the frame is complete: decoding and delivery follow at once


async def read_payload(reader: asyncio.StreamReader, n: int) -> bytes:
    """The ``n`` bytes of a frame whose header was read (its budget reserved)."""
    return await (reader.readexactly(n) if n <= SMALL_FRAME_BYTES else _read_large(reader, n))


_ANY_CHANNEL = msgspec.msgpack.Decoder(Batch[Message])  # tells a wrong-channel frame from garbage


def refusal_of(payload: bytes, exc: ProtocolError) -> Refused:
    """Why a frame that does not decode on this endpoint's channel is refused."""
    try:
        _ANY_CHANNEL.decode(payload)
    except UNDECODABLE:
        return Refused("undecodable", str(exc))
    return Refused("wrong_channel", str(exc))


class InboundBudget:
    """Bytes of incomplete frames held by one process; reservations are granted first come, first served."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    def try_take(self, n: int) -> bool:
        if not self._waiters and self.used + n <= self.limit:
            self.used += n
            return True
        return False

    async def take(self, n: int) -> None:
        assert n <= self.limit, f"a {n}-byte reservation can never fit a {self.limit}-byte budget"
        entry = (n, asyncio.get_running_loop().create_future())
        self._waiters.append(entry)
        try:
            await entry[1]
        except BaseException:
            if entry in self._waiters:
                self._waiters.remove(entry)
            elif entry[1].done() and not entry[1].cancelled():
                self.give(n)  # granted, then cancelled before it could read: hand it on
            raise

    def give(self, n: int) -> None:
        self.used -= n
        assert self.used >= 0
        while self._waiters and self.used + self._waiters[0][0] <= self.limit:
            size, granted = self._waiters.popleft()
            if not granted.done():
                self.used += size
                granted.set_result(None)

    @property
    def waiting(self) -> int:
        return len(self._waiters)


class Refusals:
    """Refused connections by reason; each logged at WARNING with its peer, rate-limited."""

    def __init__(self, node_id: str, clock: Clock, log_interval_s: float = 1.0) -> None:
        self.node_id = node_id
        self.clock = clock
        self.log_interval_s = log_interval_s
        self.counts: dict[str, int] = dict.fromkeys(REFUSAL_REASONS, 0)
        self.idle_closed = 0
        self._next_log = -float("inf")
        self._unlogged = 0

    def add(self, reason: str, address: str, detail: str) -> None:
        assert reason in self.counts, reason
        self.counts[reason] += 1
        now = self.clock.now()
        if now < self._next_log:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more refused since the last report)" if self._unlogged else ""
        log.warning(
            "%s: refused the connection from %s: %s: %s%s", self.node_id, address, reason, detail, more
        )
        self._next_log, self._unlogged = now + self.log_interval_s, 0


class ConnectionCollector:
    """Prometheus view of a transport's connections (read at scrape time, nothing on the data path)."""

    def __init__(
        self, prefix: str, refusals: Refusals, links: dict[asyncio.StreamWriter, Link], budget: InboundBudget
    ) -> None:
        self.prefix = prefix
        self.refusals = refusals
        self.links = links
        self.budget = budget

    def collect(self) -> Iterator[Metric]:
        p = self.prefix
        refused = CounterMetricFamily(
            f"{p}_connections_refused",
            "Connections to this process's port closed for breaking the protocol, by reason",
            labels=["reason"],
        )
        for reason, count in self.refusals.counts.items():
            refused.add_metric([reason], count)
        yield refused
        yield CounterMetricFamily(
            f"{p}_connections_idle_closed",
            "Connections closed after the idle timeout (no frame, not even a keepalive)",
            value=self.refusals.idle_closed,
        )
        yield GaugeMetricFamily(f"{p}_connections", "Open authenticated connections", value=len(self.links))
        yield GaugeMetricFamily(
            f"{p}_inbound_reserved_bytes",
            "Bytes reserved for incomplete inbound frames (bounded by MAX_INBOUND_BYTES)",
            value=self.budget.used,
        )
        yield GaugeMetricFamily(
            f"{p}_inbound_waiting_frames",
            "Inbound frames waiting for the inbound byte budget",
            value=self.budget.waiting,
        )
