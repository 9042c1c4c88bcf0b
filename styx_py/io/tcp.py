"""Length-prefixed msgspec frames over asyncio TCP, batched per destination, on authenticated connections.

``send`` never blocks: messages are appended to the destination's buffer and every buffer is
flushed once per event-loop tick as one frame (a :class:`~styx_py.core.wire.Batch`). Each sender uses one
connection per destination, so every channel is FIFO, which the epoch protocol relies on.
A peer is reached on the connection it opened to us or on one we dial from the addresses in the
cluster view.

Every connection first passes the handshake of :mod:`styx_py.io.handshake` (both sides prove the cluster
secret; the dialer's node id is the one it proved). With :class:`~styx_py.io.tls.Tls` given, a mutual TLS
handshake comes before it (a peer without TLS, or whose certificate the cluster's CA did not sign, is
refused and counted as ``tls``), and every byte after it is encrypted.

After the handshakes, a frame is refused, and its connection closed and counted
(:mod:`styx_py.io.links`), when it announces more than ``MAX_FRAME_BYTES``, does not decode on this
endpoint's channel, or names another ``src``; only that connection is affected. Memory is bounded:
frames wait for an :class:`~styx_py.io.links.InboundBudget` before they are read, and the watchdog
(:meth:`TcpTransport.run`) closes connections whose frame does not complete in time or that deliver
nothing for the idle timeout (each side sends a keepalive every third of it).

A message handler that raises is a bug with the process in an unknown state: the transport stops
delivering and :meth:`TcpTransport.run` raises :class:`HandlerFailed`, which ends the process. So does
anything else a connection's task raises but the connection failing (an ``OSError``, a peer gone
mid-frame): a bug in the transport itself is not left to the event loop's default handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from styx_py.core.errors import EXIT_HANDLER_FAILED, ProtocolError
from styx_py.core.limits import MAX_FRAME_BYTES, MAX_PEER_BUFFERED_BYTES
from styx_py.core.ports import Clock, LoopClock
from styx_py.core.wire import (
    HEADER_BYTES,
    Batch,
    Inbox,
    Message,
    decode_batch,
    encode_frame,
    encode_frames,
    frame_length,
)
from styx_py.io.admin import admin_request
from styx_py.io.handshake import Refused, accept_handshake, dial_handshake
from styx_py.io.links import (
    ConnectionCollector,
    InboundBudget,
    Link,
    Refusals,
    Stage,
    TransportLimits,
    read_payload,
    refusal_of,
)
from styx_py.io.tls import Tls, TlsServer, open_connection, start_server

log = logging.getLogger("styx.transport")

Handler = Callable[[str, Message], None]


class HandlerFailed(Exception):
    """A message handler (or a connection's task) raised: the process's state is unknown, so it ends
    (its supervisor restarts it)."""


class TcpTransport:
    def __init__(
        self,
        node_id: str,
        handler: Handler,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        inbox: Inbox,
        secret: str,
        clock: Clock | None = None,
        limits: TransportLimits | None = None,
        tls: Tls | None = None,
    ) -> None:
        self.node_id = node_id
        self.inbox = inbox  # the channel this endpoint receives: frames of any other are refused
        self.handler = handler
        self.host = host
        self.port = port
        self.key = secret.encode()
        self.tls = tls
        self.clock: Clock = clock or LoopClock()
        self.limits = limits or TransportLimits()
        self.addresses: dict[str, tuple[str, int]] = {}
        self.links: dict[asyncio.StreamWriter, Link] = {}  # every authenticated connection
        self.writers: dict[str, Link] = {}  # the connection each peer is sent to on
        self.buffers: dict[str, list[Message]] = {}
        self.dialing: dict[str, asyncio.Task[None]] = {}
        self.accepted = 0  # open accepted connections, authenticated or not
        self.budget = InboundBudget(self.limits.inbound_bytes)
        self.refusals = Refusals(node_id, self.clock)
        self.server: asyncio.Server | TlsServer | None = None
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.on_disconnect: Callable[[str], None] | None = None
        self.incarnation = uuid.uuid4().hex
        self.peer_incarnation: dict[str, str] = {}
        self.failure: HandlerFailed | None = None
        self._failed = asyncio.Event()
        self._keepalive = encode_frame(Batch(node_id, [], self.incarnation))

    async def start(self) -> None:
        self.server = await start_server(
            self._accepted,
            self.host,
            self.port,
            self.tls,
            self.refusals.add,
            spawn=self._spawn,
            clock=self.clock,
            timeout_s=self.limits.handshake_timeout_s,
            limit=self.limits.connections,
        )
        self.port = self.server.sockets[0].getsockname()[1]

    async def run(self) -> None:
        """Watch the connections until cancelled; raise :class:`HandlerFailed` once a handler raised."""
        async with asyncio.TaskGroup() as tg:
            watchdog = tg.create_task(self._watch())
            await self._failed.wait()
            watchdog.cancel()
        assert self.failure is not None
        raise self.failure

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for t in list(self._tasks) + list(self.dialing.values()):
            t.cancel()
        for link in list(self.links.values()):
            link.writer.close()
        self.writers.clear()

    async def drain(self) -> None:
        """Send what is buffered now and wait until the connections took it (before a clean exit),
        those still being dialed included (a drained worker's last handoff may go to a new one)."""
        self._flush()
        for dialing in list(self.dialing.values()):
            await asyncio.wait([dialing])  # bounded by the handshake timeout; a failure is logged
        self._flush()
        for link in list(self.writers.values()):
            if not link.writer.is_closing():
                with contextlib.suppress(ConnectionError):
                    await link.writer.drain()

    def set_address(self, node_id: str, host: str, port: int) -> None:
        self.addresses[node_id] = (host, port)

    def collector(self, prefix: str) -> ConnectionCollector:
        """Prometheus collector of refused connections, open links and the inbound budget."""
        return ConnectionCollector(prefix, self.refusals, self.links, self.budget)

    # ---- sending ------------------------------------------------------------------------------------
    def send(self, dest: str, msg: Message) -> None:
        buf = self.buffers.get(dest)
        if buf is None:
            buf = self.buffers[dest] = []
        buf.append(msg)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.failure is not None:
            self.buffers.clear()  # sent by a process in an unknown state: better lost
            return
        for dest in list(self.buffers):
            link = self.writers.get(dest)
            if link is None:
                if dest not in self.dialing:
                    self._dial(dest)
                continue
            msgs = self.buffers.pop(dest)
            writer = link.writer
            if writer.is_closing():
                log.warning("%s: dropping %d messages to disconnected %s", self.node_id, len(msgs), dest)
                continue
            if writer.transport.get_write_buffer_size() > MAX_PEER_BUFFERED_BYTES:
                log.error("%s: %s is not reading: closing its connection", self.node_id, dest)
                link.abort()
                continue
            try:
                writer.writelines(encode_frames(self.node_id, msgs, self.incarnation))
            except ProtocolError as exc:  # one message larger than a frame: a bug, not the peer's
                self._fail(exc, f"sending to {dest}")
                return

    def _dial(self, dest: str) -> None:
        address = self.addresses.get(dest)
        if address is None:
            log.warning(
                "%s: no address for %s; %d messages wait", self.node_id, dest, len(self.buffers[dest])
            )
            return

        async def dial() -> None:
            writer: asyncio.StreamWriter | None = None
            try:
                async with self.clock.timeout(self.limits.handshake_timeout_s):
                    reader, writer = await open_connection(*address, self.tls)
                    await dial_handshake(reader, writer, self.key, self.node_id, self.incarnation)
            except (OSError, TimeoutError) as exc:
                log.warning("%s: cannot reach %s at %s: %s", self.node_id, dest, address, exc or "timeout")
                if writer is not None:
                    writer.transport.abort()
                return
            finally:
                self.dialing.pop(dest, None)
            assert writer is not None
            link = Link(writer, dest, f"{address[0]}:{address[1]}", self.clock.now())
            self.links[writer] = link
            self.writers.setdefault(dest, link)
            self._spawn(self._read_loop(reader, link), f"reading from {dest}")
            self._flush()

        self.dialing[dest] = self._spawn(dial(), f"dialing {dest}")

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._guarded(coro, what))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _guarded(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        """``coro``, a connection's task: what it raises (a bug: the connection's own failures are
        handled in it) ends the process through run()."""
        try:
            await coro
        except Exception as exc:  # noqa: BLE001 - not swallowed: run() raises it, and the process ends
            self._crash(exc, what)

    # ---- receiving ----------------------------------------------------------------------------------
    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._guarded(self._accept(reader, writer), "accepting a connection")

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        address = f"{peername[0]}:{peername[1]}" if peername else "?"
        if self.accepted >= self.limits.connections:
            self.refusals.add("too_many_connections", address, f"{self.accepted} open")
            writer.transport.abort()
            return
        self.accepted += 1
        try:
            async with self.clock.timeout(self.limits.handshake_timeout_s):
                hello = await accept_handshake(reader, writer, self.key)
        except TimeoutError:
            self.refusals.add("handshake_timeout", address, "no proof of the cluster secret in time")
            writer.transport.abort()
        except Refused as exc:
            self.refusals.add(exc.reason, address, exc.detail)
            writer.transport.abort()
        except (asyncio.IncompleteReadError, OSError):
            writer.transport.abort()  # went away before it authenticated
        else:
            link = Link(writer, hello.node_id, address, self.clock.now())
            self._adopt(link, hello.incarnation)
            await self._read_loop(reader, link)
        finally:
            self.accepted -= 1

    def _adopt(self, link: Link, incarnation: str) -> None:
        peer = link.peer
        self.links[link.writer] = link
        known = self.peer_incarnation.get(peer)
        self.peer_incarnation[peer] = incarnation
        old = self.writers.get(peer)
        if old is not None and known is not None and known != incarnation:
            # The peer restarted: its old connection is dead even if we have not seen EOF.
            old.writer.close()
            self.writers[peer] = link
        else:
            self.writers.setdefault(peer, link)
        if peer in self.buffers:
            self._flush()

    async def _read_loop(self, reader: asyncio.StreamReader, link: Link) -> None:
        budget, clock = self.budget, self.clock
        try:
            while True:
                header = await reader.readexactly(HEADER_BYTES)
                try:
                    n = frame_length(header)
                except ProtocolError as exc:
                    raise Refused("oversized_frame", str(exc)) from exc
                link.stage = Stage.WAITING
                if not budget.try_take(n):
                    await budget.take(n)
                link.stage, link.since = Stage.READING, clock.now()
                try:
                    payload = await read_payload(reader, n)
                finally:
                    budget.give(n)
                link.stage, link.since = Stage.BETWEEN, clock.now()
                if not self._deliver(link, payload):
                    return
                del payload  # an idle connection must not keep its last frame alive
        except (asyncio.IncompleteReadError, OSError):
            pass  # the peer went away, or the connection failed
        except Refused as exc:
            self.refusals.add(exc.reason, link.address, f"{link.peer}: {exc.detail}")
            link.abort()
        finally:
            link.writer.close()
            self.links.pop(link.writer, None)
            if self.writers.get(link.peer) is link:
                del self.writers[link.peer]
                if link.peer not in self.addresses:
                    # A client's connection (an admin request, a reply subscription): it is never
                    # dialed, so what waits for it could never leave.
                    self.buffers.pop(link.peer, None)
                    self.peer_incarnation.pop(link.peer, None)
                if self.on_disconnect is not None and self.failure is None:
                    try:
                        self.on_disconnect(link.peer)
                    except Exception as exc:  # noqa: BLE001 - not swallowed: run() raises it
                        self._fail(exc, f"the disconnect of {link.peer}")

    def _deliver(self, link: Link, payload: bytes) -> bool:
        """Hand one frame's messages to the handler; False once the process must stop."""
        try:
            batch = decode_batch(payload, self.inbox)
        except ProtocolError as exc:
            raise refusal_of(payload, exc) from exc
        peer = link.peer
        if batch.src != peer:
            raise Refused("spoofed_source", f"a frame from {batch.src!r} on a connection of {peer!r}")
        if self.failure is not None:
            return False
        handler = self.handler
        msg: Message | None = None
        try:
            for msg in batch.msgs:
                handler(peer, msg)
        except Exception as exc:  # noqa: BLE001 - not swallowed: run() raises it and the process ends
            self._fail(exc, f"{type(msg).__name__} from {peer}")
            return False
        return True

    def _fail(self, exc: Exception, what: str) -> None:
        self._crash(exc, f"the message handler, on {what},")

    def _crash(self, exc: Exception, what: str) -> None:
        log.critical("%s: %s raised; ending the process", self.node_id, what, exc_info=exc)
        if self.failure is None:
            self.failure = HandlerFailed(f"{self.node_id}: {what} raised: {exc!r}")
            self.failure.__cause__ = exc
            self._failed.set()

    async def _watch(self) -> None:
        """Close connections past their frame or idle timeout; keep the live ones busy."""
        limits = self.limits
        while True:
            await self.clock.sleep(limits.tick_s)
            now = self.clock.now()
            for link in list(self.links.values()):
                why = link.overdue(now, limits)
                if why == "frame_timeout":
                    self.refusals.add(
                        why, link.address, f"{link.peer}: a frame started {now - link.since:.1f} s ago"
                    )
                    link.abort()
                elif why:
                    self.refusals.idle_closed += 1
                    log.info(
                        "%s: closing the idle connection of %s (%s)", self.node_id, link.peer, link.address
                    )
                    link.abort()
                elif now - link.last_keepalive >= limits.keepalive_s and not link.writer.is_closing():
                    link.last_keepalive = now
                    link.writer.write(self._keepalive)


__all__ = ["EXIT_HANDLER_FAILED", "MAX_FRAME_BYTES", "HandlerFailed", "TcpTransport", "admin_request"]
