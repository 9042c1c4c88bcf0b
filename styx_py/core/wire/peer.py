"""The data plane: a transaction's messages between workers (and to itself, in memory)."""

from __future__ import annotations

import msgspec

from styx_py.core.wire.codes import Key, Msg, Outcome, Phase, Status


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
