"""The data plane: a transaction's messages between workers (and to itself, in memory)."""

from __future__ import annotations

import msgspec

from styx_py.core.wire.codes import Key, Msg, Outcome, Phase, Status
from styx_py.core.wire.logs import Reply, Request


class Invoke(Msg, tag="inv"):
    epoch: int
    tid: int
    phase: Phase
    path: list[int]  # position in the call tree: child indices from the root
    root: str  # node_id of the root's worker (acks go there)
    parent: str  # node_id of the caller's worker (sync results go there)
    operator: str
    function: str
    key: Key
    args: msgspec.Raw
    share_n: int | str  # exact ack share (worker.ackshare.to_wire): str beyond 64 bits
    share_d: int | str
    want_result: bool
    ts_ms: int
    gen: int
    request_id: str = ""  # the transaction's request (names its external calls and timers)


class CallResult(Msg, tag="res"):
    epoch: int
    tid: int
    phase: Phase
    path: list[int]
    status: Status
    value: msgspec.Raw
    gen: int


class Ack(Msg, tag="ack"):
    epoch: int
    tid: int
    phase: Phase
    share_n: int | str  # exact ack share (worker.ackshare.to_wire): str beyond 64 bits
    share_d: int | str
    status: Status
    error: str
    path: list[int]
    gen: int


class Final(Msg, tag="fin"):
    epoch: int
    tid: int
    outcome: Outcome
    gen: int


class Handoff(Msg, tag="handoff"):
    """One piece of a partition that a planned shape change moves, from its old owner straight to
    its new one: its state as of ``epoch``, the last epoch that ran before the change. A partition
    travels in ``parts`` pieces (each well under the frame limit): the entities are spread over them,
    everything else rides on the last. ``epoch`` -1: the old owner cannot hand it off (its state is
    not that of the barrier); the change then ends in a full recovery."""

    gen: int  # the generation that runs on the new placement
    partition: int
    epoch: int
    part: int
    parts: int
    data: list[tuple[str, Key, bytes]]  # committed entities
    # Writes no complete snapshot holds yet: the new owner's next snapshot carries them (the
    # partition's chain of snapshot objects stays whole across the move).
    delta: list[tuple[str, Key, bytes | None]]
    replies: list[Reply] = msgspec.field(default_factory=list)  # the reply table of resent ids, oldest first
    reply_delta: list[Reply] = msgspec.field(
        default_factory=list
    )  # its entries no complete snapshot holds yet
    position: int = 0  # next ingress offset to take
    rescheduled: list[tuple[int, int, int, Request]] = msgspec.field(
        default_factory=list
    )  # (tid, offset, ts_ms, request)
    waiting: list[tuple[int, int, Request]] = msgspec.field(
        default_factory=list
    )  # (offset, ts_ms, request): resent while running
    egress_offsets: dict[int, int] = msgspec.field(
        default_factory=dict
    )  # the old owner's acknowledged egress positions
    cursor: dict[int, int] = msgspec.field(default_factory=dict)  # ingress segment -> next offset
