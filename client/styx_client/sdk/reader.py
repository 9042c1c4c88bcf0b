"""The Kafka transport's egress reader: one consumer loop over the client's reply partitions.

Every record goes to the client (``TransportEvents.from_log``), whose core skips the copies of replies
already taken, decodes the rest and settles their waiters. Between two polls the reader switches to the
egress segments the client follows (:meth:`EgressReader.follow`), and while the core's
:class:`~styx_client.sdk.resting.EgressRest` allows it, it rests instead of polling.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from styx_client.sdk.resting import EgressRest
from styx_client.sdk.stats import ClientStats
from styx_client.sdk.transport import TransportEvents
from styx_py.core.limits import EGRESS_POLL_MS, EGRESS_REST_S
from styx_py.io.fetching import FetchWait

__all__ = ["EgressReader"]


class EgressReader:
    """The consumer loop (:meth:`run`) and what it reads (:meth:`follow`)."""

    def __init__(
        self,
        consumer: Any,
        topic: str,
        events: TransportEvents,
        stats: ClientStats,
        rest: EgressRest | None,
        healthy: Callable[[], bool],
        wait_floor_ms: Callable[[], int] | None,
    ) -> None:
        self.consumer = consumer
        self.topic = topic
        self.events = events
        self.stats = stats
        self.rest = rest
        self.healthy = healthy  # every worker pushes to the client (styx_client.sdk.push)
        self.wait_floor_ms = wait_floor_ms
        # The egress partitions the reader should read (it switches between two polls), and whether it
        # reads exactly those.
        self.wanted: list[Any] = list(consumer.assignment())
        self.settled = True

    def follow(self, wanted: list[Any]) -> None:
        """Read ``wanted`` from the next poll on (:meth:`_switch`)."""
        self.wanted = wanted
        self.settled = False

    async def run(self) -> None:
        """Read until cancelled: each record to the client; the fetch wait is the consumer's own, raised
        if the broker starves it, and at least ``wait_floor_ms()`` (longer while the workers push the
        replies, styx_client.sdk.push)."""
        consumer, events = self.consumer, self.events
        wait = FetchWait.of(
            consumer, f"replies {self.topic}"
        )  # raised if the broker starves it (Tansu on S3)
        while True:
            if not self.settled:
                await self._switch()
            if self.rest is not None and await self._rest():
                await asyncio.sleep(EGRESS_REST_S)
                continue
            if self.wait_floor_ms is not None:
                wait.at_least(consumer, self.wait_floor_ms())
            batches = await consumer.getmany(timeout_ms=EGRESS_POLL_MS)
            await wait.after_poll(consumer, batches)
            for records in batches.values():
                for record in records:
                    events.from_log(record.key, record.value)

    async def _switch(self) -> None:
        """Read the egress segments :meth:`follow` chose, a new one from its start; one no longer chosen
        only once read to its end (workers stopped writing to it a rotation ago)."""
        consumer = self.consumer
        have = set(consumer.assignment())
        want = set(self.wanted)
        self.settled = want == have
        if want == have:
            return
        for tp in have - want:
            hw = consumer.highwater(tp)
            if hw is None or await consumer.position(tp) < hw:
                want.add(tp)  # not read to its end yet
        if want == have:
            return
        self.settled = want == set(self.wanted)
        positions = {tp: await consumer.position(tp) for tp in have & want}
        consumer.assign(sorted(want))
        for tp in want:
            consumer.seek(tp, positions.get(tp, 0))

    async def _rest(self) -> bool:
        """Rest (pause the partitions, moved past what may be skipped) and say so, or make sure the
        consumer reads (False)."""
        rest, consumer = self.rest, self.consumer
        assert rest is not None
        assigned = consumer.assignment()
        now, wall_ms = time.monotonic(), time.time_ns() // 1_000_000
        if not rest.may_rest(self.healthy(), self.settled, now, wall_ms):
            if rest.resting:
                consumer.resume(*assigned)
                rest.resting = False
            return False
        for tp, end in rest.skips(assigned).items():
            position = await consumer.position(tp)
            if end > position:
                consumer.seek(tp, end)
                self.stats.egress_skipped += end - position
        consumer.pause(*assigned)
        rest.resting = True
        return True
