"""The audit rules (styx_py.audit.rules) on hand-made groups, without Spark."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from styx_benchmarks.bank import app as bank_app
from styx_benchmarks.workload import Options
from styx_benchmarks.ycsbt import INITIAL, YcsbT
from styx_py.audit.rules import (
    ERROR,
    WARNING,
    EntrySummary,
    Finding,
    SerialCheck,
    check_entry,
    check_epochs,
    check_invariants,
    check_request,
    check_tid,
    effective_generation,
    mencius_tids,
)
from styx_py.core.wire import NIL, Manifest, Reply, Request, encode_value
from styx_worker.sequencer import Sequencer

# ---- exactly once ------------------------------------------------------------------------------------


def req(offset: int = 5, partition: int = 1) -> dict[str, Any]:
    return {
        "partition": partition,
        "offset": offset,
        "operator": "account",
        "function": "transfer",
        "key": "a",
    }


def rep(
    offset: int = 9, partition: int = 1, tid: int = 7, status: str = "committed", result: Any = 3
) -> dict[str, Any]:
    return {
        "partition": partition,
        "offset": offset,
        "tid": tid,
        "epoch": 2,
        "phase": 0,
        "status": status,
        "result": encode_value(result),
        "error": None if status == "committed" else "insufficient credit",
        "error_type": None if status == "committed" else "Abort",
        "request_ts_ms": 1000,
    }


def checks(findings: list[Finding]) -> list[str]:
    return [f.check for f in findings]


def test_one_request_one_reply_is_clean() -> None:
    assert check_request("r1", [req()], [rep()]) == []


@given(
    st.integers(0, 7), st.integers(0, 10**9), st.integers(1, 10**9), st.sampled_from(["committed", "aborted"])
)
def test_no_single_request_with_single_reply_is_ever_flagged(p: int, off: int, tid: int, status: str) -> None:
    assert check_request("r", [req(off, p)], [rep(off, p, tid, status)]) == []


def test_lost_reply() -> None:
    [f] = check_request("r1", [req(5, 2)], [])
    assert f.check == "exactly_once.lost_reply" and f.severity == ERROR
    assert f.message == "request r1 (account.transfer on 'a', ingress p2@5) has no reply on the egress log"


def test_orphan_reply() -> None:
    [f] = check_request("r1", [], [rep(9, 3)])
    assert f.check == "exactly_once.orphan_reply"
    assert f.message == (
        "reply to unknown request r1: no ingress record has this id "
        "(egress p3@9: committed tid 7 epoch 2 phase 0 result 3)"
    )


def test_duplicate_identical_reply() -> None:
    [f] = check_request("r1", [req()], [rep(9), rep(12)])
    assert f.check == "exactly_once.duplicate_reply"
    assert f.message == (
        "request r1 has 2 replies for 1 submission(s) (identical copies; egress p1@9, p1@12; ingress p1@5)"
    )


def test_duplicate_reply_with_a_changed_result() -> None:
    found = check_request("r1", [req()], [rep(9, result=3), rep(12, result=4)])
    assert checks(found) == ["exactly_once.changed_result", "exactly_once.duplicate_reply"]
    assert "answered in 2 different ways" in found[0].message
    assert "result 3" in found[0].message and "result 4" in found[0].message


def test_resent_request_answered_twice_identically_is_clean() -> None:
    assert check_request("r1", [req(5), req(8)], [rep(9), rep(12)]) == []


def test_resent_request_answered_differently() -> None:
    found = check_request("r1", [req(5), req(8)], [rep(9, tid=7), rep(12, tid=9)])
    assert checks(found) == ["exactly_once.changed_result"]


# ---- ordering: tids ------------------------------------------------------------------------------------


def logged(epoch: int, rid: str = "r1", fresh: bool = True, node: str = "w1") -> dict[str, Any]:
    return {"epoch": epoch, "gen": 0, "node_id": node, "request_id": rid, "fresh": fresh}


def answer(rid: str = "r1", epoch: int = 3, offset: int = 4) -> dict[str, Any]:
    return {"request_id": rid, "epoch": epoch, "partition": 0, "offset": offset}


def test_tid_logged_and_answered_in_its_epoch() -> None:
    assert check_tid(7, [logged(3)], [answer()]) == []
    assert check_tid(7, [logged(3)], []) == []  # no reply: the exactly-once rules report it


@given(st.integers(1, 10**9), st.integers(0, 10**6), st.booleans())
def test_no_tid_logged_once_and_answered_in_its_epoch_is_ever_flagged(
    tid: int, epoch: int, answered: bool
) -> None:
    # The job skips these groups in SQL; this is what makes that sound.
    assert check_tid(tid, [logged(epoch)], [answer(epoch=epoch)] if answered else []) == []


def test_rescheduled_tid_is_answered_in_its_last_epoch() -> None:
    assert check_tid(7, [logged(3), logged(4, fresh=False)], [answer(epoch=4)]) == []
    [f] = check_tid(7, [logged(3), logged(4, fresh=False)], [answer(epoch=3)])
    assert f.check == "ordering.epoch"
    assert (
        f.message
        == "reply to r1 (egress p0@4) says epoch 3, but the sequencer log last runs tid 7 in epoch 4"
    )


def test_tid_clash() -> None:
    found = check_tid(7, [logged(3)], [answer("r1"), answer("r2", offset=5)])
    assert checks(found) == ["exactly_once.tid_clash", "ordering.epoch"]
    assert found[0].message == "tid 7 answers 2 different requests: r1, r2 (egress p0@4, p0@5)"
    assert found[1].message == (
        "reply to r2 (egress p0@5) carries tid 7, which the sequencer log gives to request r1 (epoch 3)"
    )


def test_reply_with_a_tid_the_log_never_ran() -> None:
    [f] = check_tid(7, [], [answer()])
    assert (
        f.message == "reply to r1 (egress p0@4) carries tid 7 epoch 3, but the sequencer log never ran tid 7"
    )


def test_tid_assigned_twice_or_never() -> None:
    assert "assigned fresh 2 times" in check_tid(7, [logged(3), logged(5)], [answer(epoch=5)])[0].message
    assert "never assigned fresh" in check_tid(7, [logged(4, fresh=False)], [answer(epoch=4)])[0].message
    found = check_tid(7, [logged(3, "r1"), logged(3, "r2", fresh=False)], [])
    assert any("gives tid 7 to 2 requests" in f.message for f in found)


# ---- ordering: sequencer-log entries and epochs ---------------------------------------------------------


ANSWERED, WAITING = "answered", "waiting"  # entry kinds of resent request ids (no tid)


def entry(
    epoch: int, node: str, lc_start: int, lc_end: int, tids: list[int | str], gen: int = 0
) -> dict[str, Any]:
    """A sequencer-log entry as the audit reads it: ``tids`` lists a tid per transaction, or the
    kind of a resent request id."""
    rows = [
        {"kind": t, "tid": None, "partition": 0, "offset": i, "request_id": f"resent{i}"}
        if isinstance(t, str)
        else {"kind": "run", "tid": t, "partition": 0, "offset": i, "request_id": f"r{t}"}
        for i, t in enumerate(tids)
    ]
    return {
        "epoch": epoch,
        "node_id": node,
        "gen": gen,
        "lc_start": lc_start,
        "lc_end": lc_end,
        "entries": rows,
    }


def simulate(sizes: list[list[int]], n: int = 2) -> list[dict[str, Any]]:
    """Entries as the workers write them: sequencers rebalanced to the global max every epoch."""
    seqs = [Sequencer(sid, n) for sid in range(1, n + 1)]
    global_lc = 0
    out = []
    for epoch, per_worker in enumerate(sizes):
        for s in seqs:
            s.rebalance(global_lc)
        for s, count in zip(seqs, per_worker, strict=True):
            start = s.lc
            out.append(entry(epoch, f"w{s.sid}", start, start + count, s.assign(count)))
        global_lc = max(s.lc for s in seqs)
    return out


def summaries(entries: list[dict[str, Any]], n: int = 2) -> list[EntrySummary]:
    out = []
    for e in entries:
        found, s = check_entry(e, n)
        assert found == [], found
        out.append(s)
    return out


def test_mencius_entries_and_epochs_are_clean() -> None:
    entries = simulate([[3, 0], [2, 5], [0, 0], [1, 1]])
    assert check_epochs(summaries(entries), {0: 2}) == []
    assert mencius_tids(2, 2, 3, 6) == [8, 10, 12]


def test_tids_follow_the_logged_sequencer_count_after_a_scale_down() -> None:
    """Scaled to 3 workers and back to 2: the cluster keeps the sequencer-id space at 3 (n_seq, logged
    in every entry), so the 2 workers' tids interleave by 3 — not by the 2 workers of the generation."""
    seqs = [Sequencer(sid, 3) for sid in (1, 3)]  # w2 (sid 2) left
    rows = []
    for epoch, counts in enumerate([[2, 1], [0, 3], [1, 1]]):
        top = max(s.lc for s in seqs)
        for s in seqs:
            s.rebalance(top)
        for s, count in zip(seqs, counts, strict=True):
            start = s.lc
            rows.append({**entry(epoch, f"w{s.sid}", start, start + count, s.assign(count)), "n_seq": 3})
    assert check_epochs(summaries(rows, 2), {0: 2}) == []
    assert [summaries([r], 2)[0].sid for r in rows[:2]] == [1, 3]
    # Without the logged count (an entry of an older version) the generation's 2 workers are assumed:
    # the finding a healthy cluster got before the count was read from the log.
    [f], _ = check_entry({**rows[3], "n_seq": 0}, 2)
    assert f.message.endswith(
        "fresh tids 9, 12, 15 do not follow tid = sid + lc·2 for lc in [2, 5): sid 5 is not in 1..2"
    )


def test_rescheduled_and_resent_entries() -> None:
    # w1 (sid 1 of 2) at counter 4: tid 3 rescheduled from an earlier epoch, two fresh, one resend.
    found, s = check_entry(entry(5, "w1", 4, 6, [3, 9, 11, ANSWERED]), 2)
    assert found == []
    assert (s.sid, s.fresh, s.rescheduled, s.resent) == (1, 2, 1, 1)


def test_entry_with_a_resend_before_a_transaction_or_a_bad_tid() -> None:
    [f], _ = check_entry(entry(5, "w1", 4, 6, [3, WAITING, 9, 11]), 2)
    assert f.message.endswith("a resent request is logged before a transaction")
    [f], _ = check_entry(entry(5, "w1", 4, 6, [0, 9, 11]), 2)
    assert "invalid tids 0, 9, 11" in f.message


def test_entry_with_tids_off_the_interleaving() -> None:
    [f], _ = check_entry(entry(5, "w1", 4, 6, [9, 13]), 2)
    assert f.check == "ordering.mencius"
    assert f.message == (
        "epoch 5, worker w1 (generation 0, 2 sequencers): fresh tids 9, 13 do not follow "
        "tid = sid + lc·2 for lc in [4, 6): expected 9, 11"
    )
    [f], _ = check_entry(entry(5, "w1", 4, 7, [9, 11]), 2)
    assert "counters [4, 7) do not match its 2 transactions" in f.message
    [f], _ = check_entry(entry(5, "w1", 4, 5, [20, 9]), 2)
    assert "rescheduled tids 20 are not ascending and below the fresh ones" in f.message


def test_missing_worker_gap_and_counters() -> None:
    entries = simulate([[3, 0], [2, 5], [1, 1], [1, 0]])
    s = summaries(entries)
    holed = [x for x in s if not (x.epoch == 1 and x.node_id == "w2")]
    # The hole, and (a consequence) epoch 2 starting above what the log shows of epoch 1.
    f, g = check_epochs(holed, {0: 2})
    assert g.message == "epoch 2 starts at counter 8, but epoch 1 ended at counter 5"
    assert (
        f.severity == ERROR
        and f.message == "epoch 1 (generation 0) is logged by 1 of 2 workers (w1): a hole in the log"
    )
    [f] = check_epochs(s[:-1], {0: 2})  # the last epoch half-logged: still running
    assert f.severity == WARNING and "still running or never decided" in f.message
    gap = [x for x in s if x.epoch != 2]
    found = check_epochs(gap, {0: 2})
    assert "epochs 2..2 are missing from the sequencer log" in found[0].message
    # A sequencer that did not rebalance to the previous epoch's maximum.
    bad = [x if (x.epoch, x.node_id) != (2, "w2") else EntrySummary(2, 0, "w2", 2, 0, 1, 1, 0, 0) for x in s]
    messages = [f.message for f in check_epochs(bad, {0: 2})]
    assert any("epoch 2: sequencers start at different counters" in m for m in messages)


def test_sid_used_by_two_workers() -> None:
    s = summaries(simulate([[1, 1]]))
    clone = EntrySummary(0, 0, "w3", 1, 0, 1, 1, 0, 0)
    found = check_epochs([*s, clone], {0: 3})
    assert any(f.message == "generation 0: sid 1 used by ['w1', 'w3']" for f in found)


def test_effective_generation_is_the_manifests() -> None:
    pairs = [(0, 0), (12, 1), (12, 2), (30, 3)]
    m = Manifest(10, 0, 4, {}, pairs)
    for epoch in (0, 11, 12, 29, 30, 99):
        assert effective_generation(epoch, pairs) == m.generation_of(epoch)


# ---- state: invariants and the serial replay -----------------------------------------------------------


def test_invariant_findings_name_the_workload() -> None:
    wl = YcsbT(Options(keys=3))
    state: dict[tuple[str, str | int], int] = {("account", f"acct{i}"): INITIAL for i in range(3)}
    assert check_invariants("ycsbt", wl.check_state(state), 4) == []
    state[("account", "acct1")] = INITIAL + 7
    [f] = check_invariants("ycsbt", wl.check_state(state), 4)
    assert f.check == "invariant.ycsbt" and f.subject == "snapshot 4"
    assert f.message.endswith("(+7)")


def request(rid: str, key: str, function: str, *args: Any) -> Request:
    return Request(rid, "account", function, key, msgspec.Raw(encode_value(list(args))))


def reply(
    rid: str, tid: int, epoch: int, status: str = "committed", result: Any = None, error: str | None = None
) -> Reply:
    raw = msgspec.Raw(encode_value(result)) if status == "committed" else NIL
    return Reply(rid, tid, epoch, 0, status, raw, error, None if status == "committed" else "Abort")


LOG = [
    (request("d", "a", "deposit", 100), reply("d", 1, 0, result=100)),
    (request("t1", "a", "transfer", "b", 30), reply("t1", 3, 1, result=70)),
    (
        request("t2", "b", "transfer", "a", 1000),
        reply("t2", 2, 2, "aborted", error="insufficient credit in b: 30 < 1000"),
    ),
    (request("t3", "b", "transfer", "a", 10), reply("t3", 4, 2, result=20)),
]


async def serial(
    snapshot_epoch: int | None, state: dict[tuple[str, Any], Any] | None, log: Any = LOG
) -> list[Finding]:
    check = SerialCheck(bank_app, snapshot_epoch, state)
    for q, r in log:
        await check.feed(q, r)
    return check.finish()


async def test_serial_replay_matches_the_log_and_the_snapshot() -> None:
    assert await serial(1, {("account", "a"): 70, ("account", "b"): 30}) == []
    assert await serial(2, {("account", "a"): 80, ("account", "b"): 20}) == []
    assert await serial(None, None) == []


async def test_serial_replay_finds_a_tampered_snapshot() -> None:
    [f] = await serial(1, {("account", "a"): 77, ("account", "b"): 30})
    assert f.check == "serial.state"
    assert (
        f.message == "account 'a': snapshot 1 holds 77, the serial replay of the log up to epoch 1 gives 70"
    )


async def test_serial_replay_finds_a_wrong_reply() -> None:
    log = list(LOG)
    log[1] = (LOG[1][0], reply("t1", 3, 1, result=71))
    [f] = await serial(None, None, log)
    assert f.check == "serial.outcome"
    assert f.message == (
        "reply to t1 (account.transfer on 'a', tid 3 epoch 1): the result is 71, the serial replay gives 70"
    )


async def test_serial_replay_names_the_fields_of_a_dict_result_that_differ() -> None:
    from styx_py.audit.rules import _difference

    got = reply("r", 1, 0, result={"id": "x", "ts": 5, "n": 1})
    assert _difference(got, ("committed", {"id": "x", "ts": 7, "n": 1})) == (
        "the result differs from the serial replay's in 1 field(s): ts: 5 vs 7"
    )
    assert _difference(got, ("aborted", "no")) == (
        "the reply is committed {'id': 'x', 'ts': 5, 'n': 1}, the serial replay gives aborted 'no'"
    )


async def test_two_replies_at_one_commit_place_are_a_finding_and_the_second_is_not_replayed() -> None:
    twin = (request("t9", "b", "transfer", "a", 5), reply("t9", 3, 1, result=25))
    [f] = await serial(None, None, [LOG[0], LOG[1], twin, LOG[3]])
    assert f.check == "serial.outcome"
    assert f.subject == "t9"
    assert f.message == (
        "reply to t9 (account.transfer on 'b', committed) takes the commit place (epoch, phase, tid) "
        "(1, 0, 3), not after (1, 0, 3) of the reply to t1: one place commits one transaction"
    )
    # Replayed without t9: t3 still sees b at 30 and answers 20. A feed out of order is the same finding.
    found = await serial(None, None, [LOG[1], LOG[0]])
    assert [f.subject for f in found] == ["t1", "d"]
    assert "takes the commit place (epoch, phase, tid) (0, 0, 1), not after (1, 0, 3)" in found[1].message


# ---- rows: decoding log records and snapshot objects (Arrow) --------------------------------------------


def test_decode_records_of_every_kind() -> None:
    pa = pytest.importorskip("pyarrow")
    from styx_py.audit.rows import KafkaRecord, decode_records, decode_snapshot_object
    from styx_py.core.wire import Answered, PartitionSnapshot, Run, SeqLogEntry

    enc = msgspec.msgpack.encode
    q = request("r1", "a", "transfer", "b", 3)
    recs = [
        KafkaRecord("in", 0, 0, 1000, b"k", [("h", b"v")], enc(q)),
        KafkaRecord("in", 0, 1, 1001, None, [], b"\xff\x00"),
    ]
    batch = decode_records("ingress", recs)
    rows = batch.to_pylist()
    assert rows[0]["value"]["request_id"] == "r1" and rows[0]["value"]["key"] == "a"
    assert rows[0]["headers"] == [{"key": "h", "value": b"v"}] and rows[0]["decode_error"] is None
    assert rows[1]["value"] is None and rows[1]["decode_error"]
    r = reply("r1", 3, 1, result=5)
    [row] = decode_records("egress", [KafkaRecord("out", 1, 7, 1002, b"r1", [], enc(r))]).to_pylist()
    assert (row["value"]["tid"], row["value"]["status"], row["offset"]) == (3, "committed", 7)
    e = SeqLogEntry(4, "w1", 2, [Run(5, 0, 10, "r1"), Answered(1, 3, "r9")], 1, 3)
    [row] = decode_records("seqlog", [KafkaRecord("seq", 0, 0, 1003, None, [], enc(e))]).to_pylist()
    assert row["value"]["entries"] == [
        {"kind": "run", "tid": 5, "partition": 0, "offset": 10, "request_id": "r1"},
        {"kind": "answered", "tid": None, "partition": 1, "offset": 3, "request_id": "r9"},
    ]
    snap = PartitionSnapshot(4, 2, [("account", "a", encode_value(5)), ("account", 7, None)], 0, [], 0, 0)
    rows = decode_snapshot_object(4, "snapshots/p00002/000000000004.delta", 4, enc(snap)).to_pylist()
    assert [(x["key"], x["key_is_int"], x["value"]) for x in rows] == [
        ("a", False, encode_value(5)),
        ("7", True, None),
    ]
    assert isinstance(batch, pa.RecordBatch)
    with pytest.raises(ValueError, match="does not decode"):
        decode_snapshot_object(4, "x", 4, b"\x01")


def test_explode_entries_marks_rescheduled_and_fresh() -> None:
    pa = pytest.importorskip("pyarrow")
    from styx_py.audit.rows import SEQLOG
    from styx_py.audit.tasks import explode_entries

    rows = [
        entry(0, "w9", 0, 0, []),
        entry(5, "w1", 4, 6, [3, 9, 11, ANSWERED]),  # tid 3 rescheduled, 9 and 11 fresh, one resend
        entry(5, "w2", 4, 5, [10]),
    ]
    batch = pa.RecordBatch.from_struct_array(pa.array(rows, SEQLOG))
    for b in (batch, batch.slice(1)):  # Spark may hand over slices
        [out] = list(explode_entries(iter([b])))
        got = [
            (r["tid"], r["l"]["epoch"], r["l"]["node_id"], r["l"]["request_id"], r["l"]["fresh"])
            for r in out.to_pylist()
        ]
        assert got == [
            (3, 5, "w1", "r3", False),
            (9, 5, "w1", "r9", True),
            (11, 5, "w1", "r11", True),
            (10, 5, "w2", "r10", True),
        ]


def stream_rows(rid: str | None, side: int, offset: int, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "request_id": rid,
        "side": side,
        "partition": 0,
        "offset": offset,
        "record_ms": 1000 + offset,
    }
    if side == 0:
        row.update(
            operator="account", function="transfer", key="a", key_is_int=False, args=b"\x90", ts_ms=900
        )
    else:
        row.update(
            tid=offset, epoch=1, phase=0, status="committed", result=encode_value(5), request_ts_ms=900
        )
    row.update(fields)
    return row


def test_request_facts_stream_across_batches() -> None:
    pa = pytest.importorskip("pyarrow")
    from styx_py.audit.tasks import REQUEST_ROW, request_facts

    rows = [
        stream_rows(
            None, 0, 7, decode_error="DecodeError: bad"
        ),  # undecodable: null request id, sorted first
        stream_rows("a", 0, 1),
        stream_rows("a", 1, 2),
        stream_rows("b", 0, 3),  # b: answered twice, split across two batches
        stream_rows("b", 1, 4),
        stream_rows("b", 1, 5, tid=4),
        stream_rows("c", 0, 6),  # c: never answered
        stream_rows("d", 1, 8),  # d: a reply nobody asked for
        stream_rows("e", 0, 9),
        stream_rows("e", 1, 10),
    ]
    batch = pa.RecordBatch.from_pylist(rows, REQUEST_ROW)
    pieces = [batch.slice(0, 5), batch.slice(5, 1), batch.slice(6)]
    facts = [r for out in request_facts(iter(pieces)) for r in out.to_pylist()]
    by_id = {f["request_id"]: f for f in facts}
    assert set(by_id) == {None, "a", "b", "c", "d", "e"}
    assert by_id["a"]["findings"] == [] and by_id["a"]["latency_ms"] == 1002 - 900
    assert (by_id["a"]["submissions"], by_id["a"]["replies"], by_id["a"]["tid"]) == (1, 1, 2)
    assert [f["check"] for f in by_id["b"]["findings"]] == ["exactly_once.duplicate_reply"]
    assert "p0@4, p0@5" in by_id["b"]["findings"][0]["message"]
    assert [f["check"] for f in by_id["c"]["findings"]] == ["exactly_once.lost_reply"]
    assert [f["check"] for f in by_id["d"]["findings"]] == ["exactly_once.orphan_reply"]
    assert by_id["e"]["findings"] == []
    [bad] = by_id[None]["findings"]
    assert bad["severity"] == WARNING
    assert bad["message"] == (
        "1 ingress records do not decode (the cluster skips them: no reply is possible); "
        "the first: p0@7: DecodeError: bad"
    )
