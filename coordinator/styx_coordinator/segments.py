"""Log segments (:mod:`styx_py.core.segments`): the coordinator starts new ingress and egress
segments every ``log_segment_s`` while epochs run live.

A rotation creates the topics of segment ``k + 1`` (egress first: a client that sees the ingress one
reads the egress one), saves ``k + 1`` as the cluster's newest segment (a restarted coordinator goes
on from there), and from then on every ``EpochStart`` and ``Recover`` names it: workers read ingress
segments ``k - 1 .. k + 1`` and drain ``k - 2``, and send replies to egress segment ``k``. Clients
follow by listing topics (docs/architecture.md, "Log segments").

Nothing rotates while the cluster is not running or no live epoch ran since the last rotation (a
replay's epochs do not count). A rotation starts an epoch even on an idle cluster, so the workers read
the new segment at once, and a coordinator rotates as soon as it runs: the one before may have died
after it created a segment (which clients write to) and before it named it.

The broker failing a rotation (an ``OSError``) leaves the cluster on its segment until the next period;
S3 failing to save the new one leaves it unsaved until the next save. Anything else is a bug and ends
the coordinator.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from styx_coordinator.cluster import Cluster
from styx_coordinator.deploy import TopicCreator
from styx_py.core.ports import Clock
from styx_py.core.segments import segment_topic

__all__ = ["SegmentRotator"]

log = logging.getLogger("styx.coordinator")


class SegmentRotator:
    def __init__(
        self,
        cluster: Cluster,
        clock: Clock,
        create_topics: TopicCreator,
        epoch_now: Callable[[], int],
        save: Callable[[], Awaitable[None]],
        wake: Callable[[], None],
    ) -> None:
        self.cluster = cluster
        self.clock = clock
        self.create_topics = create_topics
        self.epoch_now = epoch_now  # the next epoch to run live (-1 while a replay runs)
        self.save = save
        self.wake = wake  # run an epoch even when no worker has work: it names the new segment
        self.rotations = 0

    async def run(self) -> None:
        period = self.cluster.config.log_segment_s
        c = self.cluster
        await c.deployed.wait()
        # At once, on a fresh cluster and on a restarted coordinator alike: the one before may have
        # created a segment it never named, which clients already write to (and no epoch would start
        # for requests no worker reads).
        while c.state != "running":
            await self.clock.sleep(period)
        await self.rotate()
        last_epoch = self.epoch_now() + 1  # the epoch the rotation starts does not count as work
        while True:
            await self.clock.sleep(period)
            if c.state != "running" or self.epoch_now() <= last_epoch:
                continue  # not while the cluster stops or stands idle (no partition grows)
            await self.rotate()
            last_epoch = self.epoch_now() + 1

    async def rotate(self) -> None:
        """Create segment ``k + 1``, save it, and name it in the epochs that start from now on."""
        c = self.cluster
        k = c.segment + 1
        topic = segment_topic(c.config.ingress_topic, k)
        n = len(c.placement)
        try:
            # Egress first: a client that sees the ingress segment reads the egress one.
            await self.create_topics({segment_topic(c.config.egress_topic, k): n})
            await self.create_topics({topic: n})
        except OSError as exc:  # the broker: the cluster stays on its segment and tries again next period
            log.warning(
                "cannot create ingress segment %s: %s: %s; the cluster stays on segment %d",
                topic,
                type(exc).__name__,
                exc,
                k - 1,
            )
            return
        c.segment = k
        self.rotations += 1
        self.wake()
        try:
            await self.save()
        except OSError as exc:  # S3: a restarted coordinator starts at an older segment and rotates on
            log.warning("saving ingress segment %d failed: %s: %s", k, type(exc).__name__, exc)
        log.info("ingress segment %d (%s) from epoch %d", k, topic, self.epoch_now())
