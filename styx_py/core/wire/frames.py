"""Channels and frames: one tagged union per channel, decoded by that channel's decoder.

A process decodes only what its channel may carry: the coordinator's port takes
:data:`ToCoordinator` (workers' reports and admin requests), a worker's port takes :data:`ToWorker`
(the coordinator's orders and its peers' transaction messages), an admin client takes
:data:`ToAdmin`. A valid message of another channel is a :class:`~styx_py.core.errors.ProtocolError`
like any undecodable bytes.

On TCP a frame is a 4-byte big-endian length and a msgpack-encoded :class:`Batch` (the messages to
one destination of one event-loop tick).
"""

from __future__ import annotations

import struct
from typing import Any, Generic, Literal, TypeVar

import msgspec

from styx_py.core.errors import ProtocolError
from styx_py.core.limits import MAX_FRAME_BYTES
from styx_py.core.wire.admin import AdminReply, DeployRequest, DrainRequest, ScaleRequest, StatusRequest
from styx_py.core.wire.codes import UNDECODABLE
from styx_py.core.wire.control import (
    ClusterView,
    EpochDone,
    EpochStart,
    ExecDone,
    Fenced,
    GraphPrepared,
    Halt,
    Heartbeat,
    LogLost,
    PrepareGraph,
    Recover,
    RecoverDone,
    Register,
    ReplayDiverged,
    Retire,
    Revote,
    SnapshotDone,
    SnapshotResult,
    Vote,
    WorkAvailable,
)
from styx_py.core.wire.lookup import FindReplies, FoundReplies, ReplyLookup
from styx_py.core.wire.peer import Ack, CallResult, Final, Handoff, Invoke
from styx_py.core.wire.push import EgressAcked, PushedReply, PushedRequest, SubscribeRefused, SubscribeReplies
from styx_py.core.wire.reads import ReadAt, ReadRows, ReadState

ToCoordinator = (
    Register
    | Heartbeat
    | WorkAvailable
    | Vote
    | Revote
    | EpochDone
    | SnapshotDone
    | Fenced
    | RecoverDone
    | GraphPrepared
    | ReplayDiverged
    | LogLost
    | DeployRequest
    | StatusRequest
    | ScaleRequest
    | DrainRequest
    | ReplyLookup
    | FoundReplies
    | ReadState
    | ReadRows
)
ControlToWorker = (
    ClusterView
    | Heartbeat
    | EpochStart
    | SnapshotResult
    | Recover
    | Halt
    | Retire
    | FindReplies
    | ReadAt
    | PrepareGraph
)
# A peer's transaction messages, and its epoch reports (every worker decides from all of them).
PeerMessage = Invoke | CallResult | Ack | Final | ExecDone | Vote | Revote | Handoff
ToWorker = ControlToWorker | PeerMessage | SubscribeReplies | PushedRequest  # the last two from clients
ToAdmin = AdminReply | PushedReply | SubscribeRefused | EgressAcked  # what a client of the cluster receives
Message = ToCoordinator | ToWorker | ToAdmin  # anything a transport may send

Inbox = Literal["coordinator", "worker", "admin"]  # which channel a receiving endpoint is

M = TypeVar("M")


class Batch(msgspec.Struct, Generic[M], array_like=True):
    src: str
    msgs: list[M]
    incarnation: str = ""  # random per process start: a peer that restarted is told apart from a reconnect


_encoder = msgspec.msgpack.Encoder()
_decoders: dict[str, msgspec.msgpack.Decoder[Any]] = {
    "coordinator": msgspec.msgpack.Decoder(Batch[ToCoordinator]),
    "worker": msgspec.msgpack.Decoder(Batch[ToWorker]),
    "admin": msgspec.msgpack.Decoder(Batch[ToAdmin]),
}
_HEADER = struct.Struct(">I")
HEADER_BYTES = _HEADER.size


def encode_frame(batch: Batch[Any]) -> bytes:
    payload = _encoder.encode(batch)
    if len(payload) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds MAX_FRAME_BYTES={MAX_FRAME_BYTES}")
    return _HEADER.pack(len(payload)) + payload


def encode_frames(src: str, msgs: list[Any], incarnation: str = "") -> list[bytes]:
    """``msgs`` from ``src`` as one frame, or as several when one would exceed ``MAX_FRAME_BYTES``
    (raises ``ProtocolError`` only for a single message larger than a frame)."""
    try:
        return [encode_frame(Batch(src, msgs, incarnation))]
    except ProtocolError:
        if len(msgs) <= 1:
            raise
        half = len(msgs) // 2
        return encode_frames(src, msgs[:half], incarnation) + encode_frames(src, msgs[half:], incarnation)


def frame_length(header: bytes) -> int:
    (n,) = _HEADER.unpack(header)
    if n > MAX_FRAME_BYTES:
        raise ProtocolError(f"peer announced a frame of {n} bytes (limit {MAX_FRAME_BYTES})")
    return int(n)


def decode_batch(payload: bytes, inbox: Inbox) -> Batch[Message]:
    """A frame's batch, if every message in it belongs to ``inbox``'s channel."""
    try:
        batch: Batch[Message] = _decoders[inbox].decode(payload)
    except UNDECODABLE as exc:
        raise ProtocolError(
            f"undecodable frame for the {inbox} channel: {type(exc).__name__}: {exc}"
        ) from exc
    return batch
