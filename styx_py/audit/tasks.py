"""What runs in Spark's Python workers: Arrow batches in, the rules of :mod:`.rules` applied, Arrow out.

Each function is a ``mapInArrow`` body (an iterator of record batches to an iterator of record
batches). The common, provably clean cases are handled a column at a time; every other group goes
through the plain rule, so the rules stay the only judges. No Spark import here: these functions are
tested on hand-made batches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from styx_py.audit.changelog_rules import ChangelogExpectation
from styx_py.audit.effects_rules import EffectsCheck
from styx_py.audit.rows import key_value
from styx_py.audit.rules import (
    SerialCheck,
    check_entry,
    check_request,
    check_tid,
    check_undecodable,
)
from styx_py.core.effectids import SYSTEM_OPERATORS
from styx_py.core.graph import Graph, GraphVersion, load_graph, version_at
from styx_py.core.serial import GraphAt, Writes
from styx_py.core.wire import NIL, Reply, Request, decode_value

FINDING = pa.struct(
    [("check", pa.string()), ("subject", pa.string()), ("message", pa.string()), ("severity", pa.string())]
)
FINDINGS = pa.list_(pa.field("element", FINDING))
FINDINGS_SCHEMA = pa.schema(list(FINDING))

# The input of request_facts: ingress rows (side 0) and egress rows (side 1) in one shape, sorted by
# (request_id, side, partition, offset) within a Spark partition.
REQUEST_ROW = pa.schema(
    [
        ("request_id", pa.string()),  # null: the record did not decode
        ("side", pa.int32()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("record_ms", pa.int64()),
        ("decode_error", pa.string()),
        ("operator", pa.string()),
        ("function", pa.string()),
        ("key", pa.string()),
        ("key_is_int", pa.bool_()),
        ("args", pa.binary()),
        ("ts_ms", pa.int64()),
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
INGRESS, EGRESS = 0, 1
_REQUEST_FIELDS = ("operator", "function", "key", "key_is_int", "args")
_REPLY_FIELDS = ("tid", "epoch", "phase", "status", "result", "error", "error_type")

FACTS_SCHEMA = pa.schema(
    [
        ("request_id", pa.string()),  # null: the row reporting undecodable records
        ("submissions", pa.int32()),
        ("replies", pa.int32()),
        ("operator", pa.string()),
        ("function", pa.string()),
        ("key", pa.string()),
        ("key_is_int", pa.bool_()),
        ("args", pa.binary()),
        ("sent_ms", pa.int64()),  # the client's send time (Request.ts_ms), else the ingress record's time
        ("ingress_ms", pa.int64()),  # the (first) ingress record's time: the transaction's ctx.now()
        ("request_ts_ms", pa.int64()),  # Request.ts_ms as sent (0: unknown)
        ("tid", pa.int64()),
        ("epoch", pa.int64()),
        ("phase", pa.int32()),
        ("status", pa.string()),
        ("result", pa.binary()),
        ("error", pa.string()),
        ("error_type", pa.string()),
        ("reply_ms", pa.int64()),  # the first reply's egress record time
        ("reply_partition", pa.int32()),  # … and where it is
        ("reply_offset", pa.int64()),
        ("latency_ms", pa.int64()),
        ("findings", FINDINGS),
    ]
)
ENTRY_SCHEMA = pa.schema(
    [
        ("epoch", pa.int64()),
        ("gen", pa.int64()),
        ("node_id", pa.string()),
        ("sid", pa.int64()),
        ("lc_start", pa.int64()),
        ("lc_end", pa.int64()),
        ("fresh", pa.int64()),
        ("rescheduled", pa.int64()),
        ("resent", pa.int64()),
        ("logged_ms", pa.int64()),
        ("findings", FINDINGS),
    ]
)
LOGGED = pa.struct(
    [
        ("epoch", pa.int64()),
        ("gen", pa.int64()),
        ("node_id", pa.string()),
        ("request_id", pa.string()),
        ("fresh", pa.bool_()),
    ]
)
LOGGED_SCHEMA = pa.schema([("tid", pa.int64()), ("l", LOGGED)])


def finding_dicts(findings: Sequence[Any]) -> list[dict[str, str]]:
    return [
        {"check": f.check, "subject": f.subject, "message": f.message, "severity": f.severity}
        for f in findings
    ]


# ---- exactly once: a sorted stream of request and reply rows → one fact row per request id ----------


def request_facts(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Rows of :data:`REQUEST_ROW`, sorted by (request_id, side, partition, offset) → :data:`FACTS_SCHEMA`.

    A request id's rows may straddle two batches: the last group of each batch waits for the next.
    Rows whose record did not decode (null request id) are counted into one extra fact row with a
    null request id that carries check_undecodable's findings.
    """
    carry: pa.Table | None = None
    bad = {INGRESS: 0, EGRESS: 0}
    examples: dict[int, str] = {}
    for batch in batches:
        table = pa.Table.from_batches([batch])
        unreadable = table.filter(pc.is_null(table.column("request_id")))
        for side in (INGRESS, EGRESS):
            rows = unreadable.filter(pc.equal(unreadable.column("side"), side))
            if len(rows):
                bad[side] += len(rows)
                first = rows.slice(0, 1).to_pylist()[0]
                examples.setdefault(side, f"p{first['partition']}@{first['offset']}: {first['decode_error']}")
        table = table.filter(pc.is_valid(table.column("request_id")))
        if carry is not None:
            table = pa.concat_tables([carry, table])
        if len(table) == 0:
            continue
        starts = _group_starts(table.column("request_id"))
        carry = table.slice(int(starts[-1]))
        yield from _facts(table.slice(0, int(starts[-1])))
    if carry is not None:
        yield from _facts(carry)
    if bad[INGRESS] or bad[EGRESS]:
        found = check_undecodable("ingress", bad[INGRESS], examples.get(INGRESS)) + check_undecodable(
            "egress", bad[EGRESS], examples.get(EGRESS)
        )
        row = dict.fromkeys(FACTS_SCHEMA.names)
        row.update(submissions=bad[INGRESS], replies=bad[EGRESS], findings=finding_dicts(found))
        yield pa.RecordBatch.from_pylist([row], schema=FACTS_SCHEMA)


def _group_starts(ids: pa.ChunkedArray) -> Any:
    """Indices where a new request id starts (``ids`` sorted, no nulls)."""
    arr = ids.combine_chunks()
    if len(arr) == 0:
        return np.zeros(0, dtype=np.int64)
    change = pc.not_equal(arr.slice(1), arr.slice(0, len(arr) - 1)).to_numpy(zero_copy_only=False)
    return np.concatenate([[0], np.nonzero(change)[0] + 1]).astype(np.int64)


def _facts(table: pa.Table) -> Iterator[pa.RecordBatch]:
    """Complete groups only. One submission with one reply can break no exactly-once rule (tested:
    check_request finds nothing there); such groups, nearly all, become facts a column at a time."""
    n = len(table)
    if n == 0:
        return
    starts = _group_starts(table.column("request_id"))
    sizes = np.diff(np.append(starts, n))
    side = table.column("side").to_numpy()
    requests = np.add.reduceat((side == INGRESS).astype(np.int64), starts)
    simple = (sizes == 2) & (requests == 1)  # sorted by side: the request row, then the reply row
    q = pa.array(starts[simple])
    r = pa.array(starts[simple] + 1)
    if len(q):
        col = table.column
        ts = col("ts_ms").take(q)
        sent = pc.if_else(pc.greater(ts, 0), ts, col("record_ms").take(q))
        reply_ms = col("record_ms").take(r)
        columns = {
            "request_id": col("request_id").take(q),
            "submissions": pa.array(np.ones(len(q), dtype=np.int32)),
            "replies": pa.array(np.ones(len(q), dtype=np.int32)),
            **{name: col(name).take(q) for name in _REQUEST_FIELDS},
            "sent_ms": sent,
            "ingress_ms": col("record_ms").take(q),
            "request_ts_ms": ts,
            **{name: col(name).take(r) for name in _REPLY_FIELDS},
            "reply_ms": reply_ms,
            "reply_partition": col("partition").take(r),
            "reply_offset": col("offset").take(r),
            "latency_ms": pc.subtract(reply_ms, sent),
            "findings": pa.ListArray.from_arrays(
                pa.array(np.zeros(len(q) + 1, dtype=np.int32)), pa.array([], FINDING), type=FINDINGS
            ),
        }
        yield pa.Table.from_pydict(columns, schema=FACTS_SCHEMA).combine_chunks().to_batches()[0]
    others = [(int(s), int(k)) for s, k in zip(starts[~simple], sizes[~simple], strict=True)]
    if others:
        yield pa.RecordBatch.from_pylist(
            [_fact(table.slice(s, k).to_pylist()) for s, k in others], FACTS_SCHEMA
        )


def _fact(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The fact row of one request id's records (any number of each side), judged by check_request."""
    rid = rows[0]["request_id"]
    reqs = [r for r in rows if r["side"] == INGRESS]
    reps = [r for r in rows if r["side"] == EGRESS]
    q = reqs[0] if reqs else None
    r = reps[0] if reps else None
    sent = None if q is None else (q["ts_ms"] or q["record_ms"])
    fact: dict[str, Any] = {"request_id": rid, "submissions": len(reqs), "replies": len(reps)}
    fact.update({name: None if q is None else q[name] for name in _REQUEST_FIELDS})
    fact["sent_ms"] = sent
    fact["ingress_ms"] = None if q is None else q["record_ms"]
    fact["request_ts_ms"] = None if q is None else q["ts_ms"]
    fact.update({name: None if r is None else r[name] for name in _REPLY_FIELDS})
    fact["reply_ms"] = None if r is None else r["record_ms"]
    fact["reply_partition"] = None if r is None else r["partition"]
    fact["reply_offset"] = None if r is None else r["offset"]
    fact["latency_ms"] = None if r is None or sent is None else r["record_ms"] - sent
    fact["findings"] = finding_dicts(check_request(rid, reqs, reps))
    return fact


# ---- ordering ---------------------------------------------------------------------------------------


def explode_entries(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Sequencer-log entries → one row per logged transaction (kind "run"): :data:`LOGGED_SCHEMA`.

    An entry lists its rescheduled transactions first and its ``lc_end - lc_start`` fresh ones last.
    Vectorised: the same in Spark SQL (posexplode, size(filter(...))) took 10x longer at 1 M rows.
    """
    for batch in batches:
        entries = batch.column("entries")
        flat = pc.list_flatten(entries)
        parent = pc.list_parent_indices(entries).to_numpy()
        tid = flat.field("tid")
        offsets = entries.offsets.to_numpy()
        starts = offsets[:-1] - offsets[0]  # a sliced list array's offsets point into its parent's values
        position = np.arange(len(flat)) - starts[parent]
        positive = pc.equal(flat.field("kind"), "run").to_numpy(zero_copy_only=False)
        roots = np.bincount(parent, weights=positive, minlength=len(entries)).astype(np.int64)
        n_fresh = pc.subtract(batch.column("lc_end"), batch.column("lc_start")).to_numpy()
        fresh = position >= roots[parent] - n_fresh[parent]
        keep = pa.array(np.nonzero(positive)[0])
        rows = pa.array(parent).take(keep)
        logged = pa.StructArray.from_arrays(
            [
                batch.column("epoch").take(rows),
                batch.column("gen").take(rows),
                batch.column("node_id").take(rows),
                flat.field("request_id").take(keep),
                pa.array(fresh).take(keep),
            ],
            fields=list(LOGGED),
        )
        yield pa.RecordBatch.from_arrays([tid.take(keep), logged], schema=LOGGED_SCHEMA)


def tid_findings(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Groups (tid, logged[], replies[]) → check_tid's findings."""
    for batch in batches:
        found = []
        for row in batch.to_pylist():
            found += check_tid(row["tid"], row["logged"], row["replies"])
        yield pa.RecordBatch.from_pylist(finding_dicts(found), schema=FINDINGS_SCHEMA)


def entry_checks(n_by_gen: dict[int, int], batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Sequencer-log entries → one summary row each, with check_entry's findings."""
    for batch in batches:
        rows: list[dict[str, Any]] = []
        for entry in batch.to_pylist():
            found, s = check_entry(entry, n_by_gen[entry["gen"]])
            rows.append(
                {
                    "epoch": s.epoch,
                    "gen": s.gen,
                    "node_id": s.node_id,
                    "sid": s.sid,
                    "lc_start": s.lc_start,
                    "lc_end": s.lc_end,
                    "fresh": s.fresh,
                    "rescheduled": s.rescheduled,
                    "resent": s.resent,
                    "logged_ms": entry["logged_ms"],
                    "findings": finding_dicts(found),
                }
            )
        yield pa.RecordBatch.from_pylist(rows, schema=ENTRY_SCHEMA)


# ---- state --------------------------------------------------------------------------------------------


def _decoded(data: bytes | None) -> Any:
    return None if data is None else decode_value(data)


def _raw(data: bytes | None) -> msgspec.Raw:
    return NIL if data is None else msgspec.Raw(data)


AppVersions = str | list[tuple[int, int, str]]  # one import path, or (version, first epoch, path) each


def graphs_of(app: AppVersions) -> Graph | GraphAt:
    """The graph to replay with: one app, or the version of each epoch (a cluster's code updates)."""
    if isinstance(app, str):
        return load_graph(app)
    versions = [GraphVersion(number, path, first) for number, first, path in app]
    graphs = {v.number: load_graph(v.import_path) for v in versions}
    return lambda epoch: graphs[version_at(versions, epoch).number]


def serial_findings(
    app: AppVersions,
    snapshot_epoch: int | None,
    snapshot_state: dict[tuple[str, Any], Any] | None,
    changelog: tuple[int, dict[int, tuple[int, int]]] | None,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """All answered requests, in commit order, in one task → SerialCheck's findings; with ``changelog``
    (an epoch bound and, per changelog partition, its records' count and digest sum up to it), also
    whether the changelog holds exactly the replay's writes (:mod:`.changelog_rules`); and the external calls
    and timers the replay's writes record against the completions and firings (:mod:`.effects_rules`)."""
    expect = None if changelog is None else ChangelogExpectation(changelog[0])
    effects = EffectsCheck()
    committed: list[Writes] = []  # the writes of the transaction just fed, when it committed

    def on_commit(graph: Graph, reply: Reply, writes: Writes) -> None:
        committed.append(writes)
        if expect is not None:
            expect.feed(graph, reply.epoch, reply.phase, reply.tid, writes)

    check = SerialCheck(graphs_of(app), snapshot_epoch, snapshot_state, on_commit=on_commit)

    async def replay() -> None:
        # In an event loop: user functions may await asyncio.gather(ctx.call(…), …).
        for batch in batches:
            for row in batch.to_pylist():
                rid = row["request_id"]
                key = key_value(row["key"], row["key_is_int"])
                # The cluster's clock for the transaction is its ingress record's timestamp.
                request = Request(
                    rid, row["operator"], row["function"], key, _raw(row["args"]), row["ingress_ms"]
                )
                reply = Reply(
                    rid,
                    row["tid"],
                    row["epoch"],
                    row["phase"],
                    row["status"],
                    _raw(row["result"]),
                    row["error"],
                    row["error_type"],
                    row["request_ts_ms"] or 0,
                )
                await check.feed(request, reply)
                if committed:
                    system = row["operator"] in SYSTEM_OPERATORS  # only these requests' args matter
                    effects.feed(
                        rid,
                        row["operator"],
                        row["function"],
                        _decoded(row["args"]) if system else None,
                        row["ingress_ms"],
                        row["epoch"],
                        row["tid"],
                        _decoded(row["result"]) if system else None,
                        committed.pop(),
                    )

    asyncio.run(replay())
    found = check.finish() + effects.finish() + [effects.tally()]
    if expect is not None and changelog is not None:
        found += expect.findings(changelog[1])
    yield pa.RecordBatch.from_pylist(finding_dicts(found), schema=FINDINGS_SCHEMA)
