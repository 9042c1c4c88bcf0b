"""Forming this worker's batch of an epoch: which transactions run, with which tids.

A live batch is the rescheduled transactions (keeping their tids; at most one per root entity, see
:func:`take_rescheduled`) followed by new requests from the ingress, each classified as one of the
sequencer log's entry kinds (:mod:`styx_py.core.wire.logs`):

* ``Run`` — a new transaction, given the next Mencius tid by the sequencer;
* ``Answered`` — a request id resent after its reply: the reply is given again, nothing runs;
* ``Waiting`` — a request id resent while its first copy still runs: answered with that copy's reply.

The batch's composition is written to the sequencer log before any of its replies can leave, so a
replayed epoch re-forms exactly the same batch from the log (:meth:`BatchFormer.replayed`).
"""

from __future__ import annotations

from collections.abc import Callable

from styx_py.core.ports import Ingress
from styx_py.core.wire import Answered, BatchEntry, IngressRecord, Run, SeqLogEntry, Waiting
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


Misclassified = Callable[[int, BatchEntry, str], None]  # (epoch, the logged entry, what replay made of it)


def _misclassified(epoch: int, logged: BatchEntry, replayed: str) -> None:
    raise AssertionError(
        f"replay of epoch {epoch} classified {logged.request_id} as {replayed}, log: {logged}"
    )


class BatchFormer:
    def __init__(
        self,
        node_id: str,
        epoch_size_max: int,
        ingress: Ingress,
        replies: ReplyOut,
        on_diverged: Misclassified = _misclassified,
    ) -> None:
        self.node_id = node_id
        self.on_diverged = on_diverged
        self.epoch_size_max = epoch_size_max
        self.ingress = ingress
        self.replies = replies
        self.sequencer = Sequencer(1, 1)
        self.nodes = 1  # workers in the current generation (logged: recovery needs every one's entry)
        self.rescheduled: list[RootTxn] = []  # rescheduled transactions waiting for a batch
        self.replay: dict[int, SeqLogEntry] = {}  # epoch -> logged composition of this worker's batch
        # New transactions sequenced live per ingress partition since start (heartbeats carry it).
        self.sequenced: dict[int, int] = {}

    def pending(self) -> int:
        """Transactions waiting to run: rescheduled ones and requests buffered from the ingress."""
        return len(self.rescheduled) + self.ingress.pending()

    def form(self, epoch: int, gen: int, version: int) -> tuple[list[RootTxn], SeqLogEntry, list[Resend]]:
        """The live batch of ``epoch`` (run by graph ``version``): its roots, its sequencer-log entry and
        the resent ids it answers."""
        lc_start = self.sequencer.lc
        resched, self.rescheduled = take_rescheduled(self.rescheduled)
        room = max(0, self.epoch_size_max - len(resched))
        records = self.ingress.take(room) if room else []
        # In flight: this batch's rescheduled transactions, those still waiting, and resent copies.
        running = {r.request.request_id for r in resched} | set(self.replies.waiting)
        running.update(r.request.request_id for r in self.rescheduled)
        fresh: list[IngressRecord] = []
        resends: list[Resend] = []
        answered: list[BatchEntry] = []
        for rec in records:
            kind = self.classify(rec, running, resends, epoch)
            if kind is Run:
                fresh.append(rec)
            elif kind is Answered:
                answered.append(Answered(rec.partition, rec.offset, rec.request.request_id))
            else:
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
            epoch, self.node_id, lc_start, entries + answered, gen, seq.lc, self.nodes, seq.n_seq, version
        )
        return roots, entry, resends

    def logged_version(self, epoch: int) -> int | None:
        """The graph version a logged epoch to replay ran with (None: no entry of it here)."""
        entry = self.replay.get(epoch)
        return None if entry is None else entry.version or 1  # 0: logged before code updates

    async def replayed(self, epoch: int) -> tuple[list[RootTxn], list[Resend]]:
        """Re-form this worker's batch of a logged epoch exactly: same requests, same tids."""
        entry = self.replay.pop(epoch, None)
        roots: list[RootTxn] = []
        resends: list[Resend] = []
        if entry is None:
            return roots, resends
        waiting = {r.tid: r for r in self.rescheduled}
        running = {r.request.request_id for r in self.rescheduled} | set(self.replies.waiting)
        # The entries list the runs first and the resent ids after them, so their order is not the
        # ingress order: a resend taken before a fresh request of its partition is logged after it.
        # Take the epoch's records in log order per partition, then go through the entries.
        from_ingress = [e for e in entry.entries if not (isinstance(e, Run) and e.tid in waiting)]
        records: dict[tuple[int, int], IngressRecord] = {}
        for partition, offset in sorted((e.partition, e.offset) for e in from_ingress):
            records[partition, offset] = await self.ingress.take_exact(partition, offset)
        for e in entry.entries:
            root = waiting.pop(e.tid, None) if isinstance(e, Run) else None
            if root is None:
                rec = records[e.partition, e.offset]
                if not isinstance(e, Run):
                    kind = self.classify(rec, running, resends, epoch)
                    if kind is not type(e):
                        # The reply table differs from the original run's: an earlier epoch diverged.
                        self.on_diverged(epoch, e, kind.__name__)
                    continue
                running.add(rec.request.request_id)
                root = RootTxn(e.tid, rec)
            roots.append(root)
        self.rescheduled = list(waiting.values())
        self.sequencer.rebalance(entry.lc_end)
        return roots, resends

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
            self.replies.waiting.setdefault(rid, []).append(rec)
            return Waiting
        running.add(rid)
        return Run
