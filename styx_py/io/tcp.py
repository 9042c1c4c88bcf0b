"""Length-prefixed msgspec frames over asyncio TCP, batched per destination.

``send`` never blocks: messages are appended to the destination's buffer and every buffer is
flushed once per event-loop tick as one frame (a :class:`~styx_py.core.wire.Batch`). Each sender uses one
connection per destination, so every channel is FIFO, which the epoch protocol relies on.
A peer is reached on the connection it opened to us (its ``src`` is learned from its first frame) or
on one we dial from the addresses in the cluster view.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable

from styx_py.core.errors import ProtocolError
from styx_py.core.limits import MAX_FRAME_BYTES
from styx_py.core.wire import (
    HEADER_BYTES,
    AdminReply,
    Batch,
    Inbox,
    Message,
    decode_batch,
    encode_frame,
    frame_length,
)

log = logging.getLogger("styx.transport")

Handler = Callable[[str, Message], None]
MAX_BUFFERED_BYTES = 4 * MAX_FRAME_BYTES  # a peer that stops reading fails instead of eating memory


class TcpTransport:
    def __init__(
        self, node_id: str, handler: Handler, host: str = "127.0.0.1", port: int = 0, *, inbox: Inbox
    ) -> None:
        self.node_id = node_id
        self.inbox = inbox  # the channel this endpoint receives: frames of any other do not decode
        self.handler = handler
        self.host = host
        self.port = port
        self.addresses: dict[str, tuple[str, int]] = {}
        self.writers: dict[str, asyncio.StreamWriter] = {}
        self.buffers: dict[str, list[Message]] = {}
        self.dialing: dict[str, asyncio.Task[None]] = {}
        self.server: asyncio.Server | None = None
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.on_disconnect: Callable[[str], None] | None = None
        self.incarnation = uuid.uuid4().hex
        self.peer_incarnation: dict[str, str] = {}

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for t in list(self._tasks) + list(self.dialing.values()):
            t.cancel()
        for w in self.writers.values():
            w.close()
        self.writers.clear()

    def set_address(self, node_id: str, host: str, port: int) -> None:
        self.addresses[node_id] = (host, port)

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
        for dest in list(self.buffers):
            writer = self.writers.get(dest)
            if writer is None:
                if dest not in self.dialing:
                    self._dial(dest)
                continue
            msgs = self.buffers.pop(dest)
            if writer.is_closing():
                log.warning("%s: dropping %d messages to disconnected %s", self.node_id, len(msgs), dest)
                continue
            transport = writer.transport
            if transport.get_write_buffer_size() > MAX_BUFFERED_BYTES:
                raise ProtocolError(f"{self.node_id}: peer {dest} is not reading (write buffer full)")
            writer.write(encode_frame(Batch(self.node_id, msgs, self.incarnation)))

    def _dial(self, dest: str) -> None:
        address = self.addresses.get(dest)
        if address is None:
            log.warning(
                "%s: no address for %s; %d messages wait", self.node_id, dest, len(self.buffers[dest])
            )
            return

        async def dial() -> None:
            try:
                reader, writer = await asyncio.open_connection(*address)
            except OSError as exc:
                log.warning("%s: cannot reach %s at %s: %s", self.node_id, dest, address, exc)
                self.dialing.pop(dest, None)
                return
            # An empty batch announces who we are, so the peer can answer on this connection.
            writer.write(encode_frame(Batch(self.node_id, [], self.incarnation)))
            self.writers.setdefault(dest, writer)
            self.dialing.pop(dest, None)
            self._spawn(self._read_loop(reader, writer, dest))
            self._flush()

        self.dialing[dest] = self._spawn(dial())

    def _spawn(self, coro: object) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- receiving ----------------------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._read_loop(reader, writer, None)

    async def _read_loop(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str | None
    ) -> None:
        try:
            while True:
                header = await reader.readexactly(HEADER_BYTES)
                payload = await reader.readexactly(frame_length(header))
                batch = decode_batch(payload, self.inbox)
                if peer is None:
                    peer = batch.src
                    known = self.peer_incarnation.get(peer)
                    self.peer_incarnation[peer] = batch.incarnation
                    old = self.writers.get(peer)
                    if old is not None and known is not None and known != batch.incarnation:
                        # The peer restarted: its old connection is dead even if we have not seen EOF.
                        old.close()
                        self.writers[peer] = writer
                    else:
                        self.writers.setdefault(peer, writer)
                    if peer in self.buffers:
                        self._flush()
                handler = self.handler
                for msg in batch.msgs:
                    handler(peer, msg)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except ProtocolError as exc:
            log.error("%s: closing connection from %s: %s", self.node_id, peer, exc)
        finally:
            writer.close()
            if peer is not None and self.writers.get(peer) is writer:
                del self.writers[peer]
                if self.on_disconnect is not None:
                    self.on_disconnect(peer)


async def admin_request(address: str, msg: Message, timeout_s: float = 60.0) -> AdminReply:
    """One request/reply exchange with the coordinator's admin API (used by the CLI and the SDK)."""
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host or "127.0.0.1", int(port)), timeout_s
    )
    try:
        writer.write(encode_frame(Batch(f"admin-{uuid.uuid4().hex[:12]}", [msg])))
        await writer.drain()

        async def read_reply() -> AdminReply:
            while True:
                header = await reader.readexactly(HEADER_BYTES)
                batch = decode_batch(await reader.readexactly(frame_length(header)), "admin")
                for m in batch.msgs:
                    if isinstance(m, AdminReply):
                        return m

        return await asyncio.wait_for(read_reply(), timeout_s)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


__all__ = ["MAX_FRAME_BYTES", "TcpTransport", "admin_request"]
