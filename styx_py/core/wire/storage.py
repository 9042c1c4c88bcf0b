"""Objects in S3: a partition's snapshot delta, the manifest of a complete snapshot, the
coordinator's durable state."""

from __future__ import annotations

import msgspec

from styx_py.core.graph import GraphVersion
from styx_py.core.logmarks import LogMark
from styx_py.core.wire.codes import Key
from styx_py.core.wire.logs import Reply, Request


class PartitionSnapshot(msgspec.Struct, array_like=True):
    """One partition's part of a snapshot: its committed writes since the previous snapshot, where
    its ingress consumption stands, its rescheduled transactions and its egress position."""

    epoch: int
    partition: int
    writes: list[tuple[str, Key, bytes | None]]
    position: int  # next ingress offset to take
    rescheduled: list[tuple[int, int, int, Request]]  # (tid, offset, ts_ms, request)
    egress_offset: int  # every reply of this partition below it belongs to an epoch <= ``epoch``
    seqlog_offset: int  # every sequencer-log entry of an epoch > ``epoch`` lies at or above it
    replies: list[Reply] = []  # replies given since the previous snapshot (resent ids are answered)
    waiting: list[tuple[int, int, Request]] = []  # (offset, ts_ms, request): resent while running
    # Egress partition -> offset at or above which lies every reply the capturing worker sends after
    # the snapshot (replies go to the partition their client reads, so a worker sends to all of them).
    # Empty in snapshots written before reply routing: ``{partition: egress_offset}`` then.
    egress_offsets: dict[int, int] = {}
    # Ingress segment -> next offset to take (styx_py.core.segments); empty in parts written before
    # segments: ``{0: position}`` then. ``position`` is segment 0's.
    cursor: dict[int, int] = {}


class Manifest(msgspec.Struct, array_like=True):
    """A complete snapshot: for each partition, the objects that rebuild it, applied in epoch order
    (a compacted base first, then deltas)."""

    epoch: int  # -1: no snapshot yet (recover from the beginning of the logs)
    lc: int
    n_partitions: int
    deltas: dict[int, list[str]]
    epoch_generations: list[tuple[int, int]]  # (first epoch, generation) of every generation so far
    seqlog_offset: int = 0  # where recovery starts reading the sequencer log
    # Offsets the snapshot's workers say the broker held (core.logmarks): checked at start and recovery.
    marks: list[LogMark] = []

    def generation_of(self, epoch: int) -> int:
        """The generation that ran ``epoch`` (each recovery starts a generation at some epoch)."""
        gen = 0
        for first, g in self.epoch_generations:
            if first <= epoch:
                gen = g
        return gen


class ClusterMeta(msgspec.Struct, array_like=True):
    """The coordinator's durable state (in S3): enough for a restarted coordinator to resume."""

    graph_path: str
    placement: list[str]
    workers: list[str]
    gen: int
    epoch_generations: list[tuple[int, int]]
    degraded: str = ""  # why the cluster stopped for good (a replay diverged); "" while healthy
    n_seq: int = 0  # sequencer-id space (see ClusterView.n_seq); 0: len(workers)
    # Every committed graph version, in deploy order (``graph_path`` is the last one's); empty in
    # state saved before code updates: ``graph_path`` ran every epoch then.
    versions: list[GraphVersion] = []
    segment: int = 0  # the newest ingress segment (styx_py.core.segments)
    # The cluster's incarnation marker (styx_py.core.logmarks): its id, on the broker since deploy
    # ("" in state saved before markers: not checked), and whether it stopped because the broker lost
    # its log (``degraded`` says what was lost).
    cluster_id: str = ""
    log_lost: bool = False
