"""Replies: the one loop that reads them from the egress topic, and what a reply means to a caller."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from styx_client.sdk.pending import ClientStats
from styx_client.sdk.resting import REST_S, EgressRest
from styx_py.core.errors import BadRequest, ProtocolError, TransactionAborted, TransactionFailed
from styx_py.core.wire import Reply, reply_decoder
from styx_py.io.fetching import FetchWait

__all__ = ["decode_reply", "read_replies", "result_of"]

log = logging.getLogger("styx.client")

# How long one getmany() may block. Only bounds how quickly the reader notices cancellation or a new
# egress segment to read when no replies flow; replies themselves are returned as soon as a fetch
# brings them.
_READ_POLL_MS = 250


def decode_reply(data: bytes) -> Reply:
    """Decode one egress record into a :class:`~styx_py.core.wire.Reply` (its ``value`` decodes the result).

    Raises ``msgspec.DecodeError``/``msgspec.ValidationError`` for bytes that are not a reply.
    """
    return reply_decoder.decode(data)


async def read_replies(
    consumer: Any,
    deliver: Callable[[Reply], None],
    stats: ClientStats,
    topic: str,
    follow: Callable[[Any], Awaitable[None]] | None = None,
    wait_floor_ms: Callable[[], int] | None = None,
    taken: Callable[[bytes], bool] | None = None,
    rest: EgressRest | None = None,
) -> None:
    """The one consumer loop: decode every egress record and ``deliver`` it (undecodable ones skipped),
    except a record whose key ``taken(key)`` says is a copy of a reply already delivered (and counted
    it). ``follow(consumer)`` runs before each poll (the client changes what it reads there). The fetch
    wait is the consumer's own, raised if the broker starves it, and at least ``wait_floor_ms()``
    (asked before each poll: longer while the workers push the replies, styx_client.sdk.push). While
    ``rest`` says the reader may rest, it does not poll (styx_client.sdk.resting)."""
    wait = FetchWait.of(consumer, f"replies {topic}")  # raised if the broker starves it (Tansu on S3)
    while True:
        if follow is not None:
            await follow(consumer)
        if rest is not None and await rest.rest(consumer):
            await asyncio.sleep(REST_S)
            continue
        if wait_floor_ms is not None:
            wait.at_least(consumer, wait_floor_ms())
        batches = await consumer.getmany(timeout_ms=_READ_POLL_MS)
        await wait.after_poll(consumer, batches)
        for records in batches.values():
            for record in records:
                if taken is not None and record.key is not None and taken(record.key):
                    continue
                value = record.value
                try:
                    if value is None:
                        raise msgspec.DecodeError("empty record value")
                    reply = decode_reply(value)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    stats.undecodable += 1
                    log.warning(
                        "skipping undecodable record at %s[%d]@%d: %s",
                        topic,
                        record.partition,
                        record.offset,
                        exc,
                    )
                    continue
                deliver(reply)


def result_of(reply: Reply) -> Any:
    """The decoded result of a committed reply; the matching exception, carrying the reply, otherwise
    (see :meth:`StyxClient.call`)."""
    match reply.status:
        case "committed":
            return reply.value
        case "aborted":
            raise TransactionAborted(reply.error or "transaction aborted", reply)
        case "failed" if reply.error_type == "BadRequest":
            raise BadRequest(reply.error or "bad request", reply)
        case "failed":
            message = f"{reply.error_type or 'error'}: {reply.error or 'transaction failed'}"
            raise TransactionFailed(message, reply)
        case _:
            raise ProtocolError(f"reply {reply.request_id} has unknown status {reply.status!r}")
