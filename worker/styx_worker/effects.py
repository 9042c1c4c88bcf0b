"""What goes into the worker's core and what comes out of it.

The core (:mod:`styx_worker.core`, :mod:`styx_worker.epoch`) is plain synchronous code:
``core.step(event)`` returns the effects the event calls for, and the shell (:mod:`styx_worker.shell`)
carries them out over the ports, in order. Events are the wire messages themselves, plus the four
below, which the shell makes; effects are the classes after them. Nothing here does anything.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from styx_py.core.changelog import ChangeRecord
from styx_py.core.graph import GraphVersion
from styx_py.core.logmarks import LogMark
from styx_py.core.segments import Cursor
from styx_py.core.wire import IngressRecord, Invoke, Message, Reply, SeqLogEntry, Status
from styx_worker.ackshare import Share
from styx_worker.txn import CachedInvocation, CallRecord, TxnView

__all__ = [
    "Assign",
    "Called",
    "Changes",
    "Closed",
    "Deliver",
    "Effect",
    "Emit",
    "Event",
    "Fetch",
    "Halt",
    "Invoked",
    "Live",
    "Load",
    "Log",
    "LogAcked",
    "Outbox",
    "PortView",
    "ReportFenced",
    "Run",
    "Send",
    "SlotKey",
    "Take",
    "Taken",
    "Upload",
]

SlotKey = tuple[int, int, tuple[int, ...]]  # (phase, tid, path): a synchronous call's result


# ---- events: what the shell feeds the core besides messages ------------------------------------------
class Invoked(msgspec.Struct):
    """An invocation ran to its end (:func:`styx_worker.executor.run_invocation`): its outcome, the share
    it kept, the asynchronous calls it made (to dispatch now) and every call it made (for the cache)."""

    inv: Invoke
    status: Status
    error: str
    value: msgspec.Raw
    own: Share
    children: list[Invoke]
    calls: list[CallRecord]


class Called(msgspec.Struct):
    """A running invocation made a synchronous call (or, in Phase.SERIAL, an ordered asynchronous one)."""

    child: Invoke


class LogAcked(msgspec.Struct):
    """The sequencer-log entry of this worker's batch of ``epoch`` is durable."""

    epoch: int
    gen: int


class Taken(msgspec.Struct):
    """The ingress records a :class:`Take` or :class:`Fetch` asked for. Of a ``Take``'s, the first
    ``admitted`` new requests run and the rest are refused (styx_worker.admission); -1: every one
    runs. So is a new request that would join its root entity's queue of rescheduled transactions
    more than ``depth_max`` deep (-1: no bound; :meth:`styx_worker.batch.BatchFormer.form`)."""

    request: Take | Fetch
    records: list[IngressRecord]
    admitted: int = -1
    depth_max: int = -1

    @property
    def epoch(self) -> int:
        return self.request.epoch

    @property
    def gen(self) -> int:
        return self.request.gen


Event = Message | Invoked | Called | LogAcked | Taken


# ---- effects: what the core asks the shell to do ------------------------------------------------------
class Send(msgspec.Struct):
    dest: str
    msg: Message


class Run(msgspec.Struct):
    """Run one invocation (user code) against ``view``; its end comes back as :class:`Invoked`."""

    inv: Invoke
    cached: CachedInvocation | None
    view: TxnView


class Deliver(msgspec.Struct):
    """The result of the synchronous call ``key`` of ``epoch``: resume the invocation that waits for it."""

    epoch: int
    key: SlotKey
    status: Status
    value: msgspec.Raw


class Closed(msgspec.Struct):
    """``epoch`` finished here: nothing of it runs any more (its call slots can go)."""

    epoch: int


class Take(msgspec.Struct):
    """Take up to ``room`` records from the ingress for the live batch of ``epoch`` (answered at once
    with :class:`Taken`), which also runs ``rescheduled`` transactions; the shell's admission
    (styx_worker.admission) may admit fewer and take more to refuse."""

    epoch: int
    gen: int
    room: int
    version: int  # the graph version the epoch runs (logged with the batch)
    rescheduled: int = 0


class Fetch(msgspec.Struct):
    """Read these exact ingress records (partition, packed offset), in this order, for the replay of
    ``epoch`` (answered with :class:`Taken` once they are all read)."""

    epoch: int
    gen: int
    positions: list[tuple[int, int]]


class Log(msgspec.Struct):
    """Append this worker's batch of ``epoch`` to the sequencer log (then :class:`LogAcked`)."""

    epoch: int
    gen: int
    entry: SeqLogEntry


class Emit(msgspec.Struct):
    """A reply leaves: to egress ``partition`` (and pushed to ``reply_to`` if it subscribed here)."""

    partition: int
    reply: Reply
    epoch: int
    reply_to: str


class Changes(msgspec.Struct):
    """``epoch``'s committed writes leave for the changelog topic: per partition, in commit order."""

    epoch: int
    records: dict[int, list[ChangeRecord]]


class Live(msgspec.Struct):
    """``segment`` is the newest ingress segment: read and reply where it says."""

    segment: int


class Load(msgspec.Struct):
    """Load this graph version (the newest the view lists) unless it is loaded already."""

    version: GraphVersion


class Assign(msgspec.Struct):
    """Read exactly these ingress partitions."""

    partitions: list[int]


class Upload(msgspec.Struct):
    """Upload a captured snapshot (``parts``: :func:`styx_worker.snapshot.capture_steps`) once the replies
    queued so far are on the log, and report it to the coordinator."""

    epoch: int
    gen: int
    parts: Any
    seqlog_acked: int
    marks: list[LogMark] = msgspec.field(default_factory=list)  # what the broker held (core.logmarks)


class ReportFenced(msgspec.Struct):
    """Once every reply queued so far is on the log, tell the coordinator this worker decides nothing of
    a generation before ``gen`` any more; ``leave``: then leave the cluster (Retire)."""

    gen: int
    leave: bool


class Halt(msgspec.Struct):
    """The cluster stopped for good (``reason``): cancel every invocation and upload in flight."""

    reason: str


Effect = (
    Send
    | Run
    | Deliver
    | Closed
    | Take
    | Fetch
    | Log
    | Emit
    | Changes
    | Live
    | Load
    | Assign
    | Upload
    | ReportFenced
    | Halt
)


class PortView(Protocol):
    """What the core reads of its ports, synchronously (counters and positions; it never waits)."""

    def pending(self) -> int:
        """Ingress records buffered, not yet taken into a batch."""
        ...

    def positions(self) -> dict[int, Cursor]:
        """Per ingress partition read here, the next offset to take in each segment."""
        ...

    def egress_offsets(self) -> dict[int, int]:
        """Per egress partition, a packed offset below which this worker's replies are acknowledged."""
        ...

    def seqlog_acked(self) -> int:
        """An offset below which every sequencer-log entry this worker appended is durable."""
        ...


class Outbox:
    """The effects of the step under way; the core's parts append to :attr:`effects`, the step hands
    them over with :meth:`take`."""

    __slots__ = ("effects",)

    def __init__(self) -> None:
        self.effects: list[Effect] = []

    def take(self) -> list[Effect]:
        effects, self.effects = self.effects, []
        return effects
