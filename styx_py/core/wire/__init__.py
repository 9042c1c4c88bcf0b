"""The one typed wire protocol of styx-py.

Every message is a ``msgspec.Struct``, tagged, in one module per part of the protocol:

* :mod:`.codes` — the protocol's enums (:class:`Status`, :class:`Phase`, :class:`Outcome`,
  :class:`ReplyStatus`) and the message base;
* :mod:`.control` — coordinator ⇄ workers (registration, heartbeats, the epoch barrier, snapshots,
  recovery);
* :mod:`.peer` — a transaction's messages between workers (Invoke, CallResult, Ack, Final);
* :mod:`.admin` — the coordinator's admin API;
* :mod:`.push` — replies pushed to clients on the workers' ports;
* :mod:`.lookup` — finding a request's reply in the workers' reply tables (any gateway replica);
* :mod:`.reads` — consistent reads of committed state as of one epoch, outside transactions;
* :mod:`.logs` — Kafka payloads: requests, replies, sequencer-log batches with typed entries
  (:class:`Run`, :class:`Answered`, :class:`Waiting`, :class:`Refused`) and the digests of the
  writes each epoch committed (:class:`Written`);
* :mod:`.storage` — objects in S3: snapshot parts, manifests, the coordinator's state;
* :mod:`.frames` — one union per channel (:data:`ToCoordinator`, :data:`ToWorker`,
  :data:`ToAdmin`), the TCP frame and its per-channel decoders.

Nothing is ever pickled; bytes that do not decode on a channel raise
:class:`~styx_py.core.errors.ProtocolError`.
"""

from styx_py.core.limits import MAX_LOOKUP_IDS, MAX_LOOKUP_REPLY_BYTES
from styx_py.core.wire.admin import AdminReply, DeployRequest, DrainRequest, ScaleRequest, StatusRequest
from styx_py.core.wire.codes import (
    COORDINATOR,
    UNDECODABLE,
    Key,
    Msg,
    Outcome,
    Phase,
    Refusal,
    ReplyStatus,
    Status,
)
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
    WorkerInfo,
)
from styx_py.core.wire.frames import (
    HEADER_BYTES,
    Batch,
    ControlToWorker,
    Inbox,
    Message,
    PeerMessage,
    ToAdmin,
    ToCoordinator,
    ToWorker,
    decode_batch,
    encode_frame,
    encode_frames,
    frame_length,
)
from styx_py.core.wire.logs import (
    DIGEST_BYTES,
    EPOCH_HEADER,
    NIL,
    Answered,
    BatchEntry,
    IngressRecord,
    Refused,
    Reply,
    Request,
    Run,
    SeqLogEntry,
    Waiting,
    Written,
    decode_value,
    encode_value,
    reply_decoder,
    request_decoder,
    request_encoder,
    seqlog_decoder,
    value_decoder,
    value_encoder,
)
from styx_py.core.wire.lookup import (
    FindReplies,
    FoundReplies,
    ReplyLookup,
    Traced,
)
from styx_py.core.wire.peer import Ack, CallResult, Final, Handoff, Invoke
from styx_py.core.wire.push import EgressAcked, PushedReply, PushedRequest, SubscribeRefused, SubscribeReplies
from styx_py.core.wire.reads import READ_CODES, PartRows, ReadAt, ReadRows, ReadState
from styx_py.core.wire.storage import ClusterMeta, Manifest, PartitionSnapshot

__all__ = [
    "COORDINATOR",
    "DIGEST_BYTES",
    "EPOCH_HEADER",
    "HEADER_BYTES",
    "MAX_LOOKUP_IDS",
    "MAX_LOOKUP_REPLY_BYTES",
    "NIL",
    "READ_CODES",
    "UNDECODABLE",
    "Ack",
    "AdminReply",
    "Answered",
    "Batch",
    "BatchEntry",
    "CallResult",
    "ClusterMeta",
    "ClusterView",
    "ControlToWorker",
    "DeployRequest",
    "DrainRequest",
    "EgressAcked",
    "EpochDone",
    "EpochStart",
    "ExecDone",
    "Fenced",
    "Final",
    "FindReplies",
    "FoundReplies",
    "GraphPrepared",
    "Halt",
    "Handoff",
    "Heartbeat",
    "Inbox",
    "IngressRecord",
    "Invoke",
    "Key",
    "LogLost",
    "Manifest",
    "Message",
    "Msg",
    "Outcome",
    "PartRows",
    "PartitionSnapshot",
    "PeerMessage",
    "Phase",
    "PrepareGraph",
    "PushedReply",
    "PushedRequest",
    "ReadAt",
    "ReadRows",
    "ReadState",
    "Recover",
    "RecoverDone",
    "Refusal",
    "Refused",
    "Register",
    "ReplayDiverged",
    "Reply",
    "ReplyLookup",
    "ReplyStatus",
    "Request",
    "Retire",
    "Revote",
    "Run",
    "ScaleRequest",
    "SeqLogEntry",
    "SnapshotDone",
    "SnapshotResult",
    "Status",
    "StatusRequest",
    "SubscribeRefused",
    "SubscribeReplies",
    "ToAdmin",
    "ToCoordinator",
    "ToWorker",
    "Traced",
    "Vote",
    "Waiting",
    "WorkAvailable",
    "WorkerInfo",
    "Written",
    "decode_batch",
    "decode_value",
    "encode_frame",
    "encode_frames",
    "encode_value",
    "frame_length",
    "reply_decoder",
    "request_decoder",
    "request_encoder",
    "seqlog_decoder",
    "value_decoder",
    "value_encoder",
]
