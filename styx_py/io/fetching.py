"""Consumer fetch waits that adapt to the broker: a consumer the broker starves waits longer.

Tansu on S3 storage (``styx up --durable``) answers a fetch by listing every stored batch object of
the partition, and when the listing takes longer than the fetch's remaining max-wait it gives up and
answers *empty*, with a high watermark ahead of the position (Tansu 0.6.0: ``elapsed > max_wait`` in
its S3 fetch; measured with an S3-counting proxy, docs/operations.md "Durable mode"). The listing
grows with the partition's history: 4 to 7 ms at 100 batches, ~20 ms at 500, ~50 ms per 1 000-key page
on SeaweedFS. A consumer with a 5 ms wait (what low latency wants) is therefore answered empty for
ever once its partition holds a few hundred batches: it spins, S3 burns cores on listings, and no
record ever arrives (issue 16: the epochs of a durable cluster stopped after ~18 s at 100/s).
Apache Kafka and Tansu in memory never answer empty while records wait.

:class:`FetchWait` detects the starvation from outside (a poll brings nothing for a partition whose
high watermark is ahead of the position, twice at the same position) and doubles the consumer's fetch
wait, up to :data:`MAX_FETCH_WAIT_MS`. It never shrinks it again: the listing only grows. A longer
wait costs latency only when the partition is idle (Tansu notices a record that arrives during a
waiting fetch after up to half the wait); a busy partition is answered as soon as the listing is done.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping
from typing import Any

from aiokafka import TopicPartition

__all__ = ["MAX_FETCH_WAIT_MS", "FetchWait", "set_fetch_wait"]

log = logging.getLogger("styx.kafka")

# aiokafka's request timeout is 40 s; a broker that needs more than this to list a partition is not
# usable anyway.
MAX_FETCH_WAIT_MS = 10_000


def set_fetch_wait(consumer: Any, wait_ms: int) -> None:
    """Change a started aiokafka consumer's ``fetch_max_wait_ms`` (used from its next fetch request).

    aiokafka has no public setter; its fetcher reads this attribute whenever it builds a request
    (aiokafka 0.14 ``Fetcher._create_fetch_requests``)."""
    fetcher = consumer._fetcher
    assert hasattr(fetcher, "_fetch_max_wait_ms"), "aiokafka's fetcher changed: no _fetch_max_wait_ms"
    fetcher._fetch_max_wait_ms = wait_ms


class FetchWait:
    """The fetch wait of one consumer, raised when the broker starves it (module docstring)."""

    @classmethod
    def of(cls, consumer: Any, name: str) -> FetchWait:
        """Starting from the wait a started aiokafka ``consumer`` was built with."""
        return cls(consumer._fetcher._fetch_max_wait_ms, name)

    def __init__(self, wait_ms: int, name: str, cap_ms: int = MAX_FETCH_WAIT_MS) -> None:
        self.wait_ms = wait_ms
        self.cap_ms = max(cap_ms, wait_ms)
        self.name = name  # for the log line
        self.raised = 0  # times the wait was doubled
        self._behind: dict[Hashable, int] = {}  # partition -> position it starved at in the last poll

    def observe(self, starving: Mapping[Hashable, int]) -> bool:
        """One poll's verdict (pure). ``starving``: the partitions the poll brought nothing for although
        the broker's high watermark is ahead of their position, with that position. True when the
        wait was doubled: some partition starved at the same position in two polls in a row."""
        stuck = [p for p, pos in starving.items() if self._behind.get(p) == pos]
        self._behind = dict(starving)
        if not stuck or self.wait_ms >= self.cap_ms:
            return False
        self.wait_ms = min(self.cap_ms, self.wait_ms * 2)
        self.raised += 1
        self._behind = {}  # the next verdict is on the new wait
        log.warning(
            "%s: the broker answered empty fetches although records wait at %s: fetch wait raised to %d ms",
            self.name,
            stuck[0],
            self.wait_ms,
        )
        return True

    async def after_poll(
        self,
        consumer: Any,
        polled: Mapping[TopicPartition, list[Any]],
        positions: Mapping[TopicPartition, int] | None = None,
    ) -> bool:
        """Observe one ``getmany`` of ``consumer`` and apply a raised wait; True when it was raised.

        ``positions`` (next offset per partition) saves asking the consumer when the caller knows them.
        Call it only after a poll that was not cut short by ``max_records``."""
        starving: dict[Hashable, int] = {}
        for tp in consumer.assignment():
            if polled.get(tp):
                continue
            high = consumer.highwater(tp)
            if high is None:
                continue  # no fetch answered yet
            known = None if positions is None else positions.get(tp)
            position = known if known is not None else await consumer.position(tp)
            if position < high:
                starving[tp] = position
        if not self.observe(starving):
            return False
        set_fetch_wait(consumer, self.wait_ms)
        return True
