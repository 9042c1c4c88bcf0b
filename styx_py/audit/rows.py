"""Row shapes of the audit's inputs, and the pure decoding of log records and snapshot objects into them.

Every Kafka row carries the record's coordinates (topic, partition, offset, timestamp, key, headers);
``value`` is the payload decoded for the topic's kind (null when it does not decode, with the reason in
``decode_error``). Columns are built as Arrow arrays, a column at a time: a data source that yields
Arrow batches costs Spark no per-row Python work.

=========  ==========================================================================================
kind       ``value``
=========  ==========================================================================================
ingress    :class:`~styx_py.core.wire.Request`: request_id, operator, function, key (+ key_is_int), args
           (msgpack), ts_ms (the client's send time)
egress     :class:`~styx_py.core.wire.Reply`: request_id, tid, epoch, phase, status, result (msgpack), error,
           error_type, request_ts_ms
seqlog     :class:`~styx_py.core.wire.SeqLogEntry`: epoch, node_id, gen, lc_start, lc_end, entries (kind,
           tid, partition, offset, request_id; no tid for a resent request answered from its reply),
           nodes, n_seq
changelog  :class:`~styx_py.core.changelog.ChangeRecord`: operator, key (+ key_is_int), value (msgpack;
           null: deleted), epoch, phase, tid, index, digest (of the record's bytes)
raw        the value bytes, undecoded
=========  ==========================================================================================
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any, Literal

import msgspec
import pyarrow as pa

from styx_py.core.changelog import ChangeRecord, change_decoder
from styx_py.core.partitioning import Key
from styx_py.core.wire import (
    UNDECODABLE,
    Answered,
    PartitionSnapshot,
    Refused,
    Reply,
    Request,
    Run,
    SeqLogEntry,
    Waiting,
)

Kind = Literal["ingress", "egress", "seqlog", "changelog", "raw"]
_ENTRY_KINDS: dict[type, str] = {Run: "run", Answered: "answered", Waiting: "waiting", Refused: "refused"}
KINDS: tuple[Kind, ...] = ("ingress", "egress", "seqlog", "changelog", "raw")

# Spark's own Arrow shapes (what a Python data source must return): list items named "element",
# timestamps in microseconds.
HEADERS = pa.list_(pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())])))
TIMESTAMP = pa.timestamp("us", tz="UTC")
_NO_HEADERS = pa.array([], HEADERS.value_type)

REQUEST = pa.struct(
    [
        ("request_id", pa.string()),
        ("operator", pa.string()),
        ("function", pa.string()),
        ("key", pa.string()),
        ("key_is_int", pa.bool_()),
        ("args", pa.binary()),
        ("ts_ms", pa.int64()),
    ]
)
REPLY = pa.struct(
    [
        ("request_id", pa.string()),
        ("tid", pa.int64()),
        ("epoch", pa.int64()),
        ("phase", pa.int32()),
        ("status", pa.string()),
        ("result", pa.binary()),
        ("error", pa.string()),
        ("error_type", pa.string()),
        ("request_ts_ms", pa.int64()),
    ]
)
# kind: "run" (a transaction, with its tid), "answered" or "waiting" (a resent request id; no tid),
# "refused" (a request not admitted: admission control; no tid).
SEQ_ENTRY = pa.struct(
    [
        ("kind", pa.string()),
        ("tid", pa.int64()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("request_id", pa.string()),
    ]
)
SEQLOG = pa.struct(
    [
        ("epoch", pa.int64()),
        ("node_id", pa.string()),
        ("gen", pa.int64()),
        ("lc_start", pa.int64()),
        ("lc_end", pa.int64()),
        ("entries", pa.list_(pa.field("element", SEQ_ENTRY))),
        ("nodes", pa.int64()),  # workers of the generation, 0 in entries of older versions
        ("n_seq", pa.int64()),  # sequencer-id space (the most workers the cluster had), likewise
    ]
)
# A changelog record (styx_py.core.changelog); value null for a delete; digest: of the record's bytes as
# stored (ChangelogCheck compares the serial replay's records by it).
CHANGE = pa.struct(
    [
        ("operator", pa.string()),
        ("key", pa.string()),
        ("key_is_int", pa.bool_()),
        ("value", pa.binary()),
        ("epoch", pa.int64()),
        ("phase", pa.int32()),
        ("tid", pa.int64()),
        ("index", pa.int64()),
        ("digest", pa.int64()),
    ]
)
VALUE_TYPES: dict[Kind, pa.DataType] = {
    "ingress": REQUEST,
    "egress": REPLY,
    "seqlog": SEQLOG,
    "changelog": CHANGE,
    "raw": pa.binary(),
}


def kafka_schema(kind: Kind) -> pa.Schema:
    return pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", TIMESTAMP),
            ("key", pa.binary()),
            ("headers", HEADERS),
            ("value", VALUE_TYPES[kind]),
            ("decode_error", pa.string()),
        ]
    )


SNAPSHOT_SCHEMA = pa.schema(
    [
        ("snapshot_id", pa.int64()),  # the manifest's epoch (or the object's, when reading every object)
        ("object", pa.string()),
        ("object_epoch", pa.int64()),  # objects of one partition apply in this order
        ("partition", pa.int32()),
        ("operator", pa.string()),
        ("key", pa.string()),
        ("key_is_int", pa.bool_()),
        ("value", pa.binary()),  # msgpack of the value; null: the entity was deleted
    ]
)


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """What the reader keeps of one consumed record."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    headers: Sequence[tuple[str, bytes]]
    value: bytes | None


_request_decoder = msgspec.msgpack.Decoder(Request)
_reply_decoder = msgspec.msgpack.Decoder(Reply)
_seqlog_decoder = msgspec.msgpack.Decoder(SeqLogEntry)
_snapshot_decoder = msgspec.msgpack.Decoder(PartitionSnapshot)


def _decode(decoder: msgspec.msgpack.Decoder[Any], value: bytes | None) -> tuple[Any, str | None]:
    if value is None:
        return None, "null value"
    try:
        return decoder.decode(value), None
    except UNDECODABLE as exc:
        return None, f"{type(exc).__name__}: {exc}"


def key_columns(keys: Iterable[Key]) -> tuple[list[str], list[bool]]:
    """Entity keys as text plus an is-int flag (str and int keys never collide: see partitioning)."""
    text: list[str] = []
    is_int: list[bool] = []
    for k in keys:
        text.append(str(k))
        is_int.append(isinstance(k, int))
    return text, is_int


def key_value(text: str, is_int: bool) -> Key:
    return int(text) if is_int else text


def _requests(values: list[Request | None]) -> pa.Array:
    ok = [v for v in values if v is not None]
    keys, is_int = key_columns(v.key for v in ok)
    children = [
        pa.array([v.request_id for v in ok], pa.string()),
        pa.array([v.operator for v in ok], pa.string()),
        pa.array([v.function for v in ok], pa.string()),
        pa.array(keys, pa.string()),
        pa.array(is_int, pa.bool_()),
        pa.array([bytes(v.args) for v in ok], pa.binary()),
        pa.array([v.ts_ms for v in ok], pa.int64()),
    ]
    return _sparse_struct(REQUEST, children, values)


def _replies(values: list[Reply | None]) -> pa.Array:
    ok = [v for v in values if v is not None]
    children = [
        pa.array([v.request_id for v in ok], pa.string()),
        pa.array([v.tid for v in ok], pa.int64()),
        pa.array([v.epoch for v in ok], pa.int64()),
        pa.array([v.phase for v in ok], pa.int32()),
        pa.array([v.status for v in ok], pa.string()),
        pa.array([bytes(v.result) for v in ok], pa.binary()),
        pa.array([v.error for v in ok], pa.string()),
        pa.array([v.error_type for v in ok], pa.string()),
        pa.array([v.request_ts_ms for v in ok], pa.int64()),
    ]
    return _sparse_struct(REPLY, children, values)


def _seqlog(values: list[SeqLogEntry | None]) -> pa.Array:
    ok = [v for v in values if v is not None]
    flat = [e for v in ok for e in v.entries]
    offsets = [0]
    for v in ok:
        offsets.append(offsets[-1] + len(v.entries))
    entries = pa.StructArray.from_arrays(
        [
            pa.array([_ENTRY_KINDS[type(e)] for e in flat], pa.string()),
            pa.array([e.tid if isinstance(e, Run) else None for e in flat], pa.int64()),
            pa.array([e.partition for e in flat], pa.int32()),
            pa.array([e.offset for e in flat], pa.int64()),
            pa.array([e.request_id for e in flat], pa.string()),
        ],
        fields=list(SEQ_ENTRY),
    )
    children = [
        pa.array([v.epoch for v in ok], pa.int64()),
        pa.array([v.node_id for v in ok], pa.string()),
        pa.array([v.gen for v in ok], pa.int64()),
        pa.array([v.lc_start for v in ok], pa.int64()),
        pa.array([v.lc_end for v in ok], pa.int64()),
        pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), entries, type=SEQLOG.field("entries").type),
        pa.array([v.nodes for v in ok], pa.int64()),
        pa.array([v.n_seq for v in ok], pa.int64()),
    ]
    return _sparse_struct(SEQLOG, children, values)


def _changes(values: list[ChangeRecord | None], raws: list[bytes | None]) -> pa.Array:
    ok = [(v, raw) for v, raw in zip(values, raws, strict=True) if v is not None and raw is not None]
    keys, is_int = key_columns(v.key for v, _ in ok)
    children = [
        pa.array([v.operator for v, _ in ok], pa.string()),
        pa.array(keys, pa.string()),
        pa.array(is_int, pa.bool_()),
        pa.array([None if v.deleted else bytes(v.value) for v, _ in ok], pa.binary()),
        pa.array([v.epoch for v, _ in ok], pa.int64()),
        pa.array([v.phase for v, _ in ok], pa.int32()),
        pa.array([v.tid for v, _ in ok], pa.int64()),
        pa.array([v.index for v, _ in ok], pa.int64()),
        pa.array([change_digest(raw) for _, raw in ok], pa.int64()),
    ]
    return _sparse_struct(CHANGE, children, values)


def change_digest(encoded: bytes) -> int:
    """A signed 64-bit digest of a changelog record's bytes (sums of them compare multisets)."""
    return int.from_bytes(blake2b(encoded, digest_size=8).digest(), "little", signed=True)


def _sparse_struct(
    type_: pa.StructType, children: list[pa.Array], values: Sequence[object | None]
) -> pa.Array:
    """A struct array over the decoded values, with nulls where a value did not decode."""
    dense = pa.StructArray.from_arrays(children, fields=list(type_))
    if all(v is not None for v in values):
        return dense
    # Scatter the dense rows to their positions; undecodable rows become nulls.
    positions: list[int | None] = []
    i = 0
    for v in values:
        if v is None:
            positions.append(None)
        else:
            positions.append(i)
            i += 1
    return dense.take(pa.array(positions, pa.int64()))


def _headers(records: Sequence[KafkaRecord]) -> pa.Array:
    if not any(r.headers for r in records):  # the usual case, ~20x faster than building empty lists
        return pa.ListArray.from_arrays(
            pa.array([0] * (len(records) + 1), pa.int32()), _NO_HEADERS, type=HEADERS
        )
    return pa.array([[{"key": k, "value": v} for k, v in r.headers] for r in records], HEADERS)


def decode_records(kind: Kind, records: Sequence[KafkaRecord]) -> pa.RecordBatch:
    """One Arrow batch of rows of :func:`kafka_schema` ``(kind)`` (pure)."""
    errors: list[str | None] = []
    value: pa.Array
    if kind == "raw":
        value = pa.array([r.value for r in records], pa.binary())
        errors = [None] * len(records)
    else:
        decoders: dict[str, msgspec.msgpack.Decoder[Any]] = {
            "ingress": _request_decoder,
            "egress": _reply_decoder,
            "seqlog": _seqlog_decoder,
            "changelog": change_decoder,
        }
        decoder = decoders[kind]
        decoded: list[Any] = []
        for r in records:
            v, err = _decode(decoder, r.value)
            decoded.append(v)
            errors.append(err)
        value = (
            _requests(decoded)
            if kind == "ingress"
            else _replies(decoded)
            if kind == "egress"
            else _changes(decoded, [r.value for r in records])
            if kind == "changelog"
            else _seqlog(decoded)
        )
    columns = [
        pa.array([r.topic for r in records], pa.string()),
        pa.array([r.partition for r in records], pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([r.timestamp_ms * 1000 for r in records], TIMESTAMP),
        pa.array([r.key for r in records], pa.binary()),
        _headers(records),
        value,
        pa.array(errors, pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=kafka_schema(kind))


def decode_snapshot_object(snapshot_id: int, name: str, object_epoch: int, data: bytes) -> pa.RecordBatch:
    """The rows of one snapshot object (a delta or a compacted base) of one partition (pure).

    Raises ``ValueError`` naming the object when it does not decode: a torn or foreign object in a
    manifest is an audit failure, not something to skip.
    """
    snap, err = _decode(_snapshot_decoder, data)
    if snap is None:
        raise ValueError(f"snapshot object {name} does not decode: {err}")
    assert isinstance(snap, PartitionSnapshot)
    n = len(snap.writes)
    keys, is_int = key_columns(w[1] for w in snap.writes)
    columns = [
        pa.array([snapshot_id] * n, pa.int64()),
        pa.array([name] * n, pa.string()),
        pa.array([object_epoch] * n, pa.int64()),
        pa.array([snap.partition] * n, pa.int32()),
        pa.array([w[0] for w in snap.writes], pa.string()),
        pa.array(keys, pa.string()),
        pa.array(is_int, pa.bool_()),
        pa.array([w[2] for w in snap.writes], pa.binary()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=SNAPSHOT_SCHEMA)
