"""The gateway's window of recent invocations (pages, filters, bounds) and its history of the cluster's
rates and epoch latency, without a cluster."""

from __future__ import annotations

from typing import Any

import msgspec

from styx_client.gateway.history import ClusterHistory
from styx_client.gateway.outcomes import failure, reply_outcome
from styx_client.gateway.recent import ENTRY_OVERHEAD_BYTES, RecentInvocations
from styx_py.core.wire import Phase, Reply, encode_value


def _reply(rid: str, status: str, value: Any = None, epoch: int = 1) -> Reply:
    error = None if status == "committed" else "no"
    return Reply(rid, 7, epoch, Phase.OPTIMISTIC, status, msgspec.Raw(encode_value(value)), error, None)  # type: ignore[arg-type]


def _fill(window: RecentInvocations, n: int) -> None:
    for i in range(n):
        entry = window.started(f"r{i}", "account" if i % 2 else "order", f"k{i}", "f", [i])
        reply = _reply(f"r{i}", "aborted" if i % 3 == 0 else "committed", i)
        window.finished(entry, reply_outcome(reply), reply, 1.0)


def test_pages_are_newest_first_and_cover_the_window_once() -> None:
    window = RecentInvocations(100, 1 << 20, clock=lambda: 1000.0)
    _fill(window, 23)
    seen: list[str] = []
    after = None
    while True:
        page, after = window.page(status=None, operator=None, limit=5, after=after)
        seen += [e.request_id for e in page]
        if after is None:
            break
    assert seen == [f"r{i}" for i in reversed(range(23))]
    # New entries do not move a cursor: the next page still starts where the last one ended.
    _, cursor = window.page(status=None, operator=None, limit=5, after=None)
    _fill(window, 2)  # r0 and r1 again: the newest entry of an id is the one a view shows
    more, _ = window.page(status=None, operator=None, limit=5, after=cursor)
    assert [e.request_id for e in more] == ["r17", "r16", "r15", "r14", "r13"]
    assert window.get("r1") is not None and window.get("r1").seq == 25  # type: ignore[union-attr]


def test_filters_by_status_and_operator() -> None:
    window = RecentInvocations(100, 1 << 20)
    _fill(window, 12)
    pending = window.started("p", "account", "k", "f", [])
    aborted, _ = window.page(status="aborted", operator=None, limit=50, after=None)
    assert [e.request_id for e in aborted] == ["r9", "r6", "r3", "r0"]
    accounts, _ = window.page(status="committed", operator="account", limit=50, after=None)
    assert [e.request_id for e in accounts] == ["r11", "r7", "r5", "r1"]
    assert [e.request_id for e in window.page(status="pending", operator=None, limit=5, after=None)[0]] == [
        "p"
    ]
    window.finished(pending, failure(504, "timeout", "no reply"), None, 3.0)
    [timed_out] = window.page(status="error", operator=None, limit=5, after=None)[0]
    view = timed_out.view()
    assert (view["status"], view["http_status"], view["code"], view["tid"]) == ("error", 504, "timeout", None)


def test_the_window_is_bounded_by_entries_and_bytes() -> None:
    window = RecentInvocations(10, 1 << 20)
    _fill(window, 25)
    assert len(window) == 10 and window.get("r14") is None and window.get("r15") is not None
    small = RecentInvocations(1000, 4 * ENTRY_OVERHEAD_BYTES + 4000)
    for i in range(20):
        small.started(f"big{i}", "account", "k", "f", ["x" * 1000])
    assert small.bytes <= small.max_bytes and len(small) == 3
    assert [e.request_id for e in small.page(status=None, operator=None, limit=9, after=None)[0]] == [
        "big19",
        "big18",
        "big17",
    ]


def test_history_takes_rates_and_epoch_latency_from_differences() -> None:
    now = [100.0]
    history = ClusterHistory(step_s=2.0, max_samples=3, clock=lambda: now[0])

    def poll(epoch: int, committed: int, aborted: int, timed: int, total_s: float) -> None:
        totals = {"committed": committed, "aborted": aborted}
        status = {"epoch": epoch, "totals": totals, "epoch_seconds": {"count": timed, "sum": total_s}}
        history.record({**status, "workers": [{}, {}], "state": "running"})

    poll(10, 100, 5, 10, 0.1)  # the first reading: nothing to difference
    now[0] += 1.0
    poll(11, 150, 5, 11, 0.2)  # within the step: skipped
    now[0] += 1.0
    poll(30, 500, 25, 30, 0.48)  # 2 s later: 20 epochs, 400 committed, 20 aborted, 20 timed in 0.38 s
    [sample] = history.as_list()
    assert sample["epochs_per_s"] == 10.0 and sample["committed_per_s"] == 200.0
    assert sample["aborted_per_s"] == 10.0 and sample["epoch_ms"] == 19.0 and sample["workers"] == 2
    now[0] += 2.0
    poll(30, 500, 25, 30, 0.48)  # idle: no epoch, no latency
    assert history.as_list()[-1]["epochs_per_s"] == 0.0 and history.as_list()[-1]["epoch_ms"] is None
    now[0] += 2.0
    poll(2, 3, 0, 2, 0.01)  # a restarted coordinator: no negative rates
    for _ in range(5):
        now[0] += 2.0
        poll(2, 3, 0, 2, 0.01)
    assert len(history.as_list()) == 3 and all(s["committed_per_s"] >= 0 for s in history.as_list())
