"""The one typed wire protocol of styx-py.

Every message between the coordinator and workers, and between workers, is a ``msgspec.Struct`` in
this module, tagged so one decoder handles a channel. Frames on TCP are a 4-byte big-endian length
and a msgpack-encoded :class:`Batch` (messages to one destination are batched per loop tick).
Nothing is ever pickled; bytes that do not decode raise :class:`~styx_py.core.errors.ProtocolError`.

Kafka payloads (:class:`Request` on the ingress topic, :class:`Reply` on the egress topic and
:class:`SeqLogEntry` on the sequencer log) are msgpack too.
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec

from styx_py.core.errors import ProtocolError
from styx_py.core.graph import OperatorSpec
from styx_py.core.limits import MAX_FRAME_BYTES

Key = str | int

# The coordinator's node id on every transport (workers have their own, e.g. "w1").
COORDINATOR = "coordinator"

# Outcome of one function invocation, carried by Ack / CallResult.
ST_OK = 0
ST_ABORT = 1  # user raised Abort
ST_ERROR = 2  # user code raised another exception / unencodable value
ST_BAD = 3  # unknown operator or function, wrong arguments
ST_CHANGED = 4  # fallback: read/write set or call parameters differ from the optimistic run
ST_PROPAGATED = 5  # failed because a synchronous callee failed (the callee carries the error)

# Phases of an epoch in which an invocation runs.
PHASE_OPTIMISTIC = 0
PHASE_FALLBACK = 1

# Outcome of a fallback transaction (Final.outcome).
OUT_COMMIT = 0
OUT_ABORT = 1
OUT_RESCHEDULE = 2


class _Msg(msgspec.Struct, tag_field="t", array_like=True, omit_defaults=False):
    pass


# ---- control plane: worker <-> coordinator -------------------------------------------------------


class Register(_Msg, tag="reg"):
    node_id: str
    host: str
    port: int


class WorkerInfo(msgspec.Struct, array_like=True):
    node_id: str
    sid: int  # sequencer id, 1..n
    host: str
    port: int


class ClusterView(_Msg, tag="view"):
    generation: int
    workers: list[WorkerInfo]
    placement: list[str]  # partition index -> owning worker node_id
    graph_path: str | None
    operators: list[OperatorSpec]
    kafka_bootstrap: str | None
    ingress_topic: str
    egress_topic: str
    seqlog_topic: str
    gen: int = 0


class Heartbeat(_Msg, tag="hb"):
    node_id: str
    epoch: int


class WorkAvailable(_Msg, tag="work"):
    node_id: str


class EpochStart(_Msg, tag="es"):
    epoch: int
    lc: int  # global max sequencer counter (Mencius rebalancing)
    gen: int = 0  # cluster generation: bumped by every recovery; older messages are dropped
    replay: bool = False  # re-run the logged composition of this epoch (recovery)


class ExecDone(_Msg, tag="xd"):
    epoch: int
    node_id: str
    aborted: list[int]  # tids whose root saw a logic abort / error
    lc: int
    gen: int = 0


class AllExecDone(_Msg, tag="axd"):
    epoch: int
    aborted: list[int]
    gen: int = 0


class Vote(_Msg, tag="vote"):
    epoch: int
    node_id: str
    conflicts: list[int]
    uncacheable: list[int]  # tids that touched one entity twice on this worker
    gen: int = 0


class Decision(_Msg, tag="dec"):
    epoch: int
    fallback: list[int]  # sorted tids that must re-run under locks
    uncacheable: list[int]
    gen: int = 0
    snapshot: bool = False  # take a snapshot at the end of this epoch


class EpochDone(_Msg, tag="ed"):
    epoch: int
    node_id: str
    pending: int  # requests waiting in this worker's ingress
    committed: int
    aborted: int
    rescheduled: int
    gen: int = 0


# ---- data plane: worker <-> worker ----------------------------------------------------------------


class Invoke(_Msg, tag="inv"):
    epoch: int
    tid: int
    phase: int
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
    gen: int = 0


class CallResult(_Msg, tag="res"):
    epoch: int
    tid: int
    phase: int
    path: list[int]
    status: int
    value: msgspec.Raw
    gen: int = 0


class Ack(_Msg, tag="ack"):
    epoch: int
    tid: int
    phase: int
    share_n: int | str  # exact ack share (worker.ackshare.to_wire): str beyond 64 bits
    share_d: int | str
    status: int
    error: str
    path: list[int]
    gen: int = 0


class Final(_Msg, tag="fin"):
    epoch: int
    tid: int
    outcome: int
    gen: int = 0


class SnapshotDone(_Msg, tag="snap"):
    epoch: int
    node_id: str
    ok: bool
    error: str
    objects: int
    bytes: int
    gen: int = 0
    seqlog_offset: int = 0  # sequencer-log entries of epochs after this snapshot lie at or above it


class SnapshotResult(_Msg, tag="snapres"):
    """The coordinator's verdict on the snapshot of ``epoch``: durable (manifest written) or not."""

    epoch: int
    ok: bool


class Manifest(msgspec.Struct, array_like=True):
    """A complete snapshot: for each partition, the objects that rebuild it, applied in epoch order
    (a compacted base first, then deltas)."""

    epoch: int  # -1: no snapshot yet (recover from the beginning of the logs)
    lc: int
    n_partitions: int
    deltas: dict[int, list[str]]
    epoch_generations: list[tuple[int, int]]  # (first epoch, generation) of every generation so far
    seqlog_offset: int = 0  # where recovery starts reading the sequencer log

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


class Recover(_Msg, tag="recover"):
    gen: int
    manifest: Manifest
    replay_until: int  # last decided epoch: epochs manifest.epoch+1 .. replay_until are replayed


class RecoverDone(_Msg, tag="recovered"):
    gen: int
    node_id: str
    ok: bool
    error: str


# ---- admin --------------------------------------------------------------------------------------


class DeployRequest(_Msg, tag="deploy"):
    import_path: str


class StatusRequest(_Msg, tag="status"):
    pass


class AdminReply(_Msg, tag="admin"):
    ok: bool
    error: str
    body: dict[str, Any]


Message = (
    Register
    | ClusterView
    | Heartbeat
    | WorkAvailable
    | EpochStart
    | ExecDone
    | AllExecDone
    | Vote
    | Decision
    | EpochDone
    | Invoke
    | CallResult
    | Ack
    | Final
    | SnapshotDone
    | SnapshotResult
    | Recover
    | RecoverDone
    | DeployRequest
    | StatusRequest
    | AdminReply
)


class Batch(msgspec.Struct, array_like=True):
    src: str
    msgs: list[Message]
    incarnation: str = ""  # random per process start: a peer that restarted is told apart from a reconnect


# ---- Kafka payloads ------------------------------------------------------------------------------


class Request(msgspec.Struct, array_like=True):
    """One client request on the ingress topic."""

    request_id: str
    operator: str
    function: str
    key: Key
    args: msgspec.Raw  # msgpack-encoded list of arguments
    ts_ms: int = 0  # client send time (for latency); not used by the engine


# Kafka header on every egress record: the epoch that sent it (decimal). A resent request's reply is
# identical to the first one, epoch field included; recovery tells which replies a replayed epoch
# already sent by this header, not by the reply.
EPOCH_HEADER = "styx-epoch"


class Reply(msgspec.Struct, array_like=True):
    """One transaction outcome on the egress topic (early commit reply)."""

    request_id: str
    tid: int
    epoch: int
    phase: int  # 0 lock-free commit, 1 fallback: serial order is (epoch, phase, tid)
    status: str  # "committed" | "aborted" | "failed"
    result: msgspec.Raw  # msgpack of the result (nil when there is none)
    error: str | None
    error_type: str | None
    request_ts_ms: int = 0


NIL = msgspec.Raw(b"\xc0")  # msgpack nil: msgspec cannot decode ``Raw | None``, so absence is nil


class SeqLogEntry(msgspec.Struct, array_like=True):
    """Composition of one worker's batch in one epoch: enough to replay it with the same tids."""

    epoch: int
    node_id: str
    lc_start: int
    entries: list[tuple[int, int, int, str]]  # (tid, ingress partition, offset, request_id)
    gen: int = 0
    lc_end: int = 0


class IngressRecord(msgspec.Struct, array_like=True):
    """A request as a worker took it from its ingress partition."""

    partition: int
    offset: int
    request: Request
    ts_ms: int


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


# What decoding hostile bytes can raise: bad msgpack, wrong shape, invalid UTF-8 in a string,
# nesting deep enough to exhaust the stack.
UNDECODABLE = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError)

_batch_encoder = msgspec.msgpack.Encoder()
_batch_decoder = msgspec.msgpack.Decoder(Batch)
_HEADER = struct.Struct(">I")
HEADER_BYTES = _HEADER.size


def encode_frame(batch: Batch) -> bytes:
    payload = _batch_encoder.encode(batch)
    if len(payload) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds MAX_FRAME_BYTES={MAX_FRAME_BYTES}")
    return _HEADER.pack(len(payload)) + payload


def frame_length(header: bytes) -> int:
    (n,) = _HEADER.unpack(header)
    if n > MAX_FRAME_BYTES:
        raise ProtocolError(f"peer announced a frame of {n} bytes (limit {MAX_FRAME_BYTES})")
    return int(n)


def decode_batch(payload: bytes) -> Batch:
    try:
        return _batch_decoder.decode(payload)
    except UNDECODABLE as exc:
        raise ProtocolError(f"undecodable frame: {type(exc).__name__}: {exc}") from exc


request_encoder = msgspec.msgpack.Encoder()
request_decoder = msgspec.msgpack.Decoder(Request)
reply_decoder = msgspec.msgpack.Decoder(Reply)
seqlog_decoder = msgspec.msgpack.Decoder(SeqLogEntry)
value_encoder = msgspec.msgpack.Encoder()
value_decoder = msgspec.msgpack.Decoder()


def encode_value(value: Any) -> bytes:
    return value_encoder.encode(value)


def decode_value(raw: bytes | msgspec.Raw) -> Any:
    return value_decoder.decode(raw)
