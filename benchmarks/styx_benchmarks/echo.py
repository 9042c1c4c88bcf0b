"""A stand-in cluster that answers every request at once: the load generator's cost, measured alone.

    python -m styx_benchmarks.echo BOOTSTRAP [--ingress styx-ingress] [--egress styx-egress]

One process consumes every ingress partition and produces, for each request, a ``committed``
:class:`~styx_py.core.wire.Reply` (result nil, tid and epoch 0) to the egress partition the request
names (as the workers do), else the one of the same number as its ingress partition (modulo the
count). No state, no epochs, no workers: used by
``cpu_cost --cluster echo`` so that the client's CPU per request can be measured at rates the real
cluster on a small machine cannot sustain (where its replies would stop and skew the client's work).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

import msgspec
import uvloop
from aiokafka import (  # type: ignore[import-untyped,unused-ignore]
    AIOKafkaConsumer,
    AIOKafkaProducer,
    TopicPartition,
)

from styx_py.core.limits import MAX_BATCH_BYTES
from styx_py.core.wire import NIL, Phase, Reply, ReplyStatus, request_decoder
from styx_py.io.batching import BatchLanes
from styx_py.io.fetching import FetchWait

__all__ = ["echo"]

_POLL_MS = 1000


async def echo(bootstrap: str, ingress: str, egress: str) -> None:
    """Answer every request on ``ingress`` with a committed reply on ``egress``, until cancelled."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, max_batch_size=MAX_BATCH_BYTES
    )
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",  # fresh topics: nothing produced before we start is skipped
        fetch_max_wait_ms=5,
    )
    await producer.start()
    await consumer.start()
    try:
        ins = await producer.partitions_for(ingress)
        outs = len(await producer.partitions_for(egress))
        consumer.assign([TopicPartition(ingress, p) for p in sorted(ins)])
        lanes = BatchLanes(producer)
        async with asyncio.TaskGroup() as group:
            group.create_task(lanes.run())
            await _answer(consumer, lanes, egress, outs)
    finally:
        await consumer.stop()
        await producer.stop()


async def _answer(consumer: Any, lanes: BatchLanes, egress: str, outs: int) -> None:
    wait = FetchWait.of(consumer, "echo ingress")
    encoder = msgspec.msgpack.Encoder()
    while True:
        batches = await consumer.getmany(timeout_ms=_POLL_MS)
        await wait.after_poll(consumer, batches)
        for tp, records in batches.items():
            out = tp.partition % outs
            for record in records:
                req = request_decoder.decode(record.value)  # a bad record fails here, loudly
                wanted = req.reply_partition
                reply = Reply(
                    req.request_id, 0, 0, Phase.OPTIMISTIC, ReplyStatus.COMMITTED, NIL, None, None, req.ts_ms
                )
                lanes.add(egress, wanted if 0 <= wanted < outs else out, None, encoder.encode(reply), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("bootstrap")
    parser.add_argument("--ingress", default="styx-ingress")
    parser.add_argument("--egress", default="styx-egress")
    args = parser.parse_args()
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(echo(args.bootstrap, args.ingress, args.egress))
    return 0


if __name__ == "__main__":
    sys.exit(main())
