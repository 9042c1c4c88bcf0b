"""The admin API's client side: one authenticated request/reply exchange with the coordinator."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

from styx_py.core.wire import (
    HEADER_BYTES,
    AdminReply,
    Batch,
    Message,
    decode_batch,
    encode_frame,
    frame_length,
)
from styx_py.io.handshake import client_secret, dial_handshake

__all__ = ["admin_request"]


async def admin_request(
    address: str, msg: Message, timeout_s: float = 60.0, *, secret: str | None = None
) -> AdminReply:
    """One request/reply exchange with the coordinator's admin API (used by the CLI, the SDK and the
    gateway), authenticated with ``secret`` (default ``$STYX_CLUSTER_SECRET``, see
    :func:`~styx_py.io.handshake.client_secret`)."""
    host, _, port = address.rpartition(":")
    key = client_secret(secret).encode()
    name = f"admin-{uuid.uuid4().hex[:12]}"
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host or "127.0.0.1", int(port))
            await dial_handshake(reader, writer, key, name, name)
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
