"""The log-loss check over the simulation's in-memory log (:class:`~styx_py.core.ports.LogGuard`).

The in-memory log keeps everything, so in the simulation this check must never find a loss: every
recovery of every seeded run asks it, which makes the sweeps a test of the check against false alarms.
:meth:`MemoryLog.wipe`-like faults (a test emptying ``log.topics``) show it finds a real one.
"""

from __future__ import annotations

from collections.abc import Sequence

from styx_py.core.logmarks import LogMark, losses, marker_loss, marker_topic
from styx_py.testing.memory import MemoryLog

__all__ = ["MemoryLogGuard"]


class MemoryLogGuard:
    def __init__(self, log: MemoryLog, seqlog_topic: str) -> None:
        self.log = log
        self.topic = marker_topic(seqlog_topic)
        self.stamped = 0  # ids given out: deterministic, as everything in the simulation

    async def stamp(self) -> str:
        self.stamped += 1
        cluster_id = f"sim-{self.stamped}"
        self.log.create(self.topic, 1)
        self.log.append(self.topic, 0, cluster_id.encode())
        return cluster_id

    async def lost(self, cluster_id: str, recorded: Sequence[LogMark]) -> list[str]:
        topics = self.log.topics
        found = [bytes(v) for v in topics[self.topic][0]] if self.topic in topics else None
        ends = {
            (m.topic, m.partition): len(topics[m.topic][m.partition])
            for m in recorded
            if m.topic in topics and m.partition < len(topics[m.topic])
        }
        marker = marker_loss(self.topic, cluster_id, found)
        return [*([marker] if marker else []), *losses(recorded, set(topics), ends)]
