"""The coordinator's pure parts: the epoch barrier, placement, membership; deploy robustness; and its
timers on the injected clock."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from styx_coordinator.barrier import Stage
from styx_coordinator.membership import Membership
from styx_coordinator.placement import place
from styx_coordinator.server import Coordinator
from styx_coordinator.status import STATUS_RATE_WINDOW_S, Throughput
from styx_py.core.barrier import combine_exec, combine_revotes, combine_votes, highest_lc
from styx_py.core.config import load_config
from styx_py.core.errors import GraphError
from styx_py.core.wire import AdminReply, DeployRequest, EpochDone, ExecDone, Register, Revote, Vote
from styx_py.testing.cluster import virtual_time
from styx_py.testing.memory import MemoryNetwork

# ---- barrier --------------------------------------------------------------------------------------


def test_stage_completes_only_when_every_worker_reported() -> None:
    stage: Stage[Vote] = Stage(4, ["w1", "w2", "w3"])
    assert not stage.complete
    assert stage.add(Vote(4, "w2", [7], [], 0)) is False
    assert stage.add(Vote(3, "w1", [1], [], 0)) is False, "message of an earlier epoch"
    assert stage.add(Vote(5, "w1", [1], [], 0)) is False, "message of a later epoch"
    assert stage.add(Vote(4, "w9", [1], [], 0)) is False, "unknown worker"
    assert stage.add(Vote(4, "w2", [8], [], 0)) is False, "a repeat does not count twice"
    assert stage.add(Vote(4, "w3", [], [], 0)) is False
    assert not stage.complete
    assert stage.add(Vote(4, "w1", [2], [5], 0)) is True
    assert stage.complete
    assert [m.node_id for m in stage.messages()] == ["w1", "w2", "w3"]
    assert stage.got["w2"].conflicts == [8], "the latest message of a worker is kept"
    assert stage.add(Vote(3, "w1", [99], [], 0)) is True
    assert stage.got["w1"].conflicts == [2], "a stale message does not replace a current one"


def test_stage_works_for_epoch_done_and_ignores_other_kinds() -> None:
    votes: Stage[Vote] = Stage(0, ["a", "b"], Vote)
    assert not votes.add(Vote(0, "a", [], [], 0, 3, 0))
    assert not votes.add(Revote(0, "b", [], 0))  # another stage's message
    assert votes.add(Vote(0, "b", [5], [], 0, 4, 0))
    done: Stage[EpochDone] = Stage(9, ["a"])
    assert not done.add(EpochDone(8, "a", 0, 1, 0, 0, 0))
    assert done.add(EpochDone(9, "a", 0, 1, 0, 0, 0))


@settings(max_examples=100, deadline=None)
@given(
    workers=st.sets(st.sampled_from([f"w{i}" for i in range(6)]), min_size=1),
    noise=st.lists(st.tuples(st.integers(0, 3), st.sampled_from([f"w{i}" for i in range(9)])), max_size=20),
    data=st.data(),
)
def test_stage_property(workers: set[str], noise: list[tuple[int, str]], data: st.DataObject) -> None:
    stage: Stage[Vote] = Stage(2, workers)
    msgs = [Vote(e, n, [], [], 0) for e, n in noise] + [Vote(2, w, [], [], 0) for w in workers]
    order = data.draw(st.permutations(msgs))
    reported: set[str] = set()
    for m in order:
        if m.epoch == 2 and m.node_id in workers:
            reported.add(m.node_id)
        assert stage.add(m) == (reported == workers)
    assert stage.complete


def test_combine_votes_unions_and_sorts() -> None:
    """Fallback: every conflict; serial: every transaction that invoked one entity twice somewhere
    (those re-run alone afterwards, so they are not in the fallback)."""
    votes = [Vote(1, "w2", [9, 3], [9], 0), Vote(1, "w1", [3, 1], [4, 9], 0), Vote(1, "w3", [], [], 0)]
    assert combine_votes(votes) == ([1, 3], [4, 9])
    assert combine_votes([]) == ([], [])


def test_a_recheck_leaves_the_serial_ones_out_of_the_fallback() -> None:
    revotes = [Revote(1, "w1", [3, 4], 0), Revote(1, "w2", [7], 0)]
    assert combine_revotes(revotes, [4, 9]) == [3, 7]


def test_combine_exec_unions_aborts_and_the_votes_give_the_max_counter() -> None:
    msgs = [ExecDone(1, "w1", [5, 2], 0), ExecDone(1, "w2", [2, 8], 0), ExecDone(1, "w3", [], 0)]
    assert combine_exec(msgs) == [2, 5, 8]
    assert combine_exec([]) == []
    votes = [Vote(1, "w1", [], [], 0, 10, 0), Vote(1, "w2", [], [], 0, 14, 2), Vote(1, "w3", [], [], 0, 3, 0)]
    assert highest_lc(votes) == 14
    assert highest_lc([]) == 0


# ---- placement ------------------------------------------------------------------------------------


def test_placement_hand_worked() -> None:
    assert place(5, ["w2", "w1"]) == ["w1", "w2", "w1", "w2", "w1"]
    assert place(0, ["w1"]) == []
    with pytest.raises(AssertionError):
        place(3, [])


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 300),
    workers=st.lists(
        st.text(alphabet="abcdefw0123456789-", min_size=1, max_size=6), min_size=1, max_size=12, unique=True
    ),
    data=st.data(),
)
def test_placement_balanced_and_deterministic(n: int, workers: list[str], data: st.DataObject) -> None:
    placement = place(n, workers)
    assert len(placement) == n
    assert set(placement) <= set(workers)
    counts = Counter(placement)
    per_worker = [counts.get(w, 0) for w in workers]
    assert max(per_worker) - min(per_worker) <= 1
    if n >= len(workers):
        assert set(placement) == set(workers), "every worker gets a partition"
    shuffled = data.draw(st.permutations(workers))
    assert place(n, list(shuffled)) == placement, "placement depends on the order workers registered in"


# ---- membership -----------------------------------------------------------------------------------


def test_failed_after_timeout_with_explicit_clock() -> None:
    m = Membership(failure_timeout_ms=1000)
    m.register("w1", "h1", 1, now=0.0)
    m.register("w2", "h2", 2, now=0.0)
    assert m.failed(now=0.5) == []
    m.heartbeat("w1", now=0.8)
    assert m.failed(now=1.0) == [], "exactly the timeout is not yet a failure"
    assert m.failed(now=1.2) == ["w2"]
    assert m.failed(now=1.79) == ["w2"]
    assert m.failed(now=1.81) == ["w1", "w2"]
    m.heartbeat("w2", now=1.9)
    assert m.failed(now=2.0) == ["w1"]


def test_heartbeat_of_unknown_worker_is_ignored() -> None:
    m = Membership(failure_timeout_ms=1000)
    m.heartbeat("ghost", now=0.0)
    assert m.failed(now=100.0) == []
    assert m.workers == {}


def test_sids_are_dense_and_follow_sorted_node_ids() -> None:
    m = Membership(failure_timeout_ms=1000)
    for node in ("w3", "w1", "w2"):
        m.register(node, "h", 1, now=0.0)
    assert [(w.node_id, w.sid) for w in m.infos()] == [("w1", 1), ("w2", 2), ("w3", 3)]
    m.register("w2", "h2", 9, now=5.0)  # re-register: same sid, new address, fresh heartbeat
    assert [(w.node_id, w.sid) for w in m.infos()] == [("w1", 1), ("w2", 2), ("w3", 3)]
    assert m.workers["w2"].port == 9
    assert m.failed(now=5.5) == ["w1", "w3"]


# ---- deploy requests never take the coordinator down ---------------------------------------------


async def _deploy_over_network(path: str) -> tuple[list[AdminReply], asyncio.Task[None]]:
    net = MemoryNetwork(0)
    replies: list[AdminReply] = []
    net.register("admin", lambda src, msg: replies.append(msg), inbox="admin")  # type: ignore[arg-type]
    coord = Coordinator(load_config({}, env={}), net.endpoint("coordinator"), detect_failures=False)
    net.register("coordinator", coord.on_message)
    task = asyncio.create_task(coord.run())
    await asyncio.sleep(0)
    net.send("admin", "coordinator", DeployRequest(path))
    for _ in range(200):
        if replies or task.done():
            break
        await asyncio.sleep(0)
    return replies, task


async def _stop(task: asyncio.Task[None]) -> BaseException | None:
    if task.done():
        return task.exception()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return None


@pytest.mark.parametrize("path", ["missing.module:x", "nocolon", "tests.apps.oracle:nothere"])
async def test_bad_deploy_gets_an_error_reply(path: str) -> None:
    replies, task = await _deploy_over_network(path)
    alive = not task.done()
    crashed = await _stop(task)
    assert alive and crashed is None
    assert len(replies) == 1 and replies[0].ok is False and replies[0].error


async def test_relative_deploy_path_does_not_crash_the_coordinator() -> None:
    replies, task = await _deploy_over_network(".oracle:app")
    alive = not task.done()
    await _stop(task)
    assert alive
    assert len(replies) == 1 and replies[0].ok is False


# ---- time -----------------------------------------------------------------------------------------


async def test_deploy_timeout_and_failure_detection_run_on_the_loop_clock() -> None:
    """On virtual time a 30 s deploy timeout costs no real time, and a worker that never sends a
    heartbeat is reported failed: every timer and timestamp of the coordinator reads the loop."""
    with virtual_time():
        loop = asyncio.get_running_loop()
        net = MemoryNetwork(0)
        config = load_config({"heartbeat_interval_ms": 200, "failure_timeout_ms": 1000}, env={})
        coord = Coordinator(config, net.endpoint("coordinator"), min_workers=2)
        net.register("coordinator", coord.on_message)
        task = asyncio.create_task(coord.run())
        coord.on_message("w1", Register("w1", "127.0.0.1", 1))  # and never a heartbeat
        began = loop.time()
        with pytest.raises(GraphError, match=r"only 1 of 2 workers registered after 30.0s"):
            await coord.deploy("tests.apps.oracle:app", timeout_s=30.0)
        assert loop.time() - began == pytest.approx(30.0)
        status = coord.status()
        assert status["failed_workers"] == ["w1"]
        assert status["workers"][0]["last_heartbeat_s_ago"] == pytest.approx(30.0)
        assert not task.done()
        await _stop(task)


def test_status_rates_count_every_epoch_of_the_window() -> None:
    """5 000 epochs a second for 12 s: the rates say so (a bounded list of epochs capped them at 200)."""
    t = Throughput()
    t.started_at = 0.0
    done = [EpochDone(0, "w1", 0, 2, 1, 0, 0)]
    for i in range(60_000):
        t.record(i / 5000, done, 0)
    s = t.summary(12.0)
    assert (s["epochs_per_s"], s["txn_per_s"], s["abort_rate"]) == (5000.0, 15000.0, round(1 / 3, 4))
    assert len(t.buckets) <= STATUS_RATE_WINDOW_S + 2
    early = Throughput()
    early.started_at = 0.0
    early.record(0.5, done, 0)
    early.record(1.5, done, 0)
    assert early.summary(2.0)["epochs_per_s"] == 1.0  # two whole seconds so far, one epoch each


def test_bad_requests_are_rejected_not_aborted() -> None:
    """A client's bad requests (EpochDone.rejected) count as answered, outside the abort rate."""
    t = Throughput()
    t.started_at = 0.0
    for i in range(10):
        # committed 6, aborted by logic 2, rejected 2 per epoch
        t.record(i / 10, [EpochDone(i, "w1", 0, 6, 2, 0, 0, 2)], 0)
    s = t.summary(1.0)
    assert s["totals"]["aborted"] == 20 and s["totals"]["rejected"] == 20
    assert (s["txn_per_s"], s["abort_rate"]) == (100.0, 0.25)  # 2 of every 8 decided by the app


def test_a_view_keeps_the_sequencer_ids_it_was_built_with() -> None:
    """A view is encoded when the transport flushes, after more registrations may have renumbered the
    sequencer ids: those it holds must stay the ones it was built with (a worker got sid 4 with n_seq 3
    when they did not, and its process failed an assertion)."""
    m = Membership(1000)
    for node in ("w1", "w2", "w4"):
        m.register(node, "h", 1, 0.0)
    infos = m.infos()
    m.register("w3", "h", 1, 0.0)
    assert [(w.node_id, w.sid) for w in infos] == [("w1", 1), ("w2", 2), ("w4", 3)]
    assert [(w.node_id, w.sid) for w in m.infos()] == [("w1", 1), ("w2", 2), ("w3", 3), ("w4", 4)]
