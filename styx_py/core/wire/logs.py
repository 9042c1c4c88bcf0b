"""Payloads of the Kafka logs: requests (ingress), replies (egress), batches (sequencer log).

Values inside requests, replies and state are msgpack too (:func:`encode_value`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from styx_py.core.wire.codes import Key, Phase, ReplyStatus


# Request and Reply hold scalars only, so they can never be part of a reference cycle: ``gc=False``
# keeps them out of the cyclic collector. A worker holds up to ``dedup_replies_per_partition`` replies
# per partition; tracked, 200 000 of them made every full collection take ~60 ms (~13 ms untracked),
# a pause every epoch on both workers waits out.
class Request(msgspec.Struct, array_like=True, gc=False):
    """One client request on the ingress topic."""

    request_id: str
    operator: str
    function: str
    key: Key
    args: msgspec.Raw  # msgpack-encoded list of arguments
    ts_ms: int = 0  # client send time (for latency); not used by the engine
    # Egress partition the reply goes to (the sending client reads only that one); -1, or a partition
    # the egress topic does not have: the request's ingress partition. Last, with a default, so records
    # of clients that do not set it still decode.
    reply_partition: int = -1
    # The client connection the reply is also pushed to (its node id on the workers' ports, wire/push.py);
    # empty: none. Last, with a default, like reply_partition.
    reply_to: str = ""


# Kafka header on every egress record: the epoch that sent it (decimal). A resent request's reply is
# identical to the first one, epoch field included; recovery tells which replies a replayed epoch
# already sent by this header, not by the reply.
EPOCH_HEADER = "styx-epoch"


class Reply(msgspec.Struct, array_like=True, gc=False):
    """One transaction outcome on the egress topic (early commit reply)."""

    request_id: str
    tid: int
    epoch: int
    phase: Phase  # the serial order of a run is (epoch, phase, tid)
    status: ReplyStatus
    result: msgspec.Raw  # msgpack of the result (nil when there is none)
    error: str | None
    error_type: str | None
    request_ts_ms: int = 0
    # Status refused: which bound refused it (a ``Refusal``: ``backlog`` or ``entity``); empty
    # otherwise, and in replies logged before refusals had reasons. Last, with a default, so those decode.
    reason: str = ""

    @property
    def value(self) -> Any:
        """The decoded result (``None`` when there is none). ``result`` holds its msgpack bytes; it is
        decoded on each access, so a reply nobody looks into costs no decoding."""
        return value_decoder.decode(self.result)

    @property
    def committed(self) -> bool:
        return self.status == ReplyStatus.COMMITTED


NIL = msgspec.Raw(b"\xc0")  # msgpack nil: msgspec cannot decode ``Raw | None``, so absence is nil


# ---- the sequencer log: how each request of a worker's batch was handled ----------------------------


class _Entry(msgspec.Struct, tag_field="k", array_like=True):
    pass


class Run(_Entry, tag="run"):
    """A transaction of the batch: a new one (its tid just assigned) or a rescheduled one."""

    tid: int
    partition: int  # ingress partition and offset of its request
    offset: int
    request_id: str


class Answered(_Entry, tag="answered"):
    """A request id resent after its reply: given the same reply again, nothing runs."""

    partition: int
    offset: int
    request_id: str


class Waiting(_Entry, tag="waiting"):
    """A request id resent while its first copy runs: answered with that copy's reply."""

    partition: int
    offset: int
    request_id: str


class Refused(_Entry, tag="refused"):
    """A request the worker did not admit (over its admission bound, styx_worker.admission): answered
    ``refused`` (the SDK raises ``Overloaded``), nothing runs; logged so that a replay refuses it again,
    with the same reply."""

    partition: int
    offset: int
    request_id: str
    # Which bound refused it (a ``Refusal``), so that replay makes the same reply without recomputing
    # it; empty in entries logged before refusals had reasons (their replies have none either). Last,
    # with a default, so those decode.
    reason: str = ""


BatchEntry = Run | Answered | Waiting | Refused


class Written(msgspec.Struct, array_like=True):
    """What one epoch committed on one partition: for each transaction that wrote there (ascending
    tids), a digest of its writes (styx_worker.digests), ``DIGEST_BYTES`` each, concatenated."""

    partition: int
    tids: list[int]
    digests: bytes


DIGEST_BYTES = 8


class SeqLogEntry(msgspec.Struct, array_like=True):
    """Composition of one worker's batch in one epoch: enough to replay it with the same tids.

    Entries list the transactions that run first (rescheduled ones, then new ones with consecutive
    Mencius counters ``lc_start .. lc_end``), then the resent request ids the batch answered and the
    requests it refused."""

    epoch: int
    node_id: str
    lc_start: int
    entries: list[BatchEntry]
    gen: int
    lc_end: int
    # How many workers the generation that ran this epoch had (recovery replays an epoch only when
    # every one of them logged it) and its sequencer-id space; 0 in entries of older versions.
    nodes: int = 0
    n_seq: int = 0
    # The graph version that ran the epoch (replay checks it runs the same). With a default: 0 in
    # records written before code updates, when the first version ran every epoch.
    version: int = 0
    # The writes of the epoch this worker finished before forming this batch (``written_epoch``, -1:
    # none), per partition it owned then, an empty ``Written`` for one with no write: a replay
    # compares them with its own (styx_worker.digests). Last, with defaults, so older records decode.
    written_epoch: int = -1
    written: list[Written] = msgspec.field(default_factory=list)


class IngressRecord(msgspec.Struct, array_like=True):
    """A request as a worker took it from its ingress partition."""

    partition: int
    offset: int
    request: Request
    ts_ms: int


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
