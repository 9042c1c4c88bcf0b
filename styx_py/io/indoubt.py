"""A produce request whose outcome is not known is not sent again blind.

aiokafka's producer, when not idempotent, sends a batch again after any retriable error, including
those that leave it unknown whether the broker stored the batch: the connection closed with the
request written and no response read (the broker died or restarted mid-request), or no response in
``request_timeout_ms``. If the broker had stored it, the batch is stored twice. Tansu has no
idempotent producer (aiokafka's fails at start there), and a Tansu on S3 was seen to make a request's
records readable well before it answered (a worker's request of replies, changelog records and a
sequencer-log entry: its replies were read 120 ms before the broker was killed, the request still
unanswered): the blind retry then stored those replies a second time, in the batches right after.

:func:`no_blind_retries` makes a producer fail such a batch with the error instead
(:data:`IN_DOUBT`); :class:`~styx_py.io.batching.BatchLanes` with a ``reread`` then reads the partition
back and sends again only the records that are not there. Errors that say the broker did not store
the batch (a node not ready, a leader moved) are still retried by aiokafka.
"""

from __future__ import annotations

from typing import Any

from aiokafka.errors import (  # type: ignore[import-untyped,unused-ignore]
    CorrelationIdError,
    KafkaConnectionError,
    RequestTimedOutError,
)
from aiokafka.producer import sender as _sender  # type: ignore[import-untyped,unused-ignore]

__all__ = ["IN_DOUBT", "no_blind_retries"]

# A request was (or may have been) written to the broker and no answer came back: stored or not, unknown.
IN_DOUBT: tuple[type[BaseException], ...] = (KafkaConnectionError, RequestTimedOutError, CorrelationIdError)


class _Handler(_sender.SendProduceReqHandler):  # type: ignore[misc]
    def _can_retry(self, error: BaseException, batch: Any) -> bool:
        if isinstance(error, IN_DOUBT):
            return False  # the batch fails with it: its owner finds out what the broker holds
        return bool(super()._can_retry(error, batch))


class _Sender(_sender.Sender):  # type: ignore[misc]
    async def _send_produce_req(self, node_id: int, batches: dict[Any, Any]) -> None:
        # aiokafka's own body, with the handler above.
        handler = _Handler(self, batches)
        await handler.do(node_id)
        self._in_flight.remove(node_id)
        for tp in batches:
            self._muted_partitions.remove(tp)


def no_blind_retries(producer: Any) -> None:
    """``producer`` (an ``AIOKafkaProducer``, not idempotent, not started) fails a batch whose produce
    is :data:`IN_DOUBT` instead of sending it again."""
    sender = producer._sender
    if type(sender) is not _sender.Sender or producer._txn_manager is not None:
        raise TypeError(f"no_blind_retries needs a plain non-idempotent aiokafka producer, not {sender!r}")
    # aiokafka's internals this relies on (as in 0.14): another version without them fails here, loudly.
    internals = [hasattr(sender, a) for a in ("_in_flight", "_muted_partitions", "_send_produce_req")]
    if not all(internals) or not hasattr(_sender.SendProduceReqHandler, "_can_retry"):
        raise TypeError("this aiokafka's producer internals are not the ones no_blind_retries knows")
    sender.__class__ = _Sender
