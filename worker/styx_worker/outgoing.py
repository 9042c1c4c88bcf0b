"""What leaves a worker for the logs: replies (pushed to subscribed clients too) and changelog records,
each only while the worker's lease holds (a worker that may have been replaced sends nothing more)."""

from __future__ import annotations

from collections.abc import Callable

from styx_py.core.ports import Clock, Egress
from styx_py.core.wire import Reply
from styx_worker import effects as fx
from styx_worker.feed import ReplyFeed
from styx_worker.membership import Membership

__all__ = ["Outgoing"]


class Outgoing:
    def __init__(
        self,
        membership: Membership,
        clock: Clock,
        egress: Egress,
        feed: ReplyFeed,
        on_fenced: Callable[[], None],
    ) -> None:
        self.membership = membership
        self.clock = clock
        self.egress = egress
        self.feed = feed
        self.on_fenced = on_fenced
        self.on_reply: Callable[[Reply], None] | None = None  # told each reply sent (the effect runner)

    def fenced(self) -> bool:
        """Fencing: the lease ran out (then ``on_fenced``, once), or had before."""
        m = self.membership
        if m.enabled and not m.fenced and m.check_lease(self.clock.now()):
            self.on_fenced()
        return m.enabled and m.fenced

    def emit(self, e: fx.Emit) -> None:
        if not self.fenced():
            pushed = bool(e.reply_to) and self.feed.offer(e.reply, e.reply_to)
            self.egress.send(e.partition, e.reply, e.epoch, pushed)
            if self.on_reply is not None:
                self.on_reply(e.reply)

    def changes(self, e: fx.Changes) -> None:
        if not self.fenced():
            for partition, records in e.records.items():
                self.egress.changes(partition, records)
