"""The load generator's own CPU, without Kafka: the SDK and the ``styx bench`` driver in one process.

    python -m styx_benchmarks.sdk_cpu --rate 8000 --seconds 6          # the open loop
    python -m styx_benchmarks.sdk_cpu --stages --burst 8               # each stage, warm and cold

``cpu_cost`` measures the load generator on a real cluster, where aiokafka, the sockets and the other
processes sharing the cores are part of the number. This takes them out, to show what the SDK's and
the driver's own Python costs per request:

* the open loop (default): the driver sends YCSB-T transfers at ``--rate`` through
  :meth:`~styx_client.StyxClient.prepare` as ``styx bench`` does, into the client's real
  :class:`~styx_py.io.batching.BatchLanes` with aiokafka's real batch builder; a stand-in producer
  acknowledges each batch 1 ms later, and a stand-in worker answers every acknowledged request every
  2 ms with a frame of pushed replies, which the client decodes and resolves as it does a worker's.
  The stand-in worker's own CPU (building and encoding the replies) is measured and left out.
* ``--stages``: each stage of a request (draw the operation, send it, add it to a batch, its
  acknowledgement, decode its reply, resolve it), timed on the thread's CPU clock over bursts of
  ``--burst`` requests, back to back (warm) and with a 1 ms sleep before each burst (cold: what the
  driver's 1 ms tick does at 8 000/s with 8 requests a tick).

Measured numbers are in benchmarks/results/resting-reader.md.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import random
import resource
import sys
import time
from typing import Any

import uvloop
from aiokafka.producer.message_accumulator import BatchBuilder  # type: ignore[import-untyped,unused-ignore]
from aiokafka.structs import RecordMetadata, TopicPartition  # type: ignore[import-untyped,unused-ignore]

from styx_benchmarks.cpu import wakeups
from styx_benchmarks.driver import SdkSender, run_open_loop
from styx_benchmarks.workload import Options
from styx_benchmarks.workloads import make_workload
from styx_client import StyxClient
from styx_client.sdk.kafka_transport import KafkaTransport
from styx_client.sdk.stats import ClientStats
from styx_client.sdk.transport import Opened
from styx_py.core.limits import BUSY_LINGER_MS, MAX_BATCH_BYTES
from styx_py.core.wire import Batch, Phase, PushedReply, Reply, ReplyStatus
from styx_py.core.wire.frames import HEADER_BYTES, decode_batch, encode_frame
from styx_py.core.wire.logs import NIL
from styx_py.io.batching import BatchLanes
from styx_py.io.runtime import steady_gc

ACK_S = 0.001  # the stand-in producer acknowledges a batch this long after it was handed over
REPLY_EVERY_S = 0.002  # the stand-in worker answers what was acknowledged this often
DRAIN_S = 10.0  # every request is answered within milliseconds here: one still open after this is lost
STAGES = ("next_op", "send", "batch append", "acknowledged", "decode reply", "resolve")


class StandInProducer:
    """What :class:`BatchLanes` uses of aiokafka's producer: real batch builders, acknowledged later."""

    def __init__(self, on_acked: Any) -> None:
        self.on_acked = on_acked
        self.offset = 0
        self.client = None

    def create_batch(self) -> Any:
        return BatchBuilder(MAX_BATCH_BYTES, 0, is_transactional=False)

    async def send_batch(self, builder: Any, topic: str, partition: int) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        delivery: asyncio.Future[Any] = loop.create_future()
        builder._build()  # as aiokafka's sender does: the records' bytes
        n = builder._relative_offset
        base, self.offset = self.offset, self.offset + n

        def ack() -> None:
            tp = TopicPartition(topic, partition)
            delivery.set_result(RecordMetadata(topic, partition, tp, base, 0, 0, 0))
            self.on_acked(n)

        loop.call_later(ACK_S, ack)
        return delivery


class StandInWorker:
    """Answers every acknowledged request every :data:`REPLY_EVERY_S` with one frame of pushed replies."""

    def __init__(self, client: StyxClient) -> None:
        self.client = client
        self.acked = 0
        self.own_cpu_s = 0.0  # building and encoding the replies: a worker's work, not the client's

    def on_acked(self, n: int) -> None:
        self.acked += n

    def reply_frame(self, request_ids: list[str]) -> bytes:
        msgs = [
            PushedReply(Reply(rid, 1, 1, Phase.OPTIMISTIC, ReplyStatus.COMMITTED, NIL, None, None, 0))
            for rid in request_ids
        ]
        return encode_frame(Batch("w1", msgs))[HEADER_BYTES:]

    async def run(self) -> None:
        core = self.client._core
        table, deliver = core.table, core.pushed
        while True:
            await asyncio.sleep(REPLY_EVERY_S)
            t0 = time.thread_time()
            rids = [rid for rid, entry in table.entries.items() if entry.stamp][: self.acked]
            self.acked -= len(rids)
            payload = self.reply_frame(rids) if rids else b""
            self.own_cpu_s += time.thread_time() - t0
            if payload:  # the client's side, as WorkerLinks reads a frame
                for msg in decode_batch(payload, "admin").msgs:
                    if isinstance(msg, PushedReply):
                        deliver(msg.reply)


class StandInTransport(KafkaTransport):
    """The Kafka transport with its batches going to a :class:`StandInProducer` and no reader."""

    def __init__(self, client_stats: ClientStats, busy_linger_ms: float) -> None:
        super().__init__(client_stats)
        self.busy_linger_ms = busy_linger_ms
        self.on_acked: Any = None

    async def open(self, config: Any, operators: Any, events: Any, rest: Any, reply_to: str) -> Opened:
        self._config, self._events = config, events
        self.producer = StandInProducer(self.on_acked)
        self.lanes = BatchLanes(self.producer, busy_linger_s=self.busy_linger_ms / 1000)
        return Opened(0, 0)

    def start(self, group: asyncio.TaskGroup) -> None:
        assert self.lanes is not None
        group.create_task(self.lanes.run())

    async def newest_segment(self, known: int) -> int | None:
        return known

    async def close(self) -> None:
        pass


async def offline_client(busy_linger_ms: float) -> tuple[StyxClient, StandInWorker]:
    """A started client whose batches go to a :class:`StandInProducer` (no Kafka, no reader)."""
    stats = ClientStats()
    transport = StandInTransport(stats, busy_linger_ms)
    client = StyxClient("offline:0", {"account": 4}, max_pending=1_000_000, transport=transport)
    transport.stats = client.stats
    worker = StandInWorker(client)
    transport.on_acked = worker.on_acked
    await client.start()
    return client, worker


def _lanes(client: StyxClient) -> BatchLanes:
    transport = client._transport
    assert isinstance(transport, StandInTransport) and transport.lanes is not None
    return transport.lanes


async def open_loop(rate: float, seconds: float, busy_linger_ms: float) -> dict[str, float]:
    client, worker = await offline_client(busy_linger_ms)
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(worker.run())]
    try:
        workload = make_workload("ycsbt", Options())
        sender = SdkSender(client, 60)
        await run_open_loop(
            workload, sender, rate=rate, duration_s=1, warmup_s=0, drain_s=DRAIN_S, progress=None
        )
        worker.own_cpu_s = 0.0
        woken = wakeups(os.getpid())
        before = resource.getrusage(resource.RUSAGE_SELF)
        cpu0 = time.process_time()
        result = await run_open_loop(
            workload, sender, rate=rate, duration_s=seconds, warmup_s=0, drain_s=DRAIN_S, progress=None
        )
        cpu = time.process_time() - cpu0 - worker.own_cpu_s
        after = resource.getrusage(resource.RUSAGE_SELF)
        woken = wakeups(os.getpid()) - woken
    finally:
        for task in tasks:
            task.cancel()
        await client.close()
    if result.answered != result.sent:
        raise RuntimeError(f"{result.sent} sent but {result.answered} answered: {dict(result.causes)}")
    return {
        "rate": rate,
        "sent": result.sent,
        "us_per_request": cpu / result.sent * 1e6,
        "user_ms_per_s": (after.ru_utime - before.ru_utime) / seconds * 1e3,
        "system_ms_per_s": (after.ru_stime - before.ru_stime) / seconds * 1e3,
        "wakeups_per_s": woken / seconds,
        "stand_in_worker_us_per_request": worker.own_cpu_s / result.sent * 1e6,
    }


async def stages(burst: int, bursts: int, cold: bool) -> dict[str, float]:
    """µs of thread CPU per request in each of :data:`STAGES`, over ``bursts`` bursts of ``burst``."""
    client, worker = await offline_client(0.0)
    lanes = _lanes(client)
    producer = lanes.producer
    workload = make_workload("ycsbt", Options())
    rng = random.Random(1)
    sender = SdkSender(client, 60)

    def done(i: int, label: str, reply: Any, error: BaseException | None) -> None:
        if error is not None:
            raise error

    totals = [0.0] * len(STAGES)
    clock = time.thread_time
    for _ in range(bursts):
        if cold:
            await asyncio.sleep(0.001)
        t0 = clock()
        ops = [workload.next_op(rng) for _ in range(burst)]
        t1 = clock()
        for i, op in enumerate(ops):
            sender.start(op, functools.partial(done, i, op.label))
        t2 = clock()
        records = [r for queue in lanes.lanes.values() for r in queue]
        lanes.lanes.clear()
        builder = producer.create_batch()
        for key, value, _, headers, ts in records:
            if builder.append(key=key, value=value, timestamp=ts, headers=headers) is None:
                builder = producer.create_batch()
                builder.append(key=key, value=value, timestamp=ts, headers=headers)
        t3 = clock()
        for offset, (_, _, on_done, _, _) in enumerate(records):
            if on_done is not None:
                on_done(offset, None)
        t4 = clock()
        payload = worker.reply_frame(list(client._core.table.entries))
        t5 = clock()
        replies = [msg.reply for msg in decode_batch(payload, "admin").msgs if isinstance(msg, PushedReply)]
        t6 = clock()
        for reply in replies:
            client._core.pushed(reply)
        t7 = clock()
        for k, (a, b) in enumerate(((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t5, t6), (t6, t7))):
            totals[k] += b - a
    left = client.pending_count
    await client.close()
    if left:
        raise RuntimeError(f"{left} requests left unanswered")
    return {name: total / (burst * bursts) * 1e6 for name, total in zip(STAGES, totals, strict=True)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=8000.0)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument(
        "--busy-linger-ms", type=float, default=BUSY_LINGER_MS, help="the client's busy linger"
    )
    parser.add_argument("--stages", action="store_true", help="time each stage instead, warm and cold")
    parser.add_argument("--burst", type=int, default=8, help="requests per burst (--stages)")
    parser.add_argument("--bursts", type=int, default=4000, help="bursts timed (--stages)")
    args = parser.parse_args(argv)
    if args.stages:
        for cold in (False, True):
            with steady_gc():  # as the driver runs its open loop
                per = uvloop.run(stages(args.burst, args.bursts, cold))
            shown = "  ".join(f"{name} {us:.2f}" for name, us in per.items())
            kind = "cold (1 ms sleep before each)" if cold else "warm (back to back)"
            print(f"bursts of {args.burst}, {kind}: {sum(per.values()):.1f} µs per request: {shown}")
        return 0
    out = uvloop.run(open_loop(args.rate, args.seconds, args.busy_linger_ms))
    print(
        f"{out['rate']:g}/s for {args.seconds:g} s, {out['sent']:.0f} requests: "
        f"{out['us_per_request']:.1f} µs of CPU per request (user {out['user_ms_per_s']:.0f} ms/s, "
        f"system {out['system_ms_per_s']:.0f} ms/s, {out['wakeups_per_s']:.0f} wake-ups/s; the stand-in "
        f"worker's {out['stand_in_worker_us_per_request']:.1f} µs left out)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
