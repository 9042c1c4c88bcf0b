"""Has the broker gone back on what it told this worker? (:mod:`styx_py.core.logmarks`, the worker's side)

A healthy broker never moves a partition's end backwards and never stores a new record below one it
acknowledged. One that lost its log (Tansu in memory after a restart) does both, silently: a consumer
positioned past its new end waits for ever, a producer's next record lands at offset 0. So the worker
keeps, per partition it reads or writes, the highest offset the broker vouched for (a fetch's high
watermark, the position it was told to read from, a record acknowledged) and compares every new word
of the broker with it. A regression calls ``on_lost`` once, with a line naming the log, what was
recorded and where the broker ends; the worker then tells the coordinator and runs nothing more
(:meth:`styx_worker.shell.Worker.log_lost`): no reply leaves after the loss, since an epoch's replies
wait for its sequencer-log entry, and that append is the one that regressed.

Checked once per fetch poll and per acknowledged produce batch, never per transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from styx_py.core.logmarks import LogMark, regressed

__all__ = ["LogWatch"]

log = logging.getLogger("styx.worker")


def _unwired(what: str) -> None:
    raise AssertionError(f"the broker lost the log and nobody listens: {what}")


class LogWatch:
    def __init__(self, label: str) -> None:
        self.label = label  # "ingress", "egress", "sequencer log"
        # (topic, partition) -> every offset below it held a record
        self.marks: dict[tuple[str, int], int] = {}
        self.lost = ""  # what was lost, once
        self.on_lost: Callable[[str], None] = _unwired

    def vouched(self, topic: str, partition: int, offset: int) -> None:
        """The broker held every offset below ``offset`` (a position read from, a record fetched)."""
        key = (topic, partition)
        if offset > self.marks.get(key, 0):
            self.marks[key] = offset

    def end(self, topic: str, partition: int, end: int) -> bool:
        """A fetch says the partition ends at ``end``: True (and ``on_lost`` called) if that is below
        what the broker vouched for; else ``end`` is vouched for from now on."""
        recorded = self.marks.get((topic, partition), 0)
        if (lost := regressed(LogMark(self.label, topic, partition, recorded), end)) is not None:
            self._lose(lost)
            return True
        self.vouched(topic, partition, end)
        return False

    def stored(self, topic: str, partition: int, offset: int) -> bool:
        """A produce was acknowledged at ``offset``: True (and ``on_lost`` called) if a record this
        worker had acknowledged there or later is gone (a new one cannot land below it)."""
        recorded = self.marks.get((topic, partition), 0)
        if offset < recorded:
            self._lose(
                f"{self.label} {topic} partition {partition}: acknowledged up to offset {recorded - 1}, "
                f"the broker stored a new record at {offset}"
            )
            return True
        self.vouched(topic, partition, offset + 1)
        return False

    def _lose(self, what: str) -> None:
        if not self.lost:
            self.lost = what
            log.critical("the broker lost the log: %s", what)
            self.on_lost(what)
