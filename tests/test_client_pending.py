"""The client's core on its own: no broker and no event loop. Events go in (a request, a reply, the
broker's verdict, a look at the segments, time passing) and what comes out is asserted: waiters told,
records to write again, what to push."""

from __future__ import annotations

import pytest

from styx_client.sdk.core import ClientCore
from styx_client.sdk.pending import PendingTable
from styx_client.sdk.requests import encode_request, same_request
from styx_client.sdk.stats import ClientStats
from styx_client.sdk.waiters import Waiter
from styx_py.core.errors import BadRequest, RequestTimeout, StyxError
from styx_py.core.limits import DEADLINE_SWEEP_S
from styx_py.core.requests import encode_request as checked_request
from styx_py.core.segments import FRESH_S
from styx_py.core.wire import NIL, Reply, encode_value

Told = list[tuple[float, Reply | None, StyxError | None]]


def _reply(rid: str) -> Reply:
    return Reply(rid, 1, 1, 0, "committed", NIL, None, None, 0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0


def _listen(
    core: ClientCore, clock: Clock, rid: str, wait_s: float, told: Told, args: tuple[object, ...] = ()
) -> tuple[Waiter, bool]:
    """What StyxClient.submit_future does after its local checks; whether the record is to be produced."""
    record = encode_request(rid, "acct", "fn", "k", args)
    entry, new = core.admit(rid, record, 0)
    waiter = core.wait(
        entry, lambda r, e: told.append((clock.now, r, e)), wait_s, ("acct", "fn", "k", rid), clock.now
    )
    return waiter, new


def _run_until(core: ClientCore, clock: Clock, until: float) -> None:
    """Wake the core whenever it asks to be woken, as the shell's sweep does, until ``until``."""
    while core.wake_at <= until:
        clock.now = core.wake_at
        core.tick(clock.now)
    clock.now = until


def test_every_request_times_out_on_time_and_is_told_once() -> None:
    core, clock = ClientCore(10_000, "egress", rest=False, push_requests=False), Clock()
    start = clock.now
    told: dict[str, Told] = {}
    for i in range(1000):
        rid = f"r{i}"
        told[rid] = []
        _listen(core, clock, rid, (1.0, 2.5, 0.5)[i % 3], told[rid])
    assert core.wake_at == start + 0.5  # one wake-up for all: the earliest deadline
    _run_until(core, clock, start + 0.25)
    for i in range(0, 1000, 2):
        core.pushed(_reply(f"r{i}"))
    _run_until(core, clock, start + 3.0)
    assert len(core.table) == 0 and core.stats.replied == 500 and core.stats.timeouts == 500
    for rid, outcomes in told.items():
        [(at, reply, error)] = outcomes  # exactly once
        i = int(rid[1:])
        if i % 2 == 0:
            assert reply is not None and reply.request_id == rid and error is None
            continue
        wait_s = (1.0, 2.5, 0.5)[i % 3]
        assert isinstance(error, RequestTimeout) and f"request {rid} within {wait_s} s" in str(error)
        late = at - (start + wait_s)
        assert 0 <= late <= DEADLINE_SWEEP_S + 1e-9, (rid, late)  # never early, at most one sweep late
    assert core.wake_at == float("inf")
    core.pushed(_reply("r1"))  # a reply after the timeout resolves nothing
    assert core.stats.unmatched_ignored == 1


def test_joined_callers_share_one_reply_and_one_giving_up_keeps_the_other() -> None:
    core, clock = ClientCore(10, "egress", rest=False, push_requests=False), Clock()
    first: Told = []
    second: Told = []
    third: Told = []
    w1, new = _listen(core, clock, "shared", 5.0, first, (1,))
    assert new
    _, new2 = _listen(core, clock, "shared", 9.0, second, (1,))
    w3, new3 = _listen(core, clock, "shared", 9.0, third, (1,))
    assert not new2 and not new3  # joined: nothing more to produce
    core.give_up(w1)
    core.give_up(w1)  # a second give-up (a cancelled future's late callback) changes nothing
    assert len(core.table) == 1
    core.give_up(w3)
    core.from_log(b"shared", encode_value(_reply("shared")), False)
    assert [r.request_id for _, r, _ in second if r] == ["shared"] and first == third == []
    assert len(core.table) == 0
    _run_until(core, clock, clock.now + 10)
    assert core.stats.timeouts == 0 and core.stats.replied == 1


def test_a_failed_send_or_a_stop_fails_every_caller() -> None:
    core, clock = ClientCore(10, "egress", rest=False, push_requests=False), Clock()
    one: Told = []
    two: Told = []
    left: Told = []
    waiter, _ = _listen(core, clock, "a", 5.0, one)
    _listen(core, clock, "a", 5.0, two)
    assert waiter.entry is not None
    core.undelivered(waiter.entry, OSError("no route"), unavailable=True)
    for outcome in (one, two):
        [(_, reply, error)] = outcome
        assert reply is None and error is not None and "could not send request a" in str(error)
        assert isinstance(error.__cause__, OSError)
    _listen(core, clock, "b", 5.0, left)
    core.stop(StyxError("closed"))
    [(_, _, error)] = left
    assert isinstance(error, StyxError) and "closed" in str(error)
    assert len(core.table) == 0
    with pytest.raises(StyxError, match="closed"):
        core.check_open()
    _run_until(core, clock, clock.now + 6)
    assert core.stats.timeouts == 0


def test_a_reused_id_is_compared_without_its_timestamp() -> None:
    sent = encode_request("id", "acct", "fn", "k", (1, "x"))
    assert same_request(sent, encode_request("id", "acct", "fn", "k", (1, "x")))
    # Another timestamp, reply partition and client to push to (another gateway replica resending it).
    later = checked_request("id", "acct", "fn", "k", (1, "x"), 1, 3, "client-other")
    assert sent != later and same_request(sent, later)
    for other in (("k", (1, "y")), ("k2", (1, "x")), ("k", ())):
        assert not same_request(sent, encode_request("id", "acct", "fn", other[0], other[1]))

    core, clock = ClientCore(10, "egress", rest=False, push_requests=False), Clock()
    held, _ = _listen(core, clock, "held", 5.0, [], (1,))
    with pytest.raises(BadRequest, match="'held' is in flight with a different request"):
        _listen(core, clock, "held", 5.0, [], (2,))
    core.give_up(held)
    with pytest.raises(BadRequest, match="'held' was recently sent with a different request"):
        _listen(core, clock, "held", 5.0, [], (2,))
    _listen(core, clock, "held", 5.0, [], (1,))  # the same request again is fine


def test_late_writes_are_written_again_once_their_segment_may_be_unread() -> None:
    core, clock = ClientCore(10, "egress", rest=False, push_requests=True), Clock()
    core.segment_seen(0, clock.now)
    on_time, _ = _listen(core, clock, "on-time", 60.0, [])
    assert on_time.entry is not None
    assert core.acknowledged(on_time.entry, 0, 7, clock.now + 0.1)  # acknowledged: push it
    clock.now += FRESH_S + 0.5  # no look since: the next write may be late
    late, _ = _listen(core, clock, "late", 60.0, [])
    assert late.entry is not None and late.entry.segment == 0
    assert core.acknowledged(late.entry, 0, 8, clock.now)  # its first acknowledgement: push it
    assert not late.entry.on_time and on_time.entry.on_time
    assert core.segment_seen(1, clock.now) == []  # segment 0 is still read by the workers
    again = core.segment_seen(2, clock.now + 1)
    assert [e.rid for e in again] == ["late"] and late.entry.segment == 2
    assert core.stats.rewritten == 1 and core.stats.sent == 2
    # The copy written again is acknowledged on time (a look just found segment 2 the newest): not again.
    assert not core.acknowledged(late.entry, 2, 0, clock.now + 1.2)
    assert late.entry.on_time and core.segment_seen(4, clock.now + 2) == []


def test_the_table_alone_counts_echoes_and_strangers() -> None:
    table = PendingTable(10, ClientStats())
    entry = table.register("r", b"fp", 0, 0)
    told: list[Reply | None] = []
    table.wait(entry, lambda r, e: told.append(r), 1.0, ("a", "f", "k", "r"), 0.0)
    assert table.oldest() == (0, 0)
    assert table.resolve(_reply("r"), 2) and not table.resolve(_reply("r"), 1)
    assert not table.resolve(_reply("other"), 1)
    assert (table.stats.echoes_ignored, table.stats.foreign_ignored) == (1, 1) and len(told) == 1
    assert table.oldest() == (1, 0)


def test_failed_transactions_name_the_users_exception_and_carry_the_reply() -> None:
    from styx_client import TransactionFailed
    from styx_py.core.wire import ReplyStatus

    reply = Reply("rid", 12, 3, 1, ReplyStatus.FAILED, NIL, "InsufficientFunds: only 5 left", "UserError")
    exc = TransactionFailed("failed", reply)
    assert (exc.request_id, exc.tid, exc.epoch, exc.status) == ("rid", 12, 3, "failed")
    assert (exc.error_type, exc.exception_type) == ("UserError", "InsufficientFunds")
    odd = Reply("rid", 12, 3, 1, ReplyStatus.FAILED, NIL, "no type prefix here", "UserError")
    assert TransactionFailed("failed", odd).exception_type is None
    assert TransactionFailed("local").request_id is None


def test_the_newest_epoch_is_that_of_the_newest_reply_handed_to_a_caller() -> None:
    core, clock = ClientCore(100, "egress", rest=False, push_requests=False), Clock()
    told: Told = []
    assert core.table.newest_epoch == -1
    for rid, epoch in (("a", 5), ("b", 9), ("c", 7)):
        _listen(core, clock, rid, 10.0, told)
        assert core.table.resolve(Reply(rid, 1, epoch, 0, "committed", NIL, None, None, 0))
    assert core.table.newest_epoch == 9  # a later reply of an older epoch does not lower it
    assert not core.table.resolve(Reply("stranger", 1, 50, 0, "committed", NIL, None, None, 0))
    assert core.table.newest_epoch == 9  # another client's reply says nothing of this one's writes
    assert len(told) == 3


def test_the_lean_path_sheds_before_it_makes_an_id_or_a_record() -> None:
    """While the window refuses, :class:`Prepared` raises ``Overloaded`` before it takes a request id
    or encodes the arguments (the cheapest refusal: a load generator past the knee sheds thousands a
    second); a bad key is still named first."""
    import types

    from styx_client.sdk.prepared import Prepared
    from styx_client.sdk.requests import Targets
    from styx_py.core.errors import Overloaded

    core = ClientCore(100, "egress", rest=False, push_requests=False)
    core.table.window.limit = 0.0  # the cluster refused: the window is shut
    shell = types.SimpleNamespace(
        core=core, transport=types.SimpleNamespace(wall_ms=lambda: 0), reply_partition=0, loop=None
    )
    ids: list[str] = []

    def new_rid() -> str:
        ids.append(f"r{len(ids)}")
        return ids[-1]

    targets = Targets({"acct": 4}, {"acct": {"pay"}})
    lean = Prepared(lambda: shell, "reply", "acct", "pay", 4, 5.0, new_rid, targets)  # type: ignore[arg-type]
    for args in ((1,), (object(),)):  # an argument that cannot be encoded is not even looked at
        with pytest.raises(Overloaded, match="in-flight window 0"):
            lean.send("k", args, lambda reply, error: None)
    assert core.stats.shed == 2 and ids == [] and core.table.registered == 0
    with pytest.raises(BadRequest):
        lean.send(1.5, (1,), lambda reply, error: None)  # type: ignore[arg-type]
