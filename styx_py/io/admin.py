"""The admin API's client side: one authenticated request/reply exchange with the coordinator."""

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

__all__ = ["CONNECT_TIMEOUT_ENV", "admin_request", "connect_timeout"]

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
    host, port = host_port(address, "the coordinator's address")
    key = client_secret(secret).encode()
    tls = client_tls(tls)
    bound = connect_timeout(connect_timeout_s)
    name = f"admin-{uuid.uuid4().hex[:12]}"
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout_s):
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
            except TimeoutError:
                raise HandshakeFailed(
                    f"{address} took the connection but sent no handshake within {bound:g} s "
                    f"({CONNECT_TIMEOUT_ENV}): is it a styx-py coordinator's port?"
                    + ("" if tls else " (one in TLS waits for a client with STYX_TLS_* set)")
                ) from None
            writer.write(encode_frame(Batch(name, [msg])))
            while True:
                try:
                    header = await reader.readexactly(HEADER_BYTES)
                    payload = await reader.readexactly(frame_length(header))
                except asyncio.IncompleteReadError as exc:
                    raise ConnectionError("the coordinator closed the connection before answering") from exc
                for m in decode_batch(payload, "admin").msgs:
                    if isinstance(m, AdminReply):
                        return m
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
