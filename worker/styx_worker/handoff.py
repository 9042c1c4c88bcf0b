"""Moving a partition at a planned shape change straight from its old owner to its new one.

At a barrier (styx_coordinator.reshape) every worker finished the last epoch ``E`` and none starts
another until the new placement holds. The new generation's view says who owns what; each worker
that loses a partition sends it to the new owner as :class:`~styx_py.core.wire.Handoff` pieces:
its entities, the writes and replies no complete snapshot holds yet (so the partition's chain of
snapshot objects stays whole: the new owner's next snapshot carries them), its reply table, its
ingress position, its rescheduled and waiting requests. The new owner installs them when the
``Recover(keep=True)`` of that generation comes. Nothing goes through S3 and nothing is replayed:
the move is one step in the serial order, between epoch ``E`` and ``E + 1``.

A piece that does not come (its sender died) or says ``epoch = -1`` (its sender's state is not the
barrier's) fails the new owner's recovery; the coordinator then recovers in full from the last
complete snapshot and the logs, which is correct for any placement.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from styx_py.core import limits
from styx_py.core.partitioning import partition_of
from styx_py.core.segments import Cursor
from styx_py.core.wire import Handoff, IngressRecord, Key, Reply
from styx_worker.dedup import ReplyTable
from styx_worker.snapshot import HeldRow, ResumeRow, rows_by_partition
from styx_worker.state import StateStore
from styx_worker.txn import RootTxn

__all__ = ["HandoffRefused", "Moved", "Pieces", "outgoing", "pieces", "refusal"]

_ENTRY_OVERHEAD_BYTES = 16  # msgpack framing of one (operator, key, value) triple, roughly


def outgoing(
    gen: int,
    epoch: int,
    new_owner: dict[int, str],
    op_partitions: dict[str, int],
    store: StateStore,
    answered: ReplyTable,
    positions: dict[int, Cursor],
    rescheduled: list[RootTxn],
    waiting: list[IngressRecord],
    egress_offsets: dict[int, int],
) -> list[tuple[str, Handoff]]:
    """Every piece of the partitions in ``new_owner`` (partition -> its new owner), with where each
    goes; raises :class:`HandoffRefused` when one worker would get more than
    :data:`~styx_py.core.limits.MAX_HANDOFF_BYTES` (a connection buffers what is sent at once)."""
    data: dict[int, list[tuple[str, Key, bytes]]] = {p: [] for p in new_owner}
    delta: dict[int, list[tuple[str, Key, bytes | None]]] = {p: [] for p in new_owner}
    for (op, key), value in store.items():
        if (p := partition_of(key, op_partitions[op])) in data:
            data[p].append((op, key, value))
    for (op, key), maybe in store.delta.items():
        if (p := partition_of(key, op_partitions[op])) in delta:
            delta[p].append((op, key, maybe))
    to: dict[str, int] = {}
    for p, dest in new_owner.items():
        to[dest] = to.get(dest, 0) + size_of(data[p]) + size_of(delta[p])
    if max(to.values(), default=0) > limits.MAX_HANDOFF_BYTES:
        raise HandoffRefused(
            f"{max(to.values())} bytes to one worker (MAX_HANDOFF_BYTES={limits.MAX_HANDOFF_BYTES})"
        )
    resched, held = rows_by_partition(
        new_owner, [(t.partition, t.tid, t.offset, t.ts_ms, t.request) for t in rescheduled], waiting
    )
    out: list[tuple[str, Handoff]] = []
    for p, dest in sorted(new_owner.items()):
        replies = list(answered.replies.get(p, {}).values())
        reply_delta = list(answered.delta.get(p, []))
        cursor = positions.get(p, {})
        for piece in pieces(
            gen,
            p,
            epoch,
            data[p],
            delta[p],
            replies,
            reply_delta,
            cursor,
            resched[p],
            held[p],
            egress_offsets,
        ):
            out.append((dest, piece))
    return out


def pieces(
    gen: int,
    partition: int,
    epoch: int,
    data: list[tuple[str, Key, bytes]],
    delta: list[tuple[str, Key, bytes | None]],
    replies: list[Reply],
    reply_delta: list[Reply],
    cursor: Cursor,
    rescheduled: list[ResumeRow],
    waiting: list[HeldRow],
    egress_offsets: dict[int, int],
    piece_bytes: int | None = None,
) -> list[Handoff]:
    """A partition as Handoff pieces (pure): entities and delta entries split by size (about
    ``piece_bytes``, :data:`~styx_py.core.limits.HANDOFF_PIECE_BYTES` by default), the rest on the last
    piece."""
    piece_bytes = piece_bytes or limits.HANDOFF_PIECE_BYTES
    chunks: list[tuple[list[tuple[str, Key, bytes]], list[tuple[str, Key, bytes | None]]]] = []
    cur_data: list[tuple[str, Key, bytes]] = []
    cur_delta: list[tuple[str, Key, bytes | None]] = []
    size = 0

    def cut() -> None:
        nonlocal cur_data, cur_delta, size
        chunks.append((cur_data, cur_delta))
        cur_data, cur_delta, size = [], [], 0

    for entry in data:
        if size >= piece_bytes:
            cut()
        cur_data.append(entry)
        size += _size(entry)
    for d in delta:
        if size >= piece_bytes:
            cut()
        cur_delta.append(d)
        size += _size(d)
    cut()
    n = len(chunks)
    out = [Handoff(gen, partition, epoch, i, n, d, dl) for i, (d, dl) in enumerate(chunks)]
    last = out[-1]
    last.replies, last.reply_delta = replies, reply_delta
    last.position, last.cursor = cursor.get(0, 0), dict(sorted(cursor.items()))
    last.rescheduled, last.waiting, last.egress_offsets = rescheduled, waiting, egress_offsets
    return out


def refusal(gen: int, partition: int) -> Handoff:
    """The old owner cannot hand ``partition`` off: its new owner's recovery fails, a full one follows."""
    return Handoff(gen, partition, -1, 0, 1, [], [])


def size_of(entries: Iterable[tuple[str, Key, bytes | None]]) -> int:
    """About how many bytes ``entries`` take in a piece."""
    return sum(_size(e) for e in entries)


def _size(entry: tuple[str, Key, bytes | None]) -> int:
    op, key, value = entry
    return (
        len(op)
        + (len(key) if isinstance(key, str) else 8)
        + (len(value) if value else 0)
        + _ENTRY_OVERHEAD_BYTES
    )


@dataclass
class Moved:
    """A partition as its new owner installs it (every piece arrived): the entities and delta
    entries of all pieces, and the last piece, which carries the rest."""

    partition: int
    data: list[tuple[str, Key, bytes]]
    delta: list[tuple[str, Key, bytes | None]]
    last: Handoff


class Pieces:
    """Pieces received, by generation and partition, until the recovery of their generation takes
    them (they may come before its view: senders act on the view as soon as they have it)."""

    def __init__(self) -> None:
        self.pieces: dict[int, dict[int, dict[int, Handoff]]] = {}  # gen -> partition -> part -> piece
        self.changed = asyncio.Event()

    def add(self, msg: Handoff, current_gen: int) -> None:
        if msg.gen < current_gen:
            return  # of a generation that is over
        self.pieces.setdefault(msg.gen, {}).setdefault(msg.partition, {})[msg.part] = msg
        self.changed.set()

    def forget_before(self, gen: int) -> None:
        for g in [g for g in self.pieces if g < gen]:
            del self.pieces[g]

    def _arrived(self, gen: int, partition: int) -> bool:
        """Every piece of ``partition`` is here (raises at once for a refused one)."""
        got = self.pieces.get(gen, {}).get(partition, {})
        if 0 not in got:
            return False
        if got[0].epoch < 0:
            raise HandoffRefused(f"the old owner of partition {partition} could not hand it off")
        return len(got) >= got[0].parts

    async def take(self, gen: int, partitions: Iterable[int], epoch: int) -> dict[int, Moved]:
        """Every piece of ``partitions`` for generation ``gen`` (waits for them; the recovery's
        timeout bounds the wait); raises :class:`HandoffRefused` for a refused or stale one."""
        wanted = sorted(partitions)
        while not all([self._arrived(gen, p) for p in wanted]):  # every one looked at: refusals raise
            self.changed.clear()
            await self.changed.wait()
        moved: dict[int, Moved] = {}
        for p in wanted:
            got = self.pieces[gen].pop(p)
            ordered = [got[i] for i in range(got[0].parts)]
            if ordered[0].epoch != epoch:
                at = ordered[0].epoch
                raise HandoffRefused(f"partition {p} was handed off at epoch {at}, not {epoch}")
            data = [entry for piece in ordered for entry in piece.data]
            delta = [entry for piece in ordered for entry in piece.delta]
            moved[p] = Moved(p, data, delta, ordered[-1])
        return moved


class HandoffRefused(Exception):
    """A partition cannot be taken over as it is: the recovery fails and a full one follows."""
