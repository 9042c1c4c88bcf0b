"""Forming this worker's batch of an epoch: which transactions run, with which tids.

A live batch is the rescheduled transactions (keeping their tids; at most one per root entity, see
:func:`take_rescheduled`) followed by new requests from the ingress, each classified as one of the
sequencer log's entry kinds (:mod:`styx_py.core.wire.logs`):

* ``Run`` — a new transaction, given the next Mencius tid by the sequencer;
* ``Answered`` — a request id resent after its reply: the reply is given again, nothing runs;
* ``Waiting`` — a request id resent while its first copy still runs: answered with that copy's reply;
* ``Refused`` — a new request beyond what the worker admits (:mod:`styx_worker.admission`: past the
  batch's count of new requests, or a call of a function that would queue behind the rescheduled
  calls of it at the same root entity deeper than the bound), its reason (``backlog`` or
  ``entity``) logged with it: answered ``refused`` with the batch's resends
  (after the entry is durable), recorded in the reply table like any reply (a resent copy gets the
  same answer), nothing runs.

The batch's composition is written to the sequencer log before any of its replies can leave, so a
replayed epoch re-forms exactly the same batch from the log (:meth:`BatchFormer.replayed`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from styx_py.core.wire import (
    NIL,
    Answered,
    BatchEntry,
    IngressRecord,
    Phase,
    Refusal,
    Refused,
    Reply,
    ReplyStatus,
    Request,
    Run,
    SeqLogEntry,
    Waiting,
    Written,
)
from styx_worker.replies import ReplyOut
from styx_worker.sequencer import Sequencer
from styx_worker.txn import Resend, RootTxn


def take_rescheduled(rescheduled: list[RootTxn]) -> tuple[list[RootTxn], list[RootTxn]]:
    """Split the rescheduled transactions into those that run in the next epoch and those that wait.

    At most one per root entity runs, the oldest (lowest tid); the others wait, keeping their tids.
    A transaction is rescheduled when its call graph changed in the fallback, which happens when an
    older transaction wrote what it read; two of them with the same root entity would, in all
    likelihood, collide again the same way (TPC-C: every NewOrder of a district reads and bumps
    ``D_NEXT_O_ID``, and its new order's key is the id it read). Running all of them again made each
    epoch re-execute the whole backlog twice (optimistic and fallback) to commit one transaction per
    hot entity: epochs grew with the backlog until throughput collapsed. Running one per entity
    commits the same one per epoch while the epochs stay small. The split needs no determinism of
    its own: a batch's composition is logged, and replay re-forms it from the log.
    """
    ordered = sorted(rescheduled, key=lambda r: r.tid)
    run: list[RootTxn] = []
    wait: list[RootTxn] = []
    roots: set[tuple[str, str | int]] = set()
    for root in ordered:
        entity = (root.request.operator, root.request.key)
        if entity in roots:
            wait.append(root)
        else:
            roots.add(entity)
            run.append(root)
    return run, wait


HOT_BATCHES = 64  # a queue whose rescheduled calls waited behind one of their own in the last this
# many live batches counts as there for the next batch's calls (:meth:`BatchFormer.hot_queues`)

Queue = tuple[str, str | int, str]  # a root entity and function (:func:`_queue`)


def _queue(request: Request) -> Queue:
    """The queue of rescheduled transactions a request joins if it collides: its root entity and
    function (TPC-C: a district's NewOrders queue on ``D_NEXT_O_ID``, its Payments commit in the
    fallback and do not queue)."""
    return request.operator, request.key, request.function


def refusal(epoch: int, request: Request, reason: str = "") -> Reply:
    """The reply to a request ``epoch`` refused for ``reason`` (a :class:`Refusal`; empty: an entry
    logged before refusals had reasons): the same wherever and whenever it is made (replay compares
    it with the one on the egress log)."""
    if reason == Refusal.ENTITY:
        error = (
            f"not admitted in epoch {epoch}: calls of {request.function} queue behind entity "
            f"{request.operator}/{request.key!r} (a hot key; other entities are admitted); retry later"
        )
    else:
        bound = "" if not reason else " (backlog)"
        error = f"not admitted in epoch {epoch}: the cluster is over its admission bound{bound}; retry later"
    return Reply(
        request.request_id,
        0,
        epoch,
        Phase.OPTIMISTIC,
        ReplyStatus.REFUSED,
        NIL,
        error,
        "Overloaded",
        request.ts_ms,
        reason,
    )


Misclassified = Callable[[int, BatchEntry, str], None]  # (epoch, the logged entry, what replay made of it)
Formed = tuple[list[RootTxn], list[Resend], list[IngressRecord]]  # roots, resends answered, copies waiting


class BatchFormer:
    """Forms this worker's batch of each epoch (pure: the shell takes the records from the ingress)."""

    __slots__ = (
        "epoch_size_max",
        "formed",
        "hot",
        "next_run",
        "node_id",
        "nodes",
        "on_diverged",
        "replay",
        "replies",
        "rescheduled",
        "sequenced",
        "sequencer",
    )

    def __init__(
        self, node_id: str, epoch_size_max: int, replies: ReplyOut, on_diverged: Misclassified
    ) -> None:
        self.node_id = node_id
        self.on_diverged = on_diverged
        self.epoch_size_max = epoch_size_max
        self.replies = replies
        self.sequencer = Sequencer(1, 1)
        self.nodes = 1  # workers in the current generation (logged: recovery needs every one's entry)
        self.rescheduled: list[RootTxn] = []  # rescheduled transactions waiting for a batch
        self.next_run: list[RootTxn] = []  # those the next live batch runs (:meth:`room` chose them)
        self.replay: dict[int, SeqLogEntry] = {}  # epoch -> logged composition of this worker's batch
        # New transactions sequenced live per ingress partition since start (heartbeats carry it).
        self.sequenced: dict[int, int] = {}
        self.formed = 0  # live batches formed since start
        self.hot: dict[Queue, int] = {}  # queue -> the last live batch formed while some of it waited

    def room(self) -> int:
        """How many ingress records the next live batch takes, after the rescheduled transactions it
        runs (chosen now, :func:`take_rescheduled`)."""
        self.next_run, self.rescheduled = take_rescheduled(self.rescheduled)
        return max(0, self.epoch_size_max - len(self.next_run))

    def in_flight(self) -> set[str]:
        """The request ids the next live batch runs or waits for already: its rescheduled
        transactions, those still waiting, and the requests whose copies wait for their reply."""
        running = {r.request.request_id for r in self.next_run} | set(self.replies.waiting)
        running.update(r.request.request_id for r in self.rescheduled)
        return running

    def count_new(self, records: Iterable[IngressRecord], running: set[str]) -> int:
        """How many of ``records`` are new requests, as :meth:`form` classifies them (``Run``) after
        the ids in ``running``, which it extends: not answered, not running, not an earlier copy."""
        answered, new = self.replies.answered, 0
        for rec in records:
            rid = rec.request.request_id
            if rid not in running and answered.get(rec.partition, rid) is None:
                running.add(rid)
                new += 1
        return new

    def refuse(self, rec: IngressRecord, epoch: int, resends: list[Resend], reason: str) -> Refused:
        """Refuse ``rec`` in ``epoch`` for ``reason``: its reply is recorded and goes out with the
        resends."""
        request = rec.request
        reply = refusal(epoch, request, reason)
        self.replies.answered.record(rec.partition, reply)
        resends.append((self.replies.route(rec.partition, request, epoch), reply, request.reply_to))
        return Refused(rec.partition, rec.offset, request.request_id, reason)

    def form(
        self,
        epoch: int,
        gen: int,
        version: int,
        records: list[IngressRecord],
        written: tuple[int, list[Written]] = (-1, []),
        admitted: int = -1,
        depth_max: int = -1,
    ) -> tuple[Formed, SeqLogEntry]:
        """The live batch of ``epoch`` (run by graph ``version``) from the rescheduled transactions
        :meth:`room` chose and ``records``: its roots, the resent ids it answers and the copies that
        wait for a running one, and its sequencer-log entry, which carries ``written``: the digests
        of the epoch this worker finished before (:mod:`styx_worker.digests`). Of ``records``, the
        new requests after the first ``admitted`` (-1: none) are refused, and so are those that
        would join a queue of rescheduled transactions (their root entity and function) more than
        ``depth_max`` (-1: no bound) deep: those waiting after this batch, and the requests of this
        batch admitted into the queue before them (into one that has some waiting, or had some in
        the last :data:`HOT_BATCHES` live batches: then behind its head, the rescheduled one that
        runs in this batch or else the batch's first call there; a batch's calls of an entity whose
        calls have not queued lately are all admitted)."""
        lc_start = self.sequencer.lc
        running = self.in_flight()
        resched, self.next_run = self.next_run, []
        # How deep each (root entity, function) queue of rescheduled transactions is after this batch:
        # a new call of that function there would collide the same way and queue behind them, and
        # behind the calls of this batch admitted into the same queue before it.
        # A queue with none waiting that had some lately: the calls of this batch behind its head (the
        # rescheduled one that runs now, or else its first call of this batch) join it.
        depths = Counter(_queue(r.request) for r in self.rescheduled)
        heads = {_queue(r.request) for r in resched}
        hot, cold = self.hot_queues(resched), self.formed - HOT_BATCHES
        fresh: list[IngressRecord] = []
        resends: list[Resend] = []
        waiting: list[IngressRecord] = []
        answered: list[BatchEntry] = []
        admitted = len(records) if admitted < 0 else admitted
        for rec in records:
            kind = self.classify(rec, running, resends, epoch)
            request = rec.request
            if kind is Run:
                queue = _queue(request)
                if len(fresh) >= admitted or 0 <= depth_max < depths[queue]:
                    running.discard(request.request_id)
                    reason = Refusal.BACKLOG if len(fresh) >= admitted else Refusal.ENTITY
                    answered.append(self.refuse(rec, epoch, resends, reason))
                else:
                    fresh.append(rec)
                    if depths[queue]:  # a queue there: this call joins it
                        depths[queue] += 1
                    elif hot.get(queue, cold) > cold:  # none waiting but a queue lately: behind its head
                        if queue in heads:
                            depths[queue] += 1
                        else:
                            heads.add(queue)  # this call runs first, the next ones join behind it
            elif kind is Answered:
                answered.append(Answered(rec.partition, rec.offset, rec.request.request_id))
            else:
                waiting.append(rec)
                answered.append(Waiting(rec.partition, rec.offset, rec.request.request_id))
        sequenced = self.sequenced  # per partition, for the coordinator's placement by load
        for rec in fresh:
            sequenced[rec.partition] = sequenced.get(rec.partition, 0) + 1
        tids = self.sequencer.assign(len(fresh))
        roots = resched + [RootTxn(tid, rec) for tid, rec in zip(tids, fresh, strict=True)]
        # Logged even when empty: a complete set of entries (one per worker) marks an epoch that may
        # have been decided, which is how a restarted coordinator finds where replay must end.
        entries: list[BatchEntry] = [Run(r.tid, r.partition, r.offset, r.request.request_id) for r in roots]
        seq = self.sequencer
        entry = SeqLogEntry(
            epoch,
            self.node_id,
            lc_start,
            entries + answered,
            gen,
            seq.lc,
            self.nodes,
            seq.n_seq,
            version,
            *written,
        )
        return (roots, resends, waiting), entry

    def hot_queues(self, resched: list[RootTxn]) -> dict[Queue, int]:
        """Count a live batch formed now, which runs ``resched``: the queues that have rescheduled
        transactions waiting behind one of their own (the one that runs) now or had some in the
        last :data:`HOT_BATCHES` live batches. A queue with none waiting at this moment is hot all
        the same: its calls collide as before, and a slow epoch's batch (what arrived during one of
        300-600 ms: TPC-C's NewOrders of a district, dozens of them) would otherwise admit every
        call into it, which then queue behind one another one epoch each, long past the bound. A
        queue whose rescheduled calls never wait behind one of their own is not hot (TPC-C's
        Payments: one is rescheduled now and then, the others commit in the fallback; it may wait
        behind a rescheduled NewOrder of its district, as one per root entity runs)."""
        self.formed += 1
        hot = self.hot
        queued = Counter(_queue(r.request) for r in (*resched, *self.rescheduled))
        for queue, n in queued.items():
            if n > 1:  # its calls wait behind one another (not one behind another function's head)
                hot[queue] = self.formed
        if len(hot) > HOT_BATCHES and self.formed % HOT_BATCHES == 0:  # forget the cold ones now and then
            cold = self.formed - HOT_BATCHES
            self.hot = hot = {q: at for q, at in hot.items() if at > cold}
        return hot

    def logged_version(self, epoch: int) -> int | None:
        """The graph version a logged epoch to replay ran with (None: no entry of it here)."""
        entry = self.replay.get(epoch)
        return None if entry is None else entry.version or 1  # 0: logged before code updates

    def to_fetch(self, epoch: int) -> list[tuple[int, int]]:
        """The ingress records (partition, packed offset) the replay of ``epoch`` re-forms its batch
        from, in log order per partition: every entry but the rescheduled transactions it ran again."""
        entry = self.replay.get(epoch)
        if entry is None:
            return []
        waiting = {r.tid for r in self.rescheduled}
        return sorted(
            (e.partition, e.offset) for e in entry.entries if not (isinstance(e, Run) and e.tid in waiting)
        )

    def replayed(self, epoch: int, records: list[IngressRecord]) -> Formed:
        """Re-form this worker's batch of a logged epoch exactly: same requests, same tids, from the
        records :meth:`to_fetch` named."""
        entry = self.replay.pop(epoch, None)
        roots: list[RootTxn] = []
        resends: list[Resend] = []
        copies: list[IngressRecord] = []
        if entry is None:
            return roots, resends, copies
        waiting = {r.tid: r for r in self.rescheduled}
        running = {r.request.request_id for r in self.rescheduled} | set(self.replies.waiting)
        # The entries list the runs first and the resent ids after them, so their order is not the
        # ingress order: a resend taken before a fresh request of its partition is logged after it.
        # The records came in log order per partition; the entries are gone through in their order.
        by_position = {(rec.partition, rec.offset): rec for rec in records}
        for e in entry.entries:
            root = waiting.pop(e.tid, None) if isinstance(e, Run) else None
            if root is None:
                rec = by_position[e.partition, e.offset]
                if isinstance(e, Refused):
                    self.refuse(rec, epoch, resends, e.reason)  # as logged: the bounds read the clock
                    continue
                if not isinstance(e, Run):
                    kind = self.classify(rec, running, resends, epoch)
                    if kind is Waiting:
                        copies.append(rec)
                    if kind is not type(e):
                        # The reply table differs from the original run's: an earlier epoch diverged.
                        self.on_diverged(epoch, e, kind.__name__)
                    continue
                running.add(rec.request.request_id)
                root = RootTxn(e.tid, rec)
            roots.append(root)
        self.rescheduled = list(waiting.values())
        self.sequencer.rebalance(entry.lc_end)
        return roots, resends, copies

    def classify(
        self, rec: IngressRecord, running: set[str], resends: list[Resend], epoch: int
    ) -> type[Run] | type[Answered] | type[Waiting]:
        """Run (fresh), Answered or Waiting (module docstring). Deterministic: it depends only on the
        reply table and the batch, both replayed identically."""
        rid = rec.request.request_id
        earlier = self.replies.answered.get(rec.partition, rid)
        if earlier is not None:
            request = rec.request
            resends.append((self.replies.route(rec.partition, request, epoch), earlier, request.reply_to))
            return Answered
        if rid in running:
            return Waiting
        running.add(rid)
        return Run
