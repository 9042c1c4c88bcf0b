"""The client's pending table on its own (no broker), on simulated time: replies, joins, cancellations
and timeouts of ``submit_future`` callers, settled directly and timed out by one shared timer."""

from __future__ import annotations

import asyncio

import pytest

from styx_client.sdk import ClientStats
from styx_client.sdk.pending import PendingTable
from styx_client.sdk.requests import encode_request, same_request
from styx_py.core.errors import BadRequest, RequestTimeout, StyxError
from styx_py.core.requests import encode_request as checked_request
from styx_py.core.wire import NIL, Reply

pytestmark = pytest.mark.looptime

SWEEP_S = 0.01  # pending._SWEEP_S: how late a timeout may be reported, at most


def _reply(rid: str) -> Reply:
    return Reply(rid, 1, 1, 0, "committed", NIL, None, None, 0)


def _listen(
    table: PendingTable, rid: str, wait_s: float, args: tuple[object, ...] = ()
) -> asyncio.Future[Reply]:
    """What StyxClient.submit_future does after its local checks (nothing is produced here)."""
    record = encode_request(rid, "acct", "fn", "k", args)
    table.check_reuse(rid, record)
    entry = table.get(rid)
    if entry is None:
        entry = table.add(rid, asyncio.get_running_loop().create_future(), record)
    return table.future(rid, entry, None, wait_s, ("acct", "fn", "k", rid))


async def test_every_request_times_out_on_time_with_one_timer_for_all() -> None:
    loop = asyncio.get_running_loop()
    table = PendingTable(max_pending=10_000, stats=ClientStats())
    start = loop.time()
    failed_at: dict[str, float] = {}
    futures: dict[str, tuple[float, asyncio.Future[Reply]]] = {}
    for i in range(1000):
        wait_s = (1.0, 2.5, 0.5)[i % 3]
        rid = f"r{i}"
        future = _listen(table, rid, wait_s)
        future.add_done_callback(lambda _, rid=rid: failed_at.setdefault(rid, loop.time()))
        futures[rid] = (wait_s, future)
    # No timer per request: the deadlines share one loop timer.
    timers = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
    assert len(timers) == 1

    await asyncio.sleep(0.25)
    for i in range(0, 1000, 2):
        table.resolve(_reply(f"r{i}"))
    await asyncio.sleep(3.0)

    assert len(table) == 0 and table.stats.replied == 500 and table.stats.timeouts == 500
    for rid, (wait_s, future) in futures.items():
        if int(rid[1:]) % 2 == 0:
            assert future.result().request_id == rid
            continue
        with pytest.raises(RequestTimeout, match=f"request {rid} within {wait_s} s"):
            future.result()
        late = failed_at[rid] - (start + wait_s)
        assert 0 <= late <= SWEEP_S + 1e-9, (rid, late)  # never early, at most one sweep late
    # A reply after the timeout resolves nothing.
    table.resolve(_reply("r1"))
    assert table.stats.unmatched_ignored == 1


async def test_joined_callers_share_one_reply_and_cancelling_one_keeps_the_other() -> None:
    table = PendingTable(max_pending=10, stats=ClientStats())
    first = _listen(table, "shared", 5.0, (1,))
    second = _listen(table, "shared", 9.0, (1,))
    third = _listen(table, "shared", 9.0, (1,))
    first.cancel()
    await asyncio.sleep(0)  # the cancellation's callback runs
    assert len(table) == 1
    third.cancel()  # its callback has not run when the reply comes: still counted out exactly once
    table.resolve(_reply("shared"))
    assert second.result().request_id == "shared" and third.cancelled()
    assert len(table) == 0
    await asyncio.sleep(10)
    assert table.stats.timeouts == 0 and table.stats.replied == 1


async def test_a_failed_send_or_close_fails_every_caller() -> None:
    table = PendingTable(max_pending=10, stats=ClientStats())
    one = _listen(table, "a", 5.0)
    two = _listen(table, "a", 5.0)
    entry = table.get("a")
    assert entry is not None
    table.fail(entry, StyxError("not sent"), None)
    for future in (one, two):
        with pytest.raises(StyxError, match="not sent"):
            future.result()
    left = _listen(table, "b", 5.0)
    table.fail_all(StyxError("closed"))
    with pytest.raises(StyxError, match="closed"):
        left.result()
    assert len(table) == 0
    await asyncio.sleep(6)
    assert table.stats.timeouts == 0


async def test_a_reused_id_is_compared_without_its_timestamp() -> None:
    sent = encode_request("id", "acct", "fn", "k", (1, "x"))
    assert same_request(sent, encode_request("id", "acct", "fn", "k", (1, "x")))
    # Another timestamp, reply partition and client to push to (another gateway replica resending it).
    later = checked_request("id", "acct", "fn", "k", (1, "x"), 1, 3, "client-other")
    assert sent != later and same_request(sent, later)
    for other in (("k", (1, "y")), ("k2", (1, "x")), ("k", ())):
        assert not same_request(sent, encode_request("id", "acct", "fn", other[0], other[1]))

    table = PendingTable(max_pending=10, stats=ClientStats())
    held = _listen(table, "held", 5.0, (1,))
    with pytest.raises(BadRequest, match="'held' is in flight with a different request"):
        _listen(table, "held", 5.0, (2,))
    held.cancel()
    await asyncio.sleep(0)
    with pytest.raises(BadRequest, match="'held' was recently sent with a different request"):
        _listen(table, "held", 5.0, (2,))
    _listen(table, "held", 5.0, (1,)).cancel()  # the same request again is fine


def test_a_resend_naming_another_reply_partition_is_the_same_request() -> None:
    first = encode_request("id", "acct", "f", "k", (1,), 0)
    assert same_request(first, encode_request("id", "acct", "f", "k", (1,), 3))
    assert not same_request(first, encode_request("id", "acct", "f", "k", (2,), 0))
    assert not same_request(first, encode_request("id", "acct", "f", 7, (1,), 0))


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
