"""The worker's core on its own: events in, effects out, no event loop (styx_worker.core, .epoch).

Each test builds one or two :class:`~styx_worker.core.WorkerCore` objects, feeds them the messages a
coordinator and a peer would send and what a shell would report back, and asserts the effects. The
invocations a ``Run`` asks for are run here with the real executor, to their end, without a loop (the
functions below never wait for a synchronous call).
"""

from __future__ import annotations

from typing import Any

import msgspec

from styx_py import Context, Graph, Operator
from styx_py.core.config import load_config
from styx_py.core.graph import OperatorSpec
from styx_py.core.partitioning import partition_of
from styx_py.core.segments import Cursor
from styx_py.core.wire import (
    COORDINATOR,
    Ack,
    ClusterView,
    EpochDone,
    EpochStart,
    ExecDone,
    Final,
    Halt,
    IngressRecord,
    Invoke,
    Phase,
    ReplayDiverged,
    Reply,
    Request,
    Status,
    Vote,
    WorkerInfo,
    decode_value,
    encode_value,
)
from styx_worker.core import WorkerCore
from styx_worker.digests import digests_of
from styx_worker.effects import Closed, Effect, Emit, Live, Log, LogAcked, Run, Send, Take, Taken
from styx_worker.executor import run_invocation
from styx_worker.txn import EpochPhase

acct = Operator("acct", partitions=2)


@acct.function
async def deposit(ctx: Context, amount: int) -> int:
    balance: int = await ctx.get(default=0) + amount
    await ctx.put(balance)
    return balance


@acct.function
async def transfer(ctx: Context, to: str, amount: int) -> int:
    balance: int = await ctx.get(default=0)
    await ctx.put(balance - amount)
    ctx.call_async(acct, "deposit", to, amount)
    return balance - amount


GRAPH = Graph("bank", [acct])


class Ports:
    """What a core reads of its ports (PortView): nothing buffered, nothing acknowledged."""

    def pending(self) -> int:
        return 0

    def positions(self) -> dict[int, Cursor]:
        return {}

    def egress_offsets(self) -> dict[int, int]:
        return {}

    def seqlog_acked(self) -> int:
        return 0


class NoCalls:
    def call(self, child: Invoke, dispatch: bool) -> Any:
        raise AssertionError("these functions make no synchronous call")


def view(placement: list[str]) -> ClusterView:
    workers = sorted(set(placement))
    return ClusterView(
        1,
        [WorkerInfo(w, i + 1, "127.0.0.1", 0) for i, w in enumerate(workers)],
        placement,
        "tests:bank",
        [OperatorSpec("acct", 2, ["deposit", "transfer"])],
        None,
        "in",
        "out",
        "seq",
        0,
    )


def core_of(node_id: str, placement: list[str]) -> WorkerCore:
    core = WorkerCore(node_id, load_config({}, env={}), Ports())
    core.epochs.graphs[1] = GRAPH
    core.step(view(placement))
    return core


def record(rid: str, offset: int, function: str, key: str, *args: Any) -> IngressRecord:
    request = Request(rid, "acct", function, key, msgspec.Raw(encode_value(list(args))))
    return IngressRecord(partition_of(key, 2), offset, request, 0)


def start(epoch: int = 0) -> EpochStart:
    return EpochStart(epoch, 0, False, False, 0, 1, 0)


def run_all(core: WorkerCore, effects: list[Effect]) -> list[Effect]:
    """Carry out every Run of ``effects`` (and of what their ends lead to) with the real executor; the
    other effects, in order."""
    out: list[Effect] = []
    queue = list(effects)
    while queue:
        e = queue.pop(0)
        if not isinstance(e, Run):
            out.append(e)
            continue
        coro = run_invocation(e.view, NoCalls(), e.inv, e.cached)
        try:
            coro.send(None)
        except StopIteration as stop:
            queue.extend(core.step(stop.value))
        else:
            raise AssertionError("an invocation waited")
    return out


def sent(effects: list[Effect], kind: type, to: str | None = None) -> list[Any]:
    return [
        e.msg for e in effects if isinstance(e, Send) and isinstance(e.msg, kind) and to in (None, e.dest)
    ]


def replies(effects: list[Effect]) -> dict[str, Any]:
    return {e.reply.request_id: decode_value(e.reply.result) for e in effects if isinstance(e, Emit)}


def test_one_epoch_from_its_start_to_its_done() -> None:
    core = core_of("w1", ["w1", "w1"])
    effects = core.step(start())
    assert [type(e) for e in effects] == [Live, Take], "the batch is taken after the segment is followed"
    take = effects[1]
    assert isinstance(take, Take) and take.room == core.batch.epoch_size_max
    effects = core.step(Taken(take, [record("r1", 0, "deposit", "a", 5), record("r2", 1, "deposit", "b", 7)]))
    assert isinstance(effects[0], Log) and [type(e) for e in effects[1:]] == [Run, Run]
    assert [x.request_id for x in effects[0].entry.entries] == ["r1", "r2"]
    after_runs = run_all(core, effects[1:])
    assert after_runs == [], "no vote before the batch's log entry is durable"
    assert core.epochs.epochs[0].phase == EpochPhase.VOTING
    done = core.step(LogAcked(0, 0))
    assert sent(done, Vote, COORDINATOR) and replies(done) == {"r1": 5, "r2": 7}
    assert isinstance(done[-1], Send) and isinstance(done[-1].msg, EpochDone)
    assert any(isinstance(e, Closed) for e in done)
    assert dict(core.epochs.store.items()) == {("acct", "a"): encode_value(5), ("acct", "b"): encode_value(7)}
    assert core.epochs.completed_epoch == 0 and not core.epochs.epochs


def test_a_conflict_commits_the_lower_tid_lock_free_and_reruns_the_other_under_its_lock() -> None:
    core = core_of("w1", ["w1", "w1"])
    take = core.step(start())[1]
    assert isinstance(take, Take)
    effects = core.step(Taken(take, [record("r1", 0, "deposit", "a", 5), record("r2", 1, "deposit", "a", 7)]))
    run_all(core, effects[1:])
    decided = core.step(LogAcked(0, 0))
    [vote] = sent(decided, Vote, COORDINATOR)
    assert vote.conflicts == [2], "the second deposit (tid 2) read what the first (tid 1) wrote"
    assert replies(decided) == {"r1": 5}, "the first commits lock-free, its reply leaves at once"
    reruns = [e for e in decided if isinstance(e, Run)]
    assert [(r.inv.tid, r.inv.phase) for r in reruns] == [(2, Phase.FALLBACK)]
    finished = run_all(core, reruns)
    assert replies(finished) == {"r2": 12}, "re-run after the first commit, it sees its write"
    assert sent(finished, EpochDone, COORDINATOR)
    assert dict(core.epochs.store.items()) == {("acct", "a"): encode_value(12)}


def test_a_late_copy_of_an_optimistic_ack_is_not_counted_into_the_fallback_run() -> None:
    """After the decision the fallback re-runs tid 2 from scratch; a copy of an ack of its optimistic run
    that arrives then (a peer's, repeated late) belongs to that earlier run: counted into the new one,
    it would complete the re-run before it ran and answer without its write."""
    core = core_of("w1", ["w1", "w1"])
    take = core.step(start())[1]
    assert isinstance(take, Take)
    effects = core.step(Taken(take, [record("r1", 0, "deposit", "a", 5), record("r2", 1, "deposit", "a", 7)]))
    run_all(core, effects[1:])
    reruns = [e for e in core.step(LogAcked(0, 0)) if isinstance(e, Run)]
    late = Ack(0, 2, Phase.OPTIMISTIC, 1, 1, Status.OK, "", [0], 0)
    assert core.step(late) == [], "the optimistic run's ack does not end the fallback run"
    finished = run_all(core, reruns)
    assert replies(finished) == {"r2": 12}
    assert dict(core.epochs.store.items()) == {("acct", "a"): encode_value(12)}


def test_messages_that_come_early_wait_for_their_point_of_the_epoch() -> None:
    """A peer's call before this worker's EpochStart waits for it; the next epoch's messages wait until
    this one finished here; the Vote waits for every worker's ExecDone."""
    w1 = core_of("w1", ["w1", "w2"])
    key_on_w1 = next(k for k in "abcdefgh" if partition_of(k, 2) == 0)
    call = Invoke(0, 2, Phase.OPTIMISTIC, [0], "w2", "w2", "acct", "deposit", key_on_w1,
                  msgspec.Raw(encode_value([1])), 1, 2, False, 0, 0)  # fmt: skip
    assert w1.step(call) == [], "no code before the EpochStart says which version runs"
    effects = w1.step(start())
    assert [type(e) for e in effects] == [Run, Live, Take], "let in at the EpochStart"
    take = effects[2]
    assert isinstance(take, Take)
    later = ExecDone(1, "w2", [], 0)
    assert w1.step(later) == [], "epoch 1 waits for epoch 0 here"
    acks = run_all(w1, [effects[0], *w1.step(Taken(take, []))])
    assert sent(acks, ExecDone, "w2") and not sent(acks, Vote), "its own roots are done (none)"
    assert w1.step(LogAcked(0, 0)) == [], "logged, but w2's ExecDone is missing"
    voted = w1.step(ExecDone(0, "w2", [], 0))
    assert sent(voted, Vote, COORDINATOR) and sent(voted, Vote, "w2")
    finished = w1.step(Vote(0, "w2", [], [], 0, 1, 0))
    assert sent(finished, EpochDone, COORDINATOR) and w1.epochs.completed_epoch == 0
    assert w1.epochs.epochs[1].reports.exec_done == {"w2": later}, "epoch 1's message was let in"


def test_a_fallback_message_before_the_decision_waits_for_it() -> None:
    w1 = core_of("w1", ["w1", "w2"])
    take = w1.step(start())[1]
    assert isinstance(take, Take)
    w1.step(Taken(take, []))
    final = Final(0, 2, 0, 0)
    assert w1.step(final) == [] and w1.epochs.epochs[0].phase < EpochPhase.FALLBACK
    assert len(w1.epochs.inbox) == 1


def test_a_replayed_reply_unlike_the_logged_one_halts_the_worker_and_names_the_request() -> None:
    core = core_of("w1", ["w1", "w1"])
    take = core.step(start())[1]
    assert isinstance(take, Take)
    effects = core.step(Taken(take, [record("r1", 0, "deposit", "a", 5)]))
    run_all(core, effects[1:])
    logged = Reply("r1", 1, 0, 0, "committed", msgspec.Raw(encode_value(6)), None, None)
    core.replies.on_log = {"r1": [logged]}  # what the first run of this epoch put on the egress log
    halted = core.step(LogAcked(0, 0))
    [diverged] = sent(halted, ReplayDiverged, COORDINATOR)
    assert diverged.request_id == "r1" and diverged.function == "acct.deposit"
    assert not replies(halted), "the replayed reply does not leave"
    assert core.halted and any(type(e).__name__ == "Halt" for e in halted)
    assert core.step(start(1)) == [], "a halted worker runs nothing more"
    assert core.step(Halt("again")) and core.halted == "again"


def test_every_message_a_worker_takes_has_one_handler() -> None:
    """A worker's port decodes ToWorker: each of its messages goes to the core or to the shell, never both
    and never neither; each epoch message has its handler in the epoch machine."""
    from typing import get_args

    from styx_py.core.wire import ToWorker
    from styx_worker import epoch
    from styx_worker.core import CORE_MESSAGES
    from styx_worker.shell import SHELL_MESSAGES

    taken = set(get_args(ToWorker))
    assert taken == CORE_MESSAGES | SHELL_MESSAGES, taken ^ (CORE_MESSAGES | SHELL_MESSAGES)
    assert not CORE_MESSAGES & SHELL_MESSAGES
    assert set(epoch.EPOCH_MESSAGES) == set(epoch._HANDLERS)


def test_the_next_batch_logs_the_digests_of_what_the_epoch_before_committed() -> None:
    core = core_of("w1", ["w1", "w1"])
    take = core.step(start())[1]
    assert isinstance(take, Take)
    effects = core.step(Taken(take, [record("r1", 0, "deposit", "a", 5), record("r2", 1, "deposit", "d", 7)]))
    first = effects[0]
    assert isinstance(first, Log) and (first.entry.written_epoch, first.entry.written) == (-1, [])
    run_all(core, effects[1:])
    core.step(LogAcked(0, 0))
    take = core.step(start(1))[1]
    assert isinstance(take, Take)
    logged = core.step(Taken(take, []))[0]
    assert isinstance(logged, Log) and logged.entry.written_epoch == 0
    written = {w.partition: (w.tids, w.digests) for w in logged.entry.written}
    a = digests_of({("acct", "a"): encode_value(5)}, {"acct": 2})
    d = digests_of({("acct", "d"): encode_value(7)}, {"acct": 2})
    assert written == {0: ([1], a[0]), 1: ([2], d[1])}


def test_a_replayed_write_unlike_its_logged_digest_halts_the_worker_and_names_the_writer() -> None:
    """The reply of the transaction is the same (nothing on the log to compare it with here); its write
    differs from the digest the first run logged: the worker halts naming epoch, partition, tid and
    function, and the reply does not leave."""
    core = core_of("w1", ["w1", "w1"])
    p = partition_of("a", 2)
    core.epochs.expected = {0: {p: {1: digests_of({("acct", "a"): encode_value(6)}, {"acct": 2})[p]}}}
    take = core.step(start())[1]
    assert isinstance(take, Take)
    effects = core.step(Taken(take, [record("r1", 0, "deposit", "a", 5), record("r2", 1, "deposit", "d", 1)]))
    run_all(core, effects[1:])
    halted = core.step(LogAcked(0, 0))
    [diverged] = sent(halted, ReplayDiverged, COORDINATOR)
    assert (diverged.epoch, diverged.partition, diverged.tid) == (0, p, 1)
    assert diverged.function == "acct.deposit" and diverged.request_id == "r1"
    assert f"the writes of tid 1 (acct.deposit, request r1) on partition {p}" in diverged.describe()
    assert not replies(halted), "no reply of the diverged transaction leaves, nor any after it"
    assert core.halted and not sent(halted, EpochDone)
