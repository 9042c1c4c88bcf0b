"""Consumer fetch waits that adapt to the broker: a consumer the broker starves waits longer.

Tansu on S3 storage (``styx up --durable``) answers a fetch by listing every stored batch object of
the partition, and when the listing takes longer than the fetch's remaining max-wait it gives up and
answers *empty*, with a high watermark ahead of the position (Tansu 0.6.0: ``elapsed > max_wait`` in
its S3 fetch; measured with an S3-counting proxy, docs/operations.md "Durable mode"). The listing
grows with the partition's history: 4 to 7 ms at 100 batches, ~20 ms at 500, ~50 ms per 1 000-key page
on SeaweedFS. A consumer with a 5 ms wait (what low latency wants) is therefore answered empty for
ever once its partition holds a few hundred batches: it spins, S3 burns cores on listings, and no
record ever arrives (with a fixed 5 ms wait, the epochs of a durable cluster at 100/s stop after ~18 s).
Apache Kafka and Tansu in memory never answer empty while records wait.

:class:`FetchWait` detects the starvation from outside: a partition whose high watermark stays ahead
of the consumer's position, with the position not moving, for :data:`STARVED_FETCH_PATIENCE_S` (or four
fetch waits, if longer) of polling, doubles the consumer's fetch wait, up to :data:`MAX_FETCH_WAIT_MS`.
It never shrinks it again: the listing only grows. A longer wait costs latency only when the partition is idle
(Tansu notices a record that arrives during a waiting fetch after up to half the wait); a busy partition
is answered as soon as the listing is done.

The verdict is on time, not on a count of polls: a consumer whose other partitions bring records polls
faster than one partition's fetch round trip, so two polls in a row can see the same partition behind
its high watermark on any broker (seen on Tansu in memory at a few hundred requests per second, where
raising the wait only added latency). And the check runs at most every :data:`STARVED_FETCH_CHECK_S`, since it
asks the consumer for positions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from aiokafka import TopicPartition

from styx_py.core.limits import MAX_FETCH_WAIT_MS, STARVED_FETCH_CHECK_S, STARVED_FETCH_PATIENCE_S

__all__ = ["MAX_FETCH_WAIT_MS", "FetchWait", "set_fetch_wait"]

log = logging.getLogger("styx.kafka")


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

    def __init__(
        self,
        wait_ms: int,
        name: str,
        cap_ms: int = MAX_FETCH_WAIT_MS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.wait_ms = wait_ms
        self.cap_ms = max(cap_ms, wait_ms)
        self.name = name  # for the log line
        self.clock = clock
        self.raised = 0  # times the wait was doubled
        self.floor_ms = 0  # the least wait the owner wants now (:meth:`at_least`)
        self._applied = wait_ms  # the wait the consumer uses now
        # partition -> (the position it is behind at, since when)
        self._behind: dict[Hashable, tuple[int, float]] = {}
        self._checked = -float("inf")  # when after_poll last looked

    @property
    def patience_s(self) -> float:
        return max(STARVED_FETCH_PATIENCE_S, 4 * self.wait_ms / 1000)

    def observe(self, starving: Mapping[Hashable, int], now: float) -> bool:
        """One look at the consumer at ``now`` (pure). ``starving``: the partitions behind their high
        watermark, with their position. True when the wait was doubled: some partition has been
        behind at the same position for :attr:`patience_s`."""
        behind: dict[Hashable, tuple[int, float]] = {}
        for p, pos in starving.items():
            was = self._behind.get(p)
            behind[p] = was if was is not None and was[0] == pos else (pos, now)
        self._behind = behind
        stuck = [p for p, (_, since) in behind.items() if now - since >= self.patience_s]
        if not stuck or self.wait_ms >= self.cap_ms:
            return False
        self.wait_ms = min(self.cap_ms, self.wait_ms * 2)
        self.raised += 1
        self._behind = {}  # the next verdict is on the new wait
        log.warning(
            "%s: the broker answered empty fetches for %.2f s although records wait at %s: fetch wait "
            "raised to %d ms",
            self.name,
            self.patience_s,
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
        """Observe ``consumer`` after one ``getmany`` and apply a raised wait; True when it was raised.

        Looks at most every :data:`STARVED_FETCH_CHECK_S`; a consumer that did not poll for longer than the
        patience (paused) starts its verdict afresh. ``positions`` (next offset per partition) saves
        asking the consumer when the caller knows them. Call it only after a poll that was not cut
        short by ``max_records``."""
        now = self.clock()
        if now - self._checked < STARVED_FETCH_CHECK_S:
            return False
        if now - self._checked > self.patience_s:
            self._behind = {}  # not polled for a while: what it saw then says nothing about the broker
        self._checked = now
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
        if not self.observe(starving, now):
            return False
        self._apply(consumer)
        return True

    def at_least(self, consumer: Any, floor_ms: int) -> None:
        """Let ``consumer`` wait at least ``floor_ms`` per fetch from its next one (0: no floor): the
        consumer's wait is the larger of the floor and the starvation-raised wait."""
        self.floor_ms = floor_ms
        self._apply(consumer)

    @property
    def applied_ms(self) -> int:
        """The wait the consumer uses now."""
        return self._applied

    def _apply(self, consumer: Any) -> None:
        wanted = max(self.wait_ms, self.floor_ms)
        if wanted != self._applied:
            set_fetch_wait(consumer, wanted)
            self._applied = wanted
