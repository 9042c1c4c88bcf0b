"""What a reply means to a caller: :func:`decode_reply` and :func:`result_of`."""

from __future__ import annotations

from typing import Any

from styx_py.core.errors import BadRequest, Overloaded, ProtocolError, TransactionAborted, TransactionFailed
from styx_py.core.wire import Reply, reply_decoder

__all__ = ["decode_reply", "result_of"]


def decode_reply(data: bytes) -> Reply:
    """Decode one egress record into a :class:`~styx_py.core.wire.Reply` (its ``value`` decodes the result).

    Raises ``msgspec.DecodeError``/``msgspec.ValidationError`` for bytes that are not a reply.
    """
    return reply_decoder.decode(data)


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
        case "refused":
            raise Overloaded(reply.error or "refused: the cluster is overloaded", reply)
        case "failed":
            message = f"{reply.error_type or 'error'}: {reply.error or 'transaction failed'}"
            raise TransactionFailed(message, reply)
        case _:
            raise ProtocolError(f"reply {reply.request_id} has unknown status {reply.status!r}")
