"""Answering a resent request id from its earlier reply instead of executing it again.

Per partition, the replies already given are kept (bounded: the oldest are forgotten first, in
commit order, so eviction is deterministic) and travel with the snapshots. A request id that arrives
again is answered with the identical reply; one that arrives while its first copy is still running
(in the same batch, or rescheduled) waits for that copy's reply.
"""

from __future__ import annotations

from collections import OrderedDict

from styx_py.core.wire import Reply


class ReplyTable:
    def __init__(self, cap_per_partition: int) -> None:
        self.cap = cap_per_partition
        self.replies: dict[int, OrderedDict[str, Reply]] = {}
        self.delta: dict[int, list[Reply]] = {}

    def get(self, partition: int, request_id: str) -> Reply | None:
        table = self.replies.get(partition)
        return None if table is None else table.get(request_id)

    def record(self, partition: int, reply: Reply, *, as_delta: bool = True) -> None:
        table = self.replies.get(partition)
        if table is None:
            table = self.replies[partition] = OrderedDict()
        table[reply.request_id] = reply
        table.move_to_end(reply.request_id)
        while len(table) > self.cap:
            table.popitem(last=False)
        if as_delta:
            self.delta.setdefault(partition, []).append(reply)

    def take_delta(self) -> dict[int, list[Reply]]:
        delta, self.delta = self.delta, {}
        return delta

    def move(self, gone: set[int], gained: ReplyTable) -> None:
        """Partitions moved (a shape change): forget those in ``gone``, take over ``gained``'s."""
        for p in gone:
            self.replies.pop(p, None)
            self.delta.pop(p, None)
        self.replies.update(gained.replies)

    def restore_delta(self, delta: dict[int, list[Reply]]) -> None:
        """A snapshot failed: its replies go into the next one (older first)."""
        for p, replies in delta.items():
            self.delta[p] = replies + self.delta.get(p, [])

    def __len__(self) -> int:
        return sum(len(t) for t in self.replies.values())
