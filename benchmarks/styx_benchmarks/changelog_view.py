"""A live view of a cluster's state built from its changelog topic with aiokafka alone.

    python -m styx_benchmarks.changelog_view BOOTSTRAP [--topic styx-changelog] [--operator account]

Reads every partition of the changelog from its start and keeps, per entity, the latest value
(:class:`ChangelogView`); then follows the topic, printing once a second how many entities the view
holds, the sum of their integer values and the newest epoch it has seen. A bank's balances summed
this way give its conserved total once the view has caught up with a quiet cluster.

The consumer needs nothing of styx but the record's layout (:mod:`styx_py.core.changelog`, msgpack):
it assigns the partitions by hand (no consumer group), starts at offset 0, and takes the fetch's high
watermark as a partition's end (``end_offsets()`` is wrong on Tansu). It skips any record at or below
the last position it applied in that partition, so even a record written twice (which the cluster does
not do: docs/architecture.md#changelog) would leave the view as it was.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition  # type: ignore[import-untyped,unused-ignore]

from styx_py.core.changelog import ChangeRecord, Position, change_decoder
from styx_py.core.partitioning import Key
from styx_py.core.security import KafkaSecurity
from styx_py.io.tls import kafka_options

__all__ = ["ChangelogView", "follow"]

_POLL_MS = 200


class ChangelogView:
    """The table the changelog's records leave: the latest value per entity (deletes drop it)."""

    def __init__(self, operator: str | None = None) -> None:
        self.operator = operator  # only this operator's entities (None: all)
        self.table: dict[tuple[str, Key], Any] = {}
        self.positions: dict[int, Position] = {}  # partition -> the last record applied
        self.newest_epoch = -1

    def apply(self, partition: int, records: Iterable[ChangeRecord]) -> None:
        """Apply ``partition``'s next records, in the order the topic holds them."""
        at = self.positions.get(partition, (-1, -1))
        for r in records:
            if r.position <= at:
                continue  # applied already
            at = r.position
            self.newest_epoch = max(self.newest_epoch, r.epoch)
            if self.operator is not None and r.operator != self.operator:
                continue
            if r.deleted:
                self.table.pop((r.operator, r.key), None)
            else:
                self.table[(r.operator, r.key)] = r.decoded()
        self.positions[partition] = at

    def total(self) -> int:
        """The sum of the integer values in the view (a bank's balances)."""
        return sum(v for v in self.table.values() if isinstance(v, int))


async def follow(
    bootstrap: str,
    topic: str,
    view: ChangelogView,
    *,
    caught_up: asyncio.Event | None = None,
    security: KafkaSecurity | None = None,
) -> None:
    """Feed ``view`` every record of ``topic``, from the start, until cancelled; set ``caught_up`` once
    every partition was read to the high watermark of a fetch (the end as of then)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        group_id=None,
        fetch_max_wait_ms=50,
        **kafka_options(security or KafkaSecurity.from_env()),
    )
    await consumer.start()
    try:
        partitions = sorted(consumer.partitions_for_topic(topic) or ())
        if not partitions:
            await consumer.topics()  # fetches the cluster's metadata
            partitions = sorted(consumer.partitions_for_topic(topic) or ())
        if not partitions:
            raise LookupError(f"no topic {topic!r} on {bootstrap}")
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        while True:
            batches = await consumer.getmany(timeout_ms=_POLL_MS)
            for tp, records in sorted(batches.items(), key=lambda kv: kv[0].partition):
                view.apply(tp.partition, (change_decoder.decode(r.value) for r in records))
            if caught_up is not None and not caught_up.is_set() and await _at_end(consumer, tps):
                caught_up.set()
    finally:
        await consumer.stop()


async def _at_end(consumer: AIOKafkaConsumer, tps: list[TopicPartition]) -> bool:
    for tp in tps:
        hw = consumer.highwater(tp)
        if hw is None or await consumer.position(tp) < hw:
            return False
    return True


async def _main(bootstrap: str, topic: str, operator: str | None) -> None:
    view = ChangelogView(operator)
    caught_up = asyncio.Event()
    task = asyncio.create_task(follow(bootstrap, topic, view, caught_up=caught_up))
    try:
        while not task.done():
            await asyncio.wait([task], timeout=1.0)
            state = "live" if caught_up.is_set() else "catching up"
            print(
                f"{state}: {len(view.table)} entities, total {view.total()}, epoch {view.newest_epoch}",
                flush=True,
            )
        task.result()
    finally:
        task.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m styx_benchmarks.changelog_view", description=__doc__)
    parser.add_argument("bootstrap", help="Kafka bootstrap address (host:port)")
    parser.add_argument(
        "--topic", default="styx-changelog", help="the changelog topic (STYX_CHANGELOG_TOPIC)"
    )
    parser.add_argument("--operator", default=None, help="keep only this operator's entities")
    args = parser.parse_args(argv)
    try:
        asyncio.run(_main(args.bootstrap, args.topic, args.operator))
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
