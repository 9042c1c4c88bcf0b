"""The admin API's client side: authenticated request/reply exchanges with the coordinator, one per
connection (:func:`admin_request`) or over kept connections (:class:`AdminConnections`, for reads)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import uuid

from styx_py.core.addresses import host_port
from styx_py.core.errors import ConfigError
from styx_py.core.limits import HANDSHAKE_TIMEOUT_S
from styx_py.core.wire import (
    HEADER_BYTES,
    AdminReply,
    Batch,
    Message,
    decode_batch,
    encode_frame,
    frame_length,
)
from styx_py.io.handshake import HandshakeFailed, client_secret, dial_handshake
from styx_py.io.tls import Tls, client_tls, open_connection

__all__ = ["CONNECT_TIMEOUT_ENV", "AdminConnections", "admin_request", "connect_timeout"]

CONNECT_TIMEOUT_ENV = "STYX_CONNECT_TIMEOUT_S"


def connect_timeout(value: float | None) -> float:
    """An admin client's bound on connecting and on the handshake: ``value`` when given, else
    ``$STYX_CONNECT_TIMEOUT_S`` (the ``connect_timeout_s`` setting), else the handshake's bound."""
    if value is not None:
        return value
    raw = os.environ.get(CONNECT_TIMEOUT_ENV, "")
    if not raw:
        return HANDSHAKE_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not seconds >= 0.001 or math.isinf(seconds):
        raise ConfigError(f"{CONNECT_TIMEOUT_ENV}={raw!r} is not a number of seconds >= 0.001")
    return seconds


async def admin_request(
    address: str,
    msg: Message,
    timeout_s: float = 60.0,
    *,
    secret: str | None = None,
    tls: Tls | None = None,
    connect_timeout_s: float | None = None,
) -> AdminReply:
    """One request/reply exchange with the coordinator's admin API (used by the CLI, the SDK and the
    gateway), authenticated with ``secret`` (default ``$STYX_CLUSTER_SECRET``, see
    :func:`~styx_py.io.handshake.client_secret`), in mutual TLS with ``tls`` (default: from
    ``$STYX_TLS_*``, see :func:`~styx_py.io.tls.client_tls`). Taking the connection and answering
    the handshake must each happen within ``connect_timeout_s`` (default :func:`connect_timeout`),
    else :class:`~styx_py.io.handshake.HandshakeFailed` names the address and what was missing."""
    conn: _Connection | None = None
    try:
        async with asyncio.timeout(timeout_s):
            conn = await _open(address, secret, tls, connect_timeout_s)
            return await conn.exchange(msg)
    finally:
        if conn is not None:
            await conn.close()


class AdminConnections:
    """Admin requests over kept connections: a request takes an idle connection (or opens one, as
    :func:`admin_request` does), and a clean exchange gives it back for the next request, so a scan's
    pages pay one connection and one handshake, not one each. For requests that may be sent twice
    (reads): one whose kept connection turns out closed (the coordinator's idle timeout, a restart) is
    sent again on a new one. A connection whose exchange failed or timed out is closed, never kept (a
    late answer must not reach the next request). At most ``keep`` stay idle, each closed after
    ``idle_s`` unused; connections belong to the event loop that opened them."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = 60.0,
        secret: str | None = None,
        tls: Tls | None = None,
        keep: int = 4,
        idle_s: float = 2.0,
    ) -> None:
        self.address, self.timeout_s, self.secret, self.tls = address, timeout_s, secret, tls
        self.keep, self.idle_s = keep, idle_s
        self.idle: list[tuple[_Connection, asyncio.TimerHandle]] = []

    async def __call__(self, msg: Message) -> AdminReply:
        async with asyncio.timeout(self.timeout_s):
            while True:
                conn = self._take()
                kept = conn is not None
                if conn is None:
                    conn = await _open(self.address, self.secret, self.tls, None)
                try:
                    reply = await conn.exchange(msg)
                except BaseException as exc:
                    await conn.close()
                    if kept and isinstance(exc, ConnectionError):
                        continue  # closed while idle: send it again, on the next one or a new one
                    raise
                self._give_back(conn)
                return reply

    def _take(self) -> _Connection | None:
        loop = asyncio.get_running_loop()
        while self.idle:
            conn, timer = self.idle.pop()
            timer.cancel()
            if conn.loop is loop and not conn.writer.is_closing():
                return conn
            conn.writer.close()
        return None

    def _give_back(self, conn: _Connection) -> None:
        if len(self.idle) >= self.keep:
            conn.writer.close()
            return
        timer = conn.loop.call_later(self.idle_s, self._expire, conn)
        self.idle.append((conn, timer))

    def _expire(self, conn: _Connection) -> None:
        self.idle = [(c, t) for c, t in self.idle if c is not conn]
        conn.writer.close()

    async def aclose(self) -> None:
        """Close the idle connections (one in use closes when its request ends)."""
        idle, self.idle = self.idle, []
        for conn, timer in idle:
            timer.cancel()
            await conn.close()


class _Connection:
    __slots__ = ("loop", "name", "reader", "writer")

    def __init__(self, name: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.loop = asyncio.get_running_loop()
        self.name, self.reader, self.writer = name, reader, writer

    async def exchange(self, msg: Message) -> AdminReply:
        """Send ``msg`` and wait for the coordinator's answer (ConnectionError: the connection closed)."""
        reader = self.reader
        self.writer.write(encode_frame(Batch(self.name, [msg])))
        while True:
            try:
                header = await reader.readexactly(HEADER_BYTES)
                payload = await reader.readexactly(frame_length(header))
            except asyncio.IncompleteReadError as exc:
                raise ConnectionError("the coordinator closed the connection before answering") from exc
            for m in decode_batch(payload, "admin").msgs:
                if isinstance(m, AdminReply):
                    return m

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


async def _open(
    address: str, secret: str | None, tls: Tls | None, connect_timeout_s: float | None
) -> _Connection:
    """A new authenticated connection to the coordinator's admin port (bounds as :func:`admin_request`)."""
    host, port = host_port(address, "the coordinator's address")
    key = client_secret(secret).encode()
    tls = client_tls(tls)
    bound = connect_timeout(connect_timeout_s)
    name = f"admin-{uuid.uuid4().hex[:12]}"
    try:
        async with asyncio.timeout(bound):
            reader, writer = await open_connection(host, port, tls)
    except TimeoutError:
        raise HandshakeFailed(
            f"{address} did not take the connection within {bound:g} s ({CONNECT_TIMEOUT_ENV})"
        ) from None
    try:
        async with asyncio.timeout(bound):
            await dial_handshake(reader, writer, key, name, name)
    except BaseException as exc:
        writer.close()
        if isinstance(exc, TimeoutError):
            raise HandshakeFailed(
                f"{address} took the connection but sent no handshake within {bound:g} s "
                f"({CONNECT_TIMEOUT_ENV}): is it a styx-py coordinator's port?"
                + ("" if tls else " (one in TLS waits for a client with STYX_TLS_* set)")
            ) from None
        raise
    return _Connection(name, reader, writer)
