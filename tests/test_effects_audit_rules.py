"""The audit's external-call and timer rules (styx_py/audit/effects_rules.py), without Spark: a clean
history passes, and each tampered history (a second completion, an intent lost, a timer fired early or
twice) is named by its check."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from styx_py.audit.effects_rules import TALLY, EffectsCheck
from styx_py.audit.rules import ERROR, INFO, WARNING, Finding
from styx_py.core.effectids import OUTBOX, TIMERS, owner_of
from styx_py.core.wire import encode_value

OWNER = "seat/1"
CALL = "req-1/0"
TIMER = "seat/1@abc"
DUE = 10_000


def _intent() -> list[Any]:
    return ["payments", "charge", ["ann", 5], ["seat", "paid", 1, []], "0"]


def _hold(check: EffectsCheck, tid: int = 1) -> None:
    """The transaction that records an intent and sets a timer due at DUE."""
    check.feed(
        "req-1",
        "seat",
        "hold",
        None,
        1_000,
        0,
        tid,
        None,
        {
            ("seat", 1): encode_value({"state": "held"}),
            (OUTBOX, OWNER): encode_value({CALL: _intent()}),
            (TIMERS, OWNER): encode_value({TIMER: [DUE, "seat", "expire", 1, []]}),
        },
    )


def _complete(check: EffectsCheck, rid: str, tid: int, took_effect: bool, clears: bool = True) -> None:
    writes = {(OUTBOX, OWNER): None} if clears else {}
    check.feed(rid, OUTBOX, "complete", [CALL, True, "r1", ""], 2_000, 1, tid, took_effect, writes)


def _fire(check: EffectsCheck, rid: str, tid: int, now_ms: int, result: str = "fired") -> None:
    writes = {(TIMERS, OWNER): None} if result == "fired" else {}
    check.feed(rid, TIMERS, "fire", [TIMER], now_ms, 2, tid, result, writes)


def _by_check(found: list[Finding]) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in found:
        out.setdefault(f.check, []).append(f)
    return out


def test_a_clean_history_has_no_findings() -> None:
    check = EffectsCheck()
    _hold(check)
    _complete(check, "ext-a", 5, True)
    _complete(check, "ext-b", 6, False, clears=False)  # a retry that ended otherwise: did nothing
    _fire(check, "t-early", 7, DUE - 1, "early")  # found early: stays
    _fire(check, "t-1", 8, DUE)
    _fire(check, "t-2", 9, DUE + 5, "gone")
    assert check.finish() == []
    assert (check.calls, check.timers) == (1, 1)


def test_a_completion_that_settled_a_failed_continuation_took_effect() -> None:
    """The continuation failed (its completion's reply failed, nothing written); the worker's settling
    completion cleared the intent without it: that one took effect, and is counted as a failed one."""
    check = EffectsCheck()
    _hold(check)
    check.feed(
        "ext-a", OUTBOX, "complete", [CALL, True, "r1", ""], 2_000, 1, 5, None, {}
    )  # failed: no writes
    settle = [CALL, True, "r1", "", "ValueError: no"]
    writes = {(OUTBOX, OWNER): None}
    check.feed(
        "ext-a-settle", OUTBOX, "complete", settle, 2_100, 1, 6, "continuation failed: ValueError: no", writes
    )
    _fire(check, "t-1", 8, DUE)
    assert check.finish() == []
    assert check.counted() == {
        "intents": 1,
        "responses": 1,
        "continuations": 0,
        "continuations_failed": 1,
        "timers": 1,
        "timers_fired": 1,
    }


def test_a_call_in_flight_at_the_end_is_a_warning() -> None:
    check = EffectsCheck()
    _hold(check)
    found = check.finish()
    assert [(f.check, f.severity, f.subject) for f in found] == [("effects.response", WARNING, CALL)]
    assert "still pending" in found[0].message


def test_an_intent_cleared_without_a_completion_is_an_error() -> None:
    check = EffectsCheck()
    _hold(check)
    check.feed("req-2", "seat", "oops", None, 1_500, 0, 2, None, {(OUTBOX, OWNER): None})
    found = check.finish()
    assert [(f.check, f.severity) for f in found] == [("effects.response", ERROR)]
    assert "tid 2 epoch 0" in found[0].message and "without a completion" in found[0].message


def test_a_completion_of_an_intent_never_recorded_is_an_error() -> None:
    check = EffectsCheck()
    _complete(check, "ext-a", 5, True, clears=False)
    by = _by_check(check.finish())
    assert "no committed transaction recorded" in by["effects.response"][0].message


def test_two_completions_that_took_effect_are_a_continuation_run_twice() -> None:
    check = EffectsCheck()
    _hold(check)
    _complete(check, "ext-a", 5, True)
    _complete(check, "ext-b", 6, True, clears=False)  # tampered: the cluster says both took effect
    by = _by_check(check.finish())
    assert set(by) == {"effects.continuation"}
    messages = " | ".join(f.message for f in by["effects.continuation"])
    assert "2 completions took effect (ext-a, ext-b" in messages
    assert "did not clear that intent" in messages


def test_a_new_intent_under_a_completed_key_is_a_new_call() -> None:
    check = EffectsCheck()
    _hold(check)
    _complete(check, "ext-a", 5, True)
    check.feed(
        "req-3",
        "seat",
        "refund",
        None,
        3_000,
        3,
        10,
        None,
        {(OUTBOX, OWNER): encode_value({CALL: _intent()})},
    )
    _complete(check, "ext-c", 11, True)
    assert check.finish() == []
    assert check.calls == 2


def test_a_timer_fired_before_its_due_time_is_an_error() -> None:
    check = EffectsCheck()
    _hold(check)
    _complete(check, "ext-a", 5, True)
    _fire(check, "t-1", 8, DUE - 250)  # tampered: "fired" at a sequenced time before the due time
    found = check.finish()
    assert [f.check for f in found] == ["timers.fired"]
    assert "250 ms before its due time 10000 ms" in found[0].message


def test_a_timer_fired_twice_or_never_set_is_an_error() -> None:
    check = EffectsCheck()
    _hold(check)
    _complete(check, "ext-a", 5, True)
    _fire(check, "t-1", 8, DUE)
    _fire(check, "t-2", 9, DUE + 1)  # tampered: a second firing that ran the target
    check.feed("t-3", TIMERS, "fire", ["seat/2@zzz"], DUE, 2, 10, "fired", {})
    found = check.finish()
    assert {f.check for f in found} == {"timers.fired"}
    messages = " | ".join(f.message for f in found)
    assert "fired 2 times (t-1, t-2)" in messages
    assert "'seat/2@zzz', which was never set" in messages


def test_findings_beyond_the_limit_are_counted() -> None:
    check = EffectsCheck(max_findings=2)
    for i in range(5):
        check.feed(f"t-{i}", TIMERS, "fire", [f"x@{i}"], 0, 0, i, "fired", {})
    found = check.finish()
    assert len(found) == 3
    assert found[-1].message == "5 such findings in all (3 not listed)"


# ---- the rules inside the serial replay (styx_py.audit.tasks.serial_findings), on the reservation app


APP = "styx_benchmarks.reservations:app"
T0 = 1_800_000_000_000  # ms


def _row(
    rid: str, op: str, fn: str, key: str, args: list[Any], ms: int, epoch: int, tid: int, result: Any
) -> dict[str, Any]:
    return {
        "request_id": rid,
        "operator": op,
        "function": fn,
        "key": key,
        "key_is_int": False,
        "args": encode_value(args),
        "ingress_ms": ms,
        "request_ts_ms": ms,
        "tid": tid,
        "epoch": epoch,
        "phase": 0,
        "status": "committed",
        "result": encode_value(result),
        "error": None,
        "error_type": None,
    }


def _replayed(rows: list[dict[str, Any]]) -> list[Finding]:
    import pyarrow as pa

    from styx_py.audit.tasks import serial_findings

    batch = pa.RecordBatch.from_pylist(rows)
    out = [f for b in serial_findings(APP, None, None, None, iter([batch])) for f in b.to_pylist()]
    return [Finding(f["check"], f["subject"], f["message"], f["severity"]) for f in out]


async def _held(rid: str, seat: str, ttl_s: float) -> tuple[str, str, int]:
    """The charge's call id, the timer id and its due time of a hold, as the replay records them."""
    from styx_py.audit.tasks import graphs_of
    from styx_py.core.serial import apply_serially
    from styx_py.core.wire import Request, decode_value

    state: dict[Any, bytes] = {}
    graph = graphs_of(APP)
    assert not callable(graph)
    request = Request(rid, "seat", "hold", seat, msgspec.Raw(encode_value(["ann", 5, ttl_s])), T0)
    outcome = await apply_serially(graph, state, request, 1, {})
    assert outcome[0] == "committed", outcome
    owner = owner_of("seat", seat)
    ((timer, (due, *_)),) = decode_value(state[TIMERS, owner]).items()
    return outcome[1], timer, due


def _log(tampered: bool) -> list[dict[str, Any]]:
    """Seat s0 held, charged and paid; seat s1 held and its timer fired once due (its charge completes
    after the release: the continuation refunds it, an intent still pending at the end). Tampered: the
    cluster says a second completion of s0's charge took effect, and s1's timer fired early."""
    import asyncio

    charge0, _, _ = asyncio.run(_held("h0", "s0", 30.0))
    charge1, timer1, due1 = asyncio.run(_held("h1", "s1", 0.5))
    ok = {"receipt": 1}
    fire_at = due1 - 100 if tampered else due1
    rows = [
        _row("h0", "seat", "hold", "s0", ["ann", 5, 30.0], T0, 0, 1, charge0),
        _row("h1", "seat", "hold", "s1", ["ann", 5, 0.5], T0, 0, 2, charge1),
        _row("c0", OUTBOX, "complete", owner_of("seat", "s0"), [charge0, True, ok, ""], T0 + 50, 1, 3, True),
        _row(
            "c0b",
            OUTBOX,
            "complete",
            owner_of("seat", "s0"),
            [charge0, False, None, "lost"],
            T0 + 60,
            1,
            4,
            tampered,
        ),
        _row("f1", TIMERS, "fire", owner_of("seat", "s1"), [timer1], fire_at, 2, 5, "fired"),
        _row(
            "c1", OUTBOX, "complete", owner_of("seat", "s1"), [charge1, True, ok, ""], due1 + 10, 3, 6, True
        ),
    ]
    return rows


def _effects(found: list[Finding]) -> list[Finding]:
    return [f for f in found if f.check.startswith(("effects.", "timers.")) and f.severity != INFO]


def test_the_replay_of_a_reservation_log_passes_the_effects_checks() -> None:
    found = _replayed(_log(tampered=False))
    assert [f for f in found if f.severity == ERROR] == []
    # What was checked: 2 charges and s1's refund recorded; 2 completions took effect, each running its
    # continuation (paid); s1's timer and s0's (cancelled by paid) set, s1's fired.
    [tally] = [f for f in found if f.check == TALLY]
    assert tally.severity == INFO
    assert json.loads(tally.message) == {
        "intents": 3,
        "responses": 2,
        "continuations": 2,
        "continuations_failed": 0,
        "timers": 2,
        "timers_fired": 1,
    }
    # s1's refund, asked for by the continuation after the release, is the one call still in flight.
    assert [(f.check, f.severity, f.subject.split(":")[0]) for f in _effects(found)] == [
        ("effects.response", WARNING, "refund")
    ]


def test_the_replay_of_a_tampered_reservation_log_names_each_effects_defect() -> None:
    found = _effects(_replayed(_log(tampered=True)))
    errors: dict[str, str] = {}
    for f in found:
        if f.severity == ERROR:
            errors[f.check] = errors.get(f.check, "") + " | " + f.message
    assert set(errors) == {"effects.continuation", "timers.fired"}, found
    assert "did not clear that intent" in errors["effects.continuation"]
    assert "2 completions took effect (c0, c0b" in errors["effects.continuation"]
    assert "100 ms before its due time" in errors["timers.fired"]
