"""How long the worker's ingress fetch may wait: whether every record comes pushed (pure).

A worker that took no request for :data:`~styx_py.core.limits.INGRESS_IDLE_S` (none fetched, none
pushed) fetches with ``kafka_idle_fetch_wait_ms`` (100 ms) instead: on Tansu every waiting fetch costs
the broker and the worker CPU by the round (one consumer at 5 ms: 12-14 % of a core in the broker and
16 % in the consumer; at 100 ms: 2 % and 1-2 %), so an idle two-worker cluster used 53 % of a core
doing nothing. A pushed request does not wait for the fetch; one that was not pushed waits up to half
the idle wait, once: the first record fetched puts the configured wait back.

While the records come pushed, the fetch only confirms them, and each fetch round costs this worker
and the broker CPU (an idle round on Tansu: ~1 ms of each; Tansu answers a waiting fetch that finds
records after up to half its wait, so its rounds follow the wait: 255 a second at 5 ms, 110 at 25 ms,
for records arriving at 250/s; Apache Kafka answers at once, so its rounds would follow the records).
So once requests have been pushed for ``PUSH_SETTLE_S``, and every record the fetch brought first in
that time was pushed too within ``PUSH_EXCUSE_S``, the fetch waits ``INGRESS_PUSHED_FETCH_WAIT_MS`` and
the loop polls at most every ``INGRESS_PUSHED_POLL_S``; a record that was not pushed (a client that
does not push, a push that was lost) puts the configured wait back for ``PUSH_WINDOW_S``. A request
nobody pushes waits at most one such round, ``INGRESS_PUSHED_POLL_S`` and ~half of
``INGRESS_PUSHED_FETCH_WAIT_MS`` on Tansu, before the wait is short again. (Those bounds, and the
measurements that chose them, are in :mod:`styx_py.core.limits`.)
"""

from __future__ import annotations

from styx_py.core.limits import (
    INGRESS_IDLE_S,
    INGRESS_PUSHED_FETCH_WAIT_MS,
    MAX_UNEXCUSED,
    PUSH_EXCUSE_S,
    PUSH_SETTLE_S,
    PUSH_WINDOW_S,
)
from styx_worker.sources import Source


class PushPace:
    """Whether every record comes pushed, hence how long the ingress fetch may wait (module docstring).

    Pure bookkeeping on a clock the caller reads: :meth:`pushed` for every push, :meth:`fetched` for
    every fetch that brought records, :meth:`fetched_first` for every record the fetch brought before its
    push (only asked while :meth:`tracking`), :meth:`excused` for a push that came after its record was
    fetched, and :meth:`floor_ms` after each fetch. With ``idle_ms``, the wait is that long once no
    record came either way for ``INGRESS_IDLE_S``."""

    def __init__(self, idle_ms: int = 0) -> None:
        self.idle_ms = idle_ms
        self.fetched_at = -float("inf")  # when a fetch last brought records
        # Records the fetch brought first: (source, offset) -> when, in the order they were fetched.
        self.unexcused: dict[tuple[Source, int], float] = {}
        self.pushed_at = -float("inf")  # when a record was last pushed (taken or late)
        self.pushing_since = -float("inf")  # when pushes began after a pause of PUSH_WINDOW_S or more
        self.unpushed_at = -float("inf")  # when a record was last found not pushed
        self.unpushed = 0  # records found not pushed while requests were pushed

    def pushed(self, now: float) -> None:
        if now - self.pushed_at >= PUSH_WINDOW_S:
            self.pushing_since = now  # watched from now on: PUSH_SETTLE_S of it before the wait is longer
        self.pushed_at = now

    def fetched(self, now: float) -> None:
        self.fetched_at = now

    def tracking(self, now: float) -> bool:
        """Requests are pushed: whether every one is, is worth finding out."""
        return now - self.pushed_at < PUSH_WINDOW_S

    def fetched_first(self, src: Source, offset: int, now: float) -> None:
        self.unexcused[src, offset] = now

    def excused(self, src: Source, offset: int) -> None:
        """The record at ``offset`` of ``src`` was pushed after the fetch brought it."""
        self.unexcused.pop((src, offset), None)

    def forget(self, src: Source) -> None:
        """``src`` is read from another offset, or no more: its records fetched first are moot."""
        if any(key[0] == src for key in self.unexcused):
            self.unexcused = {key: t for key, t in self.unexcused.items() if key[0] != src}

    def floor_ms(self, now: float) -> int:
        """The least fetch wait now: ``idle_ms`` once no record came for ``INGRESS_IDLE_S``;
        ``INGRESS_PUSHED_FETCH_WAIT_MS`` while records are pushed, have been for ``PUSH_SETTLE_S``, and none
        was found not pushed for ``PUSH_WINDOW_S``; else 0 (the configured wait)."""
        unexcused = self.unexcused
        if unexcused:
            expired = []
            for key, since in unexcused.items():  # oldest first
                if now - since < PUSH_EXCUSE_S and len(unexcused) <= MAX_UNEXCUSED:
                    break
                expired.append(key)
            if expired:
                self.unpushed_at = now
                self.unpushed += len(expired)
                for key in expired:
                    del unexcused[key]
        floor = 0
        if (
            now - self.pushed_at < PUSH_WINDOW_S
            and now - self.pushing_since >= PUSH_SETTLE_S
            and now - self.unpushed_at >= PUSH_WINDOW_S
        ):
            floor = INGRESS_PUSHED_FETCH_WAIT_MS
        if now - max(self.fetched_at, self.pushed_at) >= INGRESS_IDLE_S:
            floor = max(floor, self.idle_ms)
        return floor
