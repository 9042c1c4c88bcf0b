"""The ports one worker runs on — peers and coordinator, the ingress, egress and sequencer logs, the
log reader recovery uses, the blob store, its clock — and what its core reads of them
(:class:`~styx_worker.effects.PortView`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from styx_py.core.blobs import BlobStore
from styx_py.core.ports import (
    Clock,
    Egress,
    Ingress,
    LogReader,
    LoopClock,
    RequestSink,
    SequencerLog,
    Transport,
)
from styx_py.core.segments import Cursor

__all__ = ["WorkerPorts"]


@dataclass
class WorkerPorts:
    """Everything a worker talks to: peers and the coordinator, the logs, the blob store, its clock."""

    transport: Transport
    ingress: Ingress
    egress: Egress
    seqlog: SequencerLog
    blobs: BlobStore | None = None
    logs: LogReader | None = None
    clock: Clock = field(default_factory=LoopClock)
    # The ingress log for the worker's own requests (external calls' outcomes, due timers): None, no
    # effect runner. ``wall``: the clock due timers are read on and their firings stamped with.
    requests: RequestSink | None = None
    wall: Callable[[], float] = time.time

    # PortView: what the core reads of them
    def pending(self) -> int:
        return self.ingress.pending()

    def positions(self) -> dict[int, Cursor]:
        return self.ingress.positions()

    def egress_offsets(self) -> dict[int, int]:
        return self.egress.offsets()

    def seqlog_acked(self) -> int:
        return self.seqlog.acked()
