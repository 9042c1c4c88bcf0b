"""Admission control (styx_worker.admission) and refused requests end to end.

Properties: the policy admits at most its batch size (rescheduled transactions included), keeps at
most ``admission_queue_ms`` worth of batches buffered and refuses the rest; the batch size follows
the measured epoch durations (shrinks when an epoch ran long, grows when a full one ran short, within
a factor of two, ``MIN_EPOCH_SIZE`` and ``epoch_size_max``). From the first batch of a new
generation the backlog of the stall is admitted at the batch size, nothing refused, until the buffer
is back under the cap or for at most ``CATCHUP_FACTOR`` times the stall (an overload is refused after
that); no epoch end here for ``STALL_PACES`` paces, or an epoch that ran that long, is such a stall
too, and the epochs in it are not measured; an idle worker is not stalled. The gate counts new
request ids only: resent copies ride along in a batch and do not count against the cap. A new
request that would join its root entity's queue of rescheduled transactions (those waiting, and
those of its batch admitted into it before it) deeper than it runs within the queue bound is
refused, those of other entities are admitted; the same burst a running cluster refuses in part
is admitted whole after a recovery. A batch
with refusals logs them as ``Refused`` entries and answers each with a ``refused`` reply recorded in
the reply table; a resent
copy gets the same reply; the batch re-formed from its log entry refuses the same requests with
identical replies. In the simulation, offered load far past the bound with crashes and restarts:
every request is answered exactly once, the admitted ones equal the serial execution, the others are
``refused`` (the SDK raises ``Overloaded``), and the cluster says ``overloaded``.
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from styx_benchmarks.driver import RunResult, SdkSender, run_open_loop
from styx_client import StyxClient
from styx_client.gateway.outcomes import reply_outcome
from styx_client.sdk.replies import result_of
from styx_client.sdk.window import ALPHA, MIN_WINDOW, InFlightWindow
from styx_py.core.errors import Overloaded
from styx_py.core.wire import (
    IngressRecord,
    Refusal,
    Refused,
    Reply,
    ReplyStatus,
    Request,
    Run,
    StatusRequest,
    encode_value,
)
from styx_py.stack.local import LocalStack, admin
from styx_py.testing.cluster import SimCluster, check_against_serial
from styx_py.testing.memory import MemoryIngress, MemoryLog
from styx_worker.admission import (
    CATCHUP_FACTOR,
    CATCHUP_MIN_PACES,
    MIN_EPOCH_SIZE,
    STALL_PACES,
    Admission,
    AdmissionGate,
)
from styx_worker.batch import HOT_BATCHES, BatchFormer, refusal
from styx_worker.effects import Outbox, Take
from styx_worker.replies import ReplyOut
from styx_worker.txn import Resend, RootTxn
from tests.service_fixtures import ClusterFactory
from tests.test_bench import SlowWork
from tests.test_oracle import APP, submit_random_mix

# ---- the policy (pure) ------------------------------------------------------------------------------


def test_below_the_bound_everything_is_admitted() -> None:
    a = Admission(100, epoch_ms=200, queue_ms=400)
    d = a.decide(room=100, rescheduled=0, pending=70, now=0.0)
    assert (d.admit, d.refuse) == (70, 0)


def test_past_the_bound_the_backlog_is_capped_and_the_rest_refused() -> None:
    a = Admission(100, epoch_ms=200, queue_ms=400)  # two batches may stay buffered
    assert a.backlog_max == 200
    d = a.decide(room=100, rescheduled=0, pending=1000, now=0.0)
    assert (d.admit, d.refuse) == (100, 700)
    assert a.refused_total == 700


def test_rescheduled_transactions_count_against_the_batch() -> None:
    a = Admission(100, epoch_ms=200, queue_ms=400)
    d = a.decide(room=70, rescheduled=30, pending=1000, now=0.0)
    assert (d.admit, d.refuse) == (70, 730)


def test_off_or_no_queue_bound_never_refuses() -> None:
    off = Admission(100, epoch_ms=0, queue_ms=400)
    assert off.decide(room=100, rescheduled=0, pending=10**6, now=0.0) == off.decide(100, 0, 10**6, 0.0)
    assert off.decide(room=100, rescheduled=0, pending=10**6, now=0.0).refuse == 0
    unbounded = Admission(100, epoch_ms=200, queue_ms=0)
    assert unbounded.decide(room=100, rescheduled=0, pending=10**6, now=0.0).refuse == 0


def test_a_slow_epoch_shrinks_the_batch_in_proportion_at_most_by_half() -> None:
    a = Admission(1000, epoch_ms=100, queue_ms=200)
    a.taken(1, now=0.0, batch=1000)
    a.finished(1, now=0.125)  # 125 ms for a 100 ms target
    assert a.size == 800
    a.taken(2, now=1.0, batch=800)
    a.finished(2, now=1.5)  # four times too long: at most halved
    assert a.size == 400
    assert a.decide(room=1000, rescheduled=0, pending=5000, now=0.0).admit == 400


def test_a_slow_batch_shrinks_the_size_at_most_by_half_and_a_small_one_not_at_all() -> None:
    a = Admission(1000, epoch_ms=100, queue_ms=200)
    a.taken(1, now=0.0, batch=3)
    a.finished(1, now=0.4)  # the fixed cost of an epoch (a slow store), not the batch
    assert a.size == 1000
    a.taken(2, now=1.0, batch=600)
    a.finished(2, now=1.4)  # 600 * 100/400 = 150, but at most by half
    assert a.size == 500


def test_a_full_fast_epoch_grows_the_batch_at_most_double_and_never_past_the_max() -> None:
    a = Admission(1000, epoch_ms=100, queue_ms=200)
    a.size = 100
    a.taken(1, now=0.0, batch=100)
    a.finished(1, now=0.080)  # 80 ms: 100 * 100/80
    assert a.size == 125
    a.taken(2, now=1.0, batch=125)
    a.finished(2, now=1.001)
    assert a.size == 250, "at most double"
    a.size = 900
    a.taken(3, now=2.0, batch=900)
    a.finished(3, now=2.001)
    assert a.size == 1000, "never past epoch_size_max"


def test_a_batch_that_was_not_full_and_fast_changes_nothing() -> None:
    a = Admission(1000, epoch_ms=100, queue_ms=200)
    a.size = 300
    a.taken(1, now=0.0, batch=20)
    a.finished(1, now=0.010)
    assert a.size == 300


def test_the_batch_never_shrinks_below_the_floor_and_unknown_epochs_are_ignored() -> None:
    a = Admission(1000, epoch_ms=100, queue_ms=200)
    for epoch in range(20):
        a.taken(epoch, now=epoch * 10.0, batch=a.size)
        a.finished(epoch, now=epoch * 10.0 + 0.4)
    assert a.size == MIN_EPOCH_SIZE
    a.finished(99, now=1000.0)  # a replayed epoch: nothing was taken live
    assert a.size == MIN_EPOCH_SIZE
    assert Admission(4, epoch_ms=100, queue_ms=200).size == 4


@given(
    st.integers(1, 5000),
    st.integers(0, 100),
    st.integers(0, 20_000),
    st.floats(1, 1000),
    st.floats(0, 5000),
)
def test_a_decision_never_admits_more_than_room_and_size_nor_takes_more_than_pending(
    size_max: int, rescheduled: int, pending: int, epoch_ms: float, queue_ms: float
) -> None:
    a = Admission(size_max, epoch_ms, queue_ms)
    room = max(0, size_max - rescheduled)
    d = a.decide(room, rescheduled, pending, 0.0)
    assert 0 <= d.admit <= min(room, pending)
    assert d.admit + rescheduled <= max(a.size, rescheduled)
    assert d.refuse >= 0 and d.admit + d.refuse <= pending
    if d.refuse:
        assert pending - d.admit - d.refuse == a.backlog_max, "the backlog kept is the cap"


# ---- after a stall (pure) --------------------------------------------------------------------------


def _stalled(stall_s: float, size_max: int = 100) -> Admission:
    """A policy whose buffer started waiting at 10.0 and whose first batch of a new generation is at
    10.0 + ``stall_s`` (two batches may stay buffered: epoch 200 ms, queue 400 ms)."""
    a = Admission(size_max, epoch_ms=200, queue_ms=400)
    a.arrived(10.0)
    a.arrived(10.5)  # more records: the buffer was not empty, so the wait started at 10.0
    a.resumed(10.0 + stall_s)
    return a


def test_the_backlog_of_a_stall_is_admitted_in_batches_until_the_buffer_is_drained() -> None:
    a = _stalled(stall_s=3.0)
    assert a.catching_up and a.catchup_until == pytest.approx(13.0 + CATCHUP_FACTOR * 3.0)
    pending, now, wave = 1000, 13.0, 300
    while pending > 100:  # the normal cap would refuse part of this
        d = a.decide(room=100, rescheduled=0, pending=pending, now=now)
        assert (d.admit, d.refuse) == (100, 0)
        pending, now = pending - 100 + 20, now + 0.2  # a healthy cluster: 20 arrive per batch of 100
        if pending - 100 <= a.backlog_max:
            pending, wave = pending + wave, 0  # once under the cap, a wave of copies clients resent
    assert a.refused_total == 0 and wave == 0
    d = a.decide(room=100, rescheduled=0, pending=pending, now=now)  # the batch takes all: caught up
    assert (d.admit, d.refuse) == (pending, 0) and not a.catching_up
    d = a.decide(room=100, rescheduled=0, pending=1000, now=now + 0.2)
    assert (d.admit, d.refuse) == (100, 700), "after the catch-up the cap holds again"


def test_an_overload_that_coincides_with_a_stall_is_refused_after_the_bound() -> None:
    a = _stalled(stall_s=2.0)
    end = 12.0 + CATCHUP_FACTOR * 2.0
    now, pending = 12.0, 1000
    while now < end:  # an overload: the buffer never drains
        assert a.decide(room=100, rescheduled=0, pending=pending, now=now).refuse == 0
        now, pending = now + 0.2, pending + 100
    d = a.decide(room=100, rescheduled=0, pending=pending, now=now)
    assert d.refuse == pending - 100 - a.backlog_max > 0 and not a.catching_up


def test_a_stall_too_short_to_measure_is_worked_through_for_a_few_epochs_worth() -> None:
    a = Admission(100, epoch_ms=200, queue_ms=400)  # never took a batch, nothing waited
    a.resumed(5.0)
    assert a.catchup_until == pytest.approx(5.0 + CATCHUP_MIN_PACES * 0.2)
    assert a.decide(room=100, rescheduled=0, pending=1000, now=5.0).refuse == 0
    assert a.decide(room=100, rescheduled=0, pending=1000, now=5.0 + CATCHUP_MIN_PACES * 0.2).refuse == 700


def test_an_idle_time_is_not_a_stall() -> None:
    """The wait counts from the first record buffered after the buffer emptied, not from the last
    batch: a worker idle for an hour that then recovers catches up for the floor only."""
    a = Admission(100, epoch_ms=200, queue_ms=400)
    a.decide(room=100, rescheduled=0, pending=50, now=0.0)  # everything taken: nothing waits
    assert a.waiting_since is None
    a.arrived(3600.0)
    a.resumed(3600.1)
    assert a.catchup_until == pytest.approx(3600.1 + CATCHUP_MIN_PACES * 0.2)
    a.decide(room=100, rescheduled=0, pending=150, now=3600.2)  # 50 left: they wait from now
    assert a.waiting_since == 3600.2


def test_no_refusals_to_suspend_when_off_or_unbounded() -> None:
    for a in (Admission(100, epoch_ms=0, queue_ms=400), Admission(100, epoch_ms=200, queue_ms=0)):
        a.arrived(0.0)
        a.resumed(10.0)
        assert not a.catching_up
        assert a.decide(room=100, rescheduled=0, pending=1000, now=10.0).refuse == 0


def test_the_epochs_taken_before_a_stall_are_forgotten() -> None:
    """A new generation reuses the epoch numbers a recovery ended: their (replayed) close must not be
    measured from the take of the old generation's epoch."""
    a = Admission(1000, epoch_ms=100, queue_ms=200)
    a.taken(7, now=0.0, batch=1000)
    a.resumed(30.0)
    a.finished(7, now=30.01)  # epoch 7 of the new generation, replayed
    assert (a.size, a.took_ms) == (1000, 0.0)


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


def _gate(
    log: MemoryLog, replies: ReplyOut | None = None
) -> tuple[MemoryIngress, _Clock, BatchFormer, AdmissionGate]:
    """An ingress over ``log`` and the gate of a worker that takes batches of 4 and keeps 8 buffered
    (epochs of 100 ms, 200 ms queued)."""
    ingress = MemoryIngress(log, INGRESS)
    ingress.assign([0, 1])
    clock = _Clock()
    batch = BatchFormer("w1", 4, replies or ReplyOut(Outbox(), 100, _never), _never)
    return ingress, clock, batch, AdmissionGate(Admission(4, epoch_ms=100, queue_ms=200), clock, batch)


def test_the_gate_catches_up_from_the_first_batch_of_each_generation() -> None:
    log = _log(*((i % 2, f"r{i}") for i in range(40)))
    ingress, clock, _, gate = _gate(log)
    gate.arrived()
    taken = gate.take(Take(1, 3, 4, 1), ingress)  # generation 3's first batch: 36 more wait
    assert (len(taken.records), taken.admitted) == (4, 4)
    clock.t = 0.1
    gate.closed(1)
    taken = gate.take(Take(2, 3, 4, 1), ingress)
    assert (len(taken.records), taken.admitted) == (4, 4), "still catching up"
    clock.t = 0.2 + CATCHUP_MIN_PACES * 0.1
    taken = gate.take(Take(3, 3, 4, 1), ingress)
    assert (len(taken.records), taken.admitted) == (4 + 20, 4), "past the bound: the rest over 8 refused"
    assert ingress.pending() == 8
    clock.t += 0.1
    assert gate.take(Take(1, 4, 4, 1), ingress).admitted == 4, "a new generation catches up again"
    assert ingress.pending() == 4


def _running(epochs: int = 5) -> Admission:
    """A policy that ran ``epochs`` full 100 ms epochs back to back (batches of 100, 200 ms buffered),
    the last ending at 0.1 * ``epochs``."""
    a = Admission(100, epoch_ms=100, queue_ms=200)
    for e in range(epochs):
        a.taken(e, now=e * 0.1, batch=100)
        a.finished(e, now=(e + 1) * 0.1)
    assert (a.size, a.catching_up) == (100, False) and a.took_ms == pytest.approx(100)
    return a


def test_an_epoch_that_ran_through_a_stall_starts_a_catch_up_and_is_not_measured() -> None:
    a = _running()
    a.taken(5, now=0.5, batch=100)
    a.arrived(0.5)
    end = 0.5 + STALL_PACES * 0.1 + 3.0  # a broker that read its log back from S3
    a.finished(5, now=end)
    assert a.size == 100 and a.took_ms == pytest.approx(100), "the stall says nothing of the batch or pace"
    assert a.catching_up and a.catchup_until == pytest.approx(end + CATCHUP_FACTOR * (end - 0.5))
    assert a.decide(room=100, rescheduled=0, pending=1000, now=end).refuse == 0, "its backlog is admitted"


def test_no_epoch_end_for_many_paces_is_a_stall_and_the_epochs_in_it_are_not_measured() -> None:
    a = _running()
    a.taken(5, now=0.5, batch=100)  # it hangs, and the next one is taken meanwhile
    a.decide(room=100, rescheduled=0, pending=150, now=0.5)  # 50 wait from 0.5
    late = 0.5 + STALL_PACES * 0.1
    assert not a.stalled(late - 0.01) and a.stalled(late)
    a.catch_up(late)
    assert a.decide(room=100, rescheduled=0, pending=1000, now=late).refuse == 0
    a.taken(6, now=late, batch=100)
    a.finished(5, now=late + 0.05)  # taken before the stall ended: not measured
    a.finished(6, now=late + 0.09)  # 90 ms: measured
    assert a.took_ms == pytest.approx(95) and a.size == 100, "only epoch 6 was measured"
    assert not a.stalled(late + 0.09 + STALL_PACES * 0.1), "catching up"


def test_an_idle_worker_is_not_stalled() -> None:
    a = _running()  # the last epoch ended at 0.5; nothing ran or waited since
    assert not a.stalled(100.0)
    a.arrived(100.0)  # records came after an hour: they waited no time
    assert not a.stalled(100.0)
    assert not Admission(100, epoch_ms=100, queue_ms=0).stalled(100.0), "nothing refused: no catch-up"


def test_the_gate_catches_up_after_a_stall_within_a_generation() -> None:
    log = _log(*((0, f"r{i}") for i in range(4)))
    ingress, clock, _, gate = _gate(log)
    gate.arrived()
    gate.take(Take(1, 3, 4, 1), ingress)  # the generation's first batch: a catch-up of 4 paces
    clock.t = 0.1
    gate.closed(1)
    clock.t = 0.5
    gate.take(Take(2, 3, 4, 1), ingress)  # past the catch-up; epoch 2 hangs, and 40 arrive
    assert not gate.policy.catching_up
    for i in range(40):
        log.append(INGRESS, i % 2, _request(f"s{i}"))
    gate.arrived()
    clock.t = 0.1 + STALL_PACES * 0.1  # no epoch ended since 0.1
    taken = gate.take(Take(3, 3, 4, 1), ingress)
    assert (len(taken.records), taken.admitted) == (4, 4), "a stall: nothing refused (the cap is 8)"
    assert gate.policy.catching_up and ingress.pending() == 36


@pytest.mark.parametrize("written_over_ms", [0, 3900])
def test_records_the_broker_delivered_late_are_a_stall_a_burst_sent_at_once_is_not(
    written_over_ms: int,
) -> None:
    """40 records come at once into a buffer the last batch had emptied: written over 3.9 s (held by
    the broker), they are a stall's backlog and admitted; written at once (a burst), the cap holds."""
    log = _log((0, "r0"))
    ingress, clock, _, gate = _gate(log)
    gate.gen = 1  # past a generation's first batch
    gate.arrived()
    gate.take(Take(1, 1, 4, 1), ingress)  # took everything: kept up
    clock.t = 0.1
    gate.closed(1)
    for i in range(40):
        log.append(INGRESS, i % 2, _request(f"s{i}", ts_ms=1000 + written_over_ms * i // 39))
    gate.arrived()
    clock.t = 0.2
    taken = gate.take(Take(2, 1, 4, 1), ingress)
    refused = len(taken.records) - taken.admitted
    assert taken.admitted == 4 and refused == (0 if written_over_ms else 40 - 4 - 8), refused
    assert gate.policy.catching_up == bool(written_over_ms)


def test_the_gate_counts_new_requests_only_resent_copies_ride_along() -> None:
    """A buffer full of copies of answered and running requests: the batch takes records until it holds
    its size of new ones, and the copies do not count against the backlog cap."""
    copies = [(0, "done") for _ in range(20)] + [(0, "old") for _ in range(5)]
    log = _log(
        *copies[:10], *((0, f"n{i}") for i in range(6)), *copies[10:], *((0, f"m{i}") for i in range(6))
    )
    replies = ReplyOut(Outbox(), 100, _never)
    replies.answered.record(0, Reply("done", 7, 0, 0, "committed", msgspec.Raw(encode_value(1)), None, None))
    ingress, _, batch, gate = _gate(log, replies)
    batch.rescheduled = [RootTxn(9, IngressRecord(1, 0, _request("old"), 0))]  # waits for its epoch
    gate.gen = 1
    taken = gate.take(Take(1, 1, 4, 1), ingress)  # 37 records, 12 new: 4 run, 8 stay, none refused
    assert taken.admitted == 4 and taken.depth_max == 1, "a request 1 deep runs 2 epochs later: 200 ms"
    assert [r.request.request_id for r in taken.records] == ["done"] * 10 + ["n0", "n1", "n2", "n3"]
    (roots, resends, _), entry = batch.form(1, 1, 1, taken.records, admitted=taken.admitted)
    assert [r.request.request_id for r in roots] == ["n0", "n1", "n2", "n3"]
    assert not any(isinstance(e, Refused) for e in entry.entries) and len(resends) == 10
    assert ingress.pending() == 23
    taken = gate.take(Take(2, 1, 4, 1), ingress)
    assert (taken.admitted, len(taken.records), ingress.pending()) == (4, 2 + 15 + 2, 4), "m2..m5 wait"
    (roots, _, _), entry = batch.form(2, 1, 1, taken.records, admitted=taken.admitted)
    assert [r.request.request_id for r in roots] == ["n4", "n5", "m0", "m1"]
    assert not any(isinstance(e, Refused) for e in entry.entries)


def test_past_the_cap_in_new_requests_the_new_ones_beyond_are_refused_not_the_copies() -> None:
    log = _log(*((0, f"n{i}") for i in range(20)), *((0, "done") for _ in range(10)))
    replies = ReplyOut(Outbox(), 100, _never)
    replies.answered.record(0, Reply("done", 7, 0, 0, "committed", msgspec.Raw(encode_value(1)), None, None))
    ingress, _, batch, gate = _gate(log, replies)
    gate.gen = 1
    taken = gate.take(Take(1, 1, 4, 1), ingress)  # 30 records, 20 new: 4 run, 8 stay, 8 refused
    assert (taken.admitted, len(taken.records)) == (4, 12)
    (roots, _, _), entry = batch.form(1, 1, 1, taken.records, admitted=taken.admitted)
    assert len(roots) == 4 and [e.request_id for e in entry.entries if isinstance(e, Refused)] == [
        f"n{i}" for i in range(4, 12)
    ]
    assert ingress.pending() == 8 + 10


# ---- the batch: Refused entries, replies, replay (pure) ---------------------------------------------

INGRESS = "in"


def _request(rid: str, ts_ms: int = 5, key: str = "k") -> Request:
    return Request(rid, "acct", "deposit", key, msgspec.Raw(encode_value([1])), ts_ms)


def _never(*what: object) -> None:
    raise AssertionError(f"diverged: {what}")


class _Former:
    def __init__(self, log: MemoryLog) -> None:
        self.ingress = MemoryIngress(log, INGRESS)
        self.ingress.assign([0, 1])
        self.replies = ReplyOut(Outbox(), 100, _never)
        self.batch = BatchFormer("w1", 100, self.replies, _never)


def _log(*rids: tuple[int, str]) -> MemoryLog:
    log = MemoryLog()
    log.create(INGRESS, 2)
    for partition, rid in rids:
        log.append(INGRESS, partition, _request(rid))
    return log


def _refusals(resends: list[Resend]) -> dict[str, Reply]:
    return {r.request_id: r for _, r, _ in resends if r.status == ReplyStatus.REFUSED}


async def test_refused_requests_are_logged_answered_once_and_replayed_identically() -> None:
    log = _log((0, "a"), (1, "b"), (0, "c"), (1, "d"), (0, "c"))
    live = _Former(log)
    records = live.ingress.take(10)
    (roots, resends, copies), entry = live.batch.form(3, 0, 1, records, admitted=2)
    assert [r.request.request_id for r in roots] == ["a", "b"]
    refused = [e for e in entry.entries if isinstance(e, Refused)]
    assert [(e.partition, e.request_id) for e in refused] == [(0, "c"), (1, "d")]
    assert [type(e).__name__ for e in entry.entries] == ["Run", "Run", "Refused", "Refused", "Answered"]
    assert entry.lc_end - entry.lc_start == 2, "a refused request takes no tid"
    replies = _refusals(resends)
    assert sorted(replies) == ["c", "d"] and not copies
    assert [r.request_id for _, r, _ in resends] == ["c", "d", "c"], "the copy of c gets c's reply"
    c = replies["c"]
    assert (c.status, c.error_type, c.tid, c.epoch, c.request_ts_ms) == ("refused", "Overloaded", 0, 3, 5)
    assert c == refusal(3, _request("c"), Refusal.BACKLOG), "the epoch, the request and the reason alone"
    assert live.replies.answered.get(0, "c") == c, "recorded: a resent copy is answered the same"
    with pytest.raises(Overloaded) as raised:
        result_of(c)
    assert raised.value.reply == c

    # A later resend of c (another epoch) is answered from the table, with the same reply.
    log.append(INGRESS, 0, _request("c"))
    (later, again, _), entry2 = live.batch.form(4, 0, 1, live.ingress.take(10))
    assert not later and [r for _, r, _ in again] == [c]
    assert [type(e).__name__ for e in entry2.entries] == ["Answered"]

    # The batch re-formed from its log entry: the same roots, the same refusals, identical replies.
    replay = _Former(log)
    replay.batch.replay = {3: entry}
    fetched = [await replay.ingress.take_exact(p, o) for p, o in replay.batch.to_fetch(3)]
    roots2, resends2, _ = replay.batch.replayed(3, fetched)
    assert [(r.tid, r.request.request_id) for r in roots2] == [(r.tid, r.request.request_id) for r in roots]
    assert [r for _, r, _ in resends2] == [r for _, r, _ in resends]
    assert replay.replies.answered.get(1, "d") == replies["d"]


def test_a_resend_of_an_admitted_request_is_not_refused() -> None:
    """Beyond the admitted count only new requests are refused: a resend is answered as always."""
    live = _Former(_log((0, "a"), (0, "a")))
    done = Reply("z", 7, 0, 0, "committed", msgspec.Raw(encode_value(1)), None, None)
    live.replies.answered.record(1, done)
    records = [*live.ingress.take(10), IngressRecord(1, 0, _request("z"), 0)]
    (roots, resends, copies), entry = live.batch.form(0, 0, 1, records, admitted=1)
    assert [r.request.request_id for r in roots] == ["a"]
    assert [rec.request.request_id for rec in copies] == ["a"], "a copy of a running request waits"
    assert [r for _, r, _ in resends] == [done]
    assert not any(isinstance(e, Refused) for e in entry.entries)
    assert isinstance(entry.entries[0], Run)


def test_a_new_request_behind_a_hot_root_entity_is_refused_the_others_admitted() -> None:
    """Refused: a new call of the function whose rescheduled calls queue past the bound behind its
    root entity; admitted: those of other entities, and another function of the hot one (it does not
    collide the same way: TPC-C's Payments beside a district's queued NewOrders)."""
    live = _Former(_log((0, "h1"), (0, "c1"), (1, "h2"), (1, "c2")))
    other = Request("h3", "acct", "balance", "hot", msgspec.Raw(encode_value([])), 5)
    hot = [RootTxn(t, IngressRecord(0, 100 + t, _request(f"old{t}", key="hot"), 0)) for t in (1, 2, 3, 4)]
    live.batch.rescheduled = [*hot, RootTxn(5, IngressRecord(1, 105, _request("cool", key="c"), 0))]
    live.batch.room()  # old1 and cool run; old2..old4 wait behind "hot": 3 deep
    records = [
        IngressRecord(0, 0, _request("h1", key="hot"), 0),
        IngressRecord(0, 1, _request("c1", key="c"), 0),
        IngressRecord(1, 0, _request("h2", key="hot"), 0),
        IngressRecord(1, 1, _request("c2", key="other"), 0),
        IngressRecord(1, 2, other, 0),
    ]
    (roots, resends, _), entry = live.batch.form(0, 0, 1, records, depth_max=2)
    assert [r.request.request_id for r in roots] == ["old1", "cool", "c1", "c2", "h3"]
    assert [e.request_id for e in entry.entries if isinstance(e, Refused)] == ["h1", "h2"]
    assert sorted(_refusals(resends)) == ["h1", "h2"]

    again = _Former(_log())
    again.batch.rescheduled = list(hot)
    again.batch.room()
    (roots, _, _), entry = again.batch.form(0, 0, 1, records, depth_max=3)
    assert [r.request.request_id for r in roots] == ["old1", "h1", "c1", "c2", "h3"], "h1 joins 3 deep"
    assert [e.request_id for e in entry.entries if isinstance(e, Refused)] == ["h2"], "4 deep behind h1"

    cold = _Former(_log())  # no queue behind "c": calls of this batch there are admitted, however many
    calls = [IngressRecord(0, i, _request(f"c{i}", key="c"), 0) for i in range(5)]
    (roots, _, _), entry = cold.batch.form(0, 0, 1, calls, depth_max=0)
    assert len(roots) == 5 and not any(isinstance(e, Refused) for e in entry.entries)


def test_a_queue_that_was_hot_lately_bounds_a_batch_of_calls_into_it_until_it_cools() -> None:
    """A queue with none waiting now that had rescheduled transactions waiting in the last
    ``HOT_BATCHES`` live batches counts its batch-mates as a queue that exists (a slow epoch's batch
    of a district's NewOrders): they join behind its head (the rescheduled one that runs, or else
    the batch's first call there), so with the bound 0 one more is admitted, the others refused.
    One whose rescheduled calls never waited behind one of their own (a Payment rescheduled now and
    then, behind a NewOrder of its district), or with none in that time, admits them all."""
    live = _Former(_log())
    old = [RootTxn(t, IngressRecord(0, 100 + t, _request(f"old{t}", key="hot"), 0)) for t in (1, 2)]
    live.batch.rescheduled = list(old)
    live.batch.room()  # old1 runs, old2 waits behind it: a queue
    live.batch.form(0, 0, 1, [], depth_max=0)
    live.batch.rescheduled = [old[1]]
    calls = [IngressRecord(0, i, _request(f"h{i}", key="hot"), 0) for i in range(5)]
    cool = [IngressRecord(1, i, _request(f"c{i}", key="c"), 0) for i in range(3)]
    live.batch.room()  # old2 runs, none waits
    (roots, resends, _), entry = live.batch.form(1, 0, 1, calls + cool, depth_max=0)
    assert [r.request.request_id for r in roots] == ["old2", "h0", "c0", "c1", "c2"], "h0 runs after old2"
    assert sorted(_refusals(resends)) == ["h1", "h2", "h3", "h4"]
    assert {e.reason for e in entry.entries if isinstance(e, Refused)} == {Refusal.ENTITY}

    for epoch in range(2, HOT_BATCHES - 1):
        live.batch.room()
        live.batch.form(epoch, 0, 1, [], depth_max=0)
    again = [IngressRecord(0, 10 + i, _request(f"a{i}", key="hot"), 0) for i in range(3)]
    live.batch.room()  # the last of the HOT_BATCHES batches since some waited; none rescheduled now
    (roots, _, _), _ = live.batch.form(HOT_BATCHES - 1, 0, 1, again, depth_max=0)
    assert [r.request.request_id for r in roots] == ["a0", "a1"], "a0 runs first, a2 would be 1 deep"
    later = [IngressRecord(0, 20 + i, _request(f"b{i}", key="hot"), 0) for i in range(3)]
    live.batch.room()
    (roots, _, _), entry = live.batch.form(HOT_BATCHES, 0, 1, later, depth_max=0)
    assert len(roots) == 3 and not any(isinstance(e, Refused) for e in entry.entries), "cooled down"

    once = _Former(_log())  # rescheduled now and then, never one waiting: not a queue
    once.batch.rescheduled = [RootTxn(1, IngressRecord(0, 100, _request("p", key="pay"), 0))]
    once.batch.room()
    pays = [IngressRecord(0, i, _request(f"p{i}", key="pay"), 0) for i in range(3)]
    (roots, _, _), entry = once.batch.form(0, 0, 1, pays, depth_max=0)
    assert len(roots) == 4 and not any(isinstance(e, Refused) for e in entry.entries)
    behind = _Former(_log())  # a call waiting behind another function's head of its root entity
    other = Request("n1", "acct", "balance", "pay", msgspec.Raw(encode_value([])), 5)
    behind.batch.rescheduled = [
        RootTxn(1, IngressRecord(0, 100, other, 0)),
        RootTxn(2, IngressRecord(0, 101, _request("p", key="pay"), 0)),
    ]
    behind.batch.room()
    behind.batch.form(0, 0, 1, [], depth_max=0)
    behind.batch.rescheduled = []
    behind.batch.room()
    (roots, _, _), entry = behind.batch.form(1, 0, 1, pays, depth_max=0)
    assert len(roots) == 3 and not any(isinstance(e, Refused) for e in entry.entries)


def test_the_depth_bound_is_the_queue_bound_in_epochs_and_off_while_catching_up() -> None:
    a = Admission(100, epoch_ms=100, queue_ms=200)
    assert a.depth_max == 1, "nothing measured yet: epochs of epoch_ms; 1 deep runs 2 epochs later"
    a.took_ms = 150.0
    assert a.depth_max == 0, "one epoch of 150 ms fits in 200 ms: a request joins only an empty queue"
    a.took_ms = 250.0
    assert a.depth_max == 0, "never below 0 (-1 is no bound)"
    a.took_ms = 10.0
    assert a.depth_max == 19, "short epochs (a light load): 19 deep runs 20 epochs (200 ms) later"
    a.resumed(10.0)
    assert a.depth_max == -1, "a stall's backlog is worked through"
    assert Admission(100, epoch_ms=100, queue_ms=0).depth_max == -1
    assert Admission(100, epoch_ms=0, queue_ms=200).depth_max == -1


# ---- the simulation: overload with crashes ---------------------------------------------------------


async def _flood(seed: int, crashes: int) -> SimCluster:
    """Bursts far past a bound of 5 per epoch and 5 buffered, through the real clients, with crashes."""
    rng = random.Random(seed)
    async with SimCluster(
        APP,
        workers=2,
        seed=seed,
        epoch_size_max=5,
        admission_epoch_ms=1000,
        admission_queue_ms=1000,
        snapshot_interval_epochs=2,
        epoch_timeout_ms=300,
        seqlog_ack_lag=(seed % 3) * 10,
    ) as c:
        for i in range(10):
            c.submit("acct", "deposit", f"k{i}", 100)
        await c.wait()
        base = c.network.delivered
        for _ in range(crashes):
            node = rng.choice(["w1", "w2"])
            c.network.faults.at(base + rng.randint(20, 600), lambda node=node: c.crash(node))
        for _ in range(3):
            submit_random_mix(c, rng, 80, n_keys=20, hot=0.3)
            for rid in rng.sample(sorted(c.requests), 10):
                c.resubmit(rid)  # resends of admitted, refused and running requests
            await c.wait(timeout_s=120)
        await check_against_serial(c)
        return c


@pytest.mark.parametrize("seed", range(4))
async def test_overload_answers_every_request_once_admitted_ones_serially(seed: int) -> None:
    c = await _flood(seed, crashes=1 + seed % 2)
    statuses = [r.status for r in c.sent.unique_replies()]
    refused, admitted = statuses.count(ReplyStatus.REFUSED), len(statuses) - statuses.count("refused")
    assert refused > 20 and admitted > 20, (refused, admitted)
    assert c.crashes >= 1, "no crash fired: replay of refusals was not exercised"
    totals = c.coordinator.status()["totals"]
    assert totals["refused"] > 0


async def _burst(seed: int, stall: bool) -> list[str]:
    """40 deposits at once into a cluster that admits 5 per epoch and keeps 5 buffered per worker,
    after it ran a while; with ``stall``, while a worker restarts (a recovery): the statuses."""
    async with SimCluster(
        APP, workers=2, seed=seed, epoch_size_max=5, admission_epoch_ms=100, admission_queue_ms=100
    ) as c:
        for round_ in range(10):
            for i in range(4):
                c.submit("acct", "deposit", f"k{i}", round_)
            await c.wait()
        await asyncio.sleep(1.0)  # virtual time: past the catch-up of the first generation
        before = len(c.sent.unique_replies())
        if stall:
            c.crash("w1")  # restarted: w2 runs on, both start a new generation
        for i in range(40):
            c.submit("acct", "deposit", f"k{i % 8}", 1)
        await c.wait(timeout_s=120)
        await check_against_serial(c)
        return [r.status for r in c.sent.unique_replies()[before:]]


@pytest.mark.parametrize("seed", range(3))
async def test_the_backlog_of_a_recovery_is_admitted_the_same_burst_without_one_is_capped(seed: int) -> None:
    stalled = await _burst(seed, stall=True)
    assert len(stalled) == 40 and stalled.count(ReplyStatus.REFUSED) == 0, stalled
    running = await _burst(seed, stall=False)
    assert len(running) == 40 and running.count(ReplyStatus.REFUSED) > 0, running


# ---- what a refusal looks like to a caller ---------------------------------------------------------


def test_the_gateway_answers_a_refused_reply_429_with_retry_after() -> None:
    outcome = reply_outcome(refusal(7, _request("r")), None, retry_after_s=3)
    assert (outcome.status, outcome.code) == (429, "overloaded")
    assert ("Retry-After", "3") in outcome.headers
    body = msgspec.json.decode(outcome.body)["error"]
    assert body["reply"]["status"] == "refused" and body["reply"]["error_type"] == "Overloaded"


@pytest.mark.services
def test_a_slowed_cluster_refuses_what_it_cannot_admit_and_answers_everything(
    local_cluster: ClusterFactory,
) -> None:
    """Every call burns 4 ms of a worker's CPU (2 workers: < 500/s) and 1000/s are offered for 3 s,
    through the SDK: the requests past the bound are refused, every one is answered once (committed
    or refused), the coordinator counted exactly the refusals the client saw, and the client's
    window then refused some itself, nothing sent."""

    async def go(stack: LocalStack) -> tuple[RunResult, dict[str, Any]]:
        async with await StyxClient.connect(stack.coordinator, timeout_s=120) as client:
            result = await run_open_loop(
                SlowWork(), SdkSender(client, 120), rate=1000, duration_s=3, warmup_s=0, progress=None
            )
        status = await admin(stack.coordinator, StatusRequest(), 10.0, stack.secret)
        return result, status

    settings = {"epoch_size_max": "40", "failure_timeout_ms": "5000"}
    result, status = asyncio.run(go(local_cluster(app=SlowWork.app, settings=settings)))
    committed, refused = result.statuses["committed"], result.statuses["refused"]
    assert result.answered == 3000 and result.unanswered == 0 and result.statuses["error"] == 0
    assert committed > 0 and refused > 0 and committed + refused == 3000, result.statuses
    # Refused by the cluster (a reply) or, once refusals came, by the client's window (nothing sent).
    by_cluster, by_client = (
        result.causes["refused: Overloaded"],
        result.causes["refused: Overloaded (client)"],
    )
    assert by_cluster > 0 and by_client > 0 and by_cluster + by_client == refused, result.causes
    assert status["totals"]["refused"] == by_cluster, "a refusal counted twice, or one the client missed"
    assert status["totals"]["committed"] == committed
    assert result.refused_hist.get_total_count() == refused
    assert result.hist.get_total_count() == committed, "latencies are those of the admitted requests"


def test_an_epoch_that_refused_more_than_it_ran_does_not_shrink_the_batch() -> None:
    a = Admission(1000, epoch_ms=100, queue_ms=200)
    a.taken(1, now=0.0, batch=1000, refused=3000)
    a.finished(1, now=0.4)  # slow, but the refusals took the time
    assert a.size == 1000
    assert a.backlog_max == math.ceil(1000 * 200 / 400), "the backlog follows the pace epochs ran"


def test_the_client_window_narrows_on_refusals_once_per_window_and_widens_on_replies() -> None:
    w = InFlightWindow(10_000)
    w.refused(seq=5, in_flight=1000, registered=1200)
    assert w.limit == 700
    w.refused(seq=1100, in_flight=900, registered=1300)  # sent under the old window: no change
    assert w.limit == 700
    w.refused(seq=1250, in_flight=10, registered=1400)
    assert w.limit == MIN_WINDOW, "never below MIN_WINDOW"
    for _ in range(100):
        w.admitted()
    assert w.limit == pytest.approx(MIN_WINDOW + 100 * ALPHA)
