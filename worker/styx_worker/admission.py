"""Admission control: how many ingress requests a worker admits into each epoch, and which it refuses.

Past its knee a cluster that admits everything queues: the ingress backlog grows, every request waits
behind it, epochs grow with it (more conflicts, more fallback), run longer and commit less. So each
worker bounds the work it admits, at the one point where requests enter the system — where its batch
of an epoch is formed from its ingress buffer (:class:`AdmissionGate`, in the shell's ``Take``):

* **Epoch size.** :class:`Admission` sizes the batch (rescheduled transactions included) from the
  durations it measured of its own epochs, from the batch's take to the epoch's end here, so that an
  epoch takes about ``admission_epoch_ms``: an epoch that ran longer shrinks the next batch in
  proportion to the batch it ran, but at most by half, a full one that ran shorter grows it (at most
  double), never past ``epoch_size_max`` nor below :data:`MIN_EPOCH_SIZE`. A batch that was not full
  says nothing about capacity and changes nothing, unless it was at least half full and too slow (a
  small batch that ran long says the epoch's fixed cost was high: a slow store, a loaded machine).
  An epoch that refused more requests than it ran does not shrink the batch either: refusing costs
  too (a log entry and a reply each), and a smaller batch would refuse more, make the epochs slower
  still and admit less and less.
* **Backlog cap.** What stays buffered after the batch is bounded by what the worker admits in
  ``admission_queue_ms`` (that many epochs' worth at the current size, at the pace epochs ran
  lately: ``admission_epoch_ms`` each, or longer when they took longer); the records beyond it are
  taken now and *refused*: answered ``refused`` (the SDK raises ``Overloaded``, the gateway answers 429
  with Retry-After) within the epoch, nothing runs. So an admitted request waits at most about
  ``admission_queue_ms`` plus its own epoch, and a refused one is told at once instead of timing out.
* **New requests only.** Clients resend every unanswered request; a copy of a request already
  answered, running or buffered is answered with its first copy's reply and runs nothing
  (:mod:`styx_worker.batch`). So the batch size and the backlog cap count new request ids only: a
  batch takes records until it holds its size of new ones (the copies among them ride along), and
  the buffer is counted by its new ids when it is over the cap in records.
* **Hot entities.** One rescheduled transaction per root entity runs per epoch
  (:func:`styx_worker.batch.take_rescheduled`), so those of a hot entity queue behind it (TPC-C with
  one warehouse: a district's NewOrders), invisible to the backlog cap. A new request that would
  join the queue of rescheduled calls of its function behind its root entity (the entity its first
  call targets) is refused when it would not run within ``admission_queue_ms`` at the duration
  epochs took here lately (:attr:`Admission.depth_max`): it would collide the same way and queue
  behind them, and joining ``n`` deep it runs ``n + 1`` epochs later. The calls of the batch
  admitted into the queue before it count (a batch with 30 NewOrders of a district queues 29 of
  them), also when none waits in the queue at that moment but some waited behind one of their own
  in the last :data:`styx_worker.batch.HOT_BATCHES` live batches: then behind its head (the
  rescheduled one that runs, or else the batch's first call there), as a slow epoch's batch of what
  arrived meanwhile holds dozens of a district's NewOrders, which collide as before; a batch's calls
  of an entity without such a queue are admitted (nothing says they collide). An
  admitted request behind a hot entity so waits about ``admission_queue_ms`` plus its first epoch.
  The requests of the other entities, and of other functions there (TPC-C's Payments, which commit
  in the fallback), are admitted as usual.
* **After a stall.** A recovery, a replaced worker or a partition move holds every epoch for a while
  (each ends in a new generation), and what arrived meanwhile is more than ``admission_queue_ms``
  worth: the cluster was paused, not overloaded. The same holds within a generation when no epoch
  ends here for :data:`STALL_PACES` times the duration epochs took here lately while epochs or
  records wait (a broker
  that reads its log back from S3 after a restart), or an epoch ran that long: the epochs taken
  before the stall ended are not measured (they say nothing about the batch size or the pace). So
  from the first batch of a new generation, or the first after such a stall, the backlog is worked
  through: batches of the usual size, nothing refused, until the buffer, once over
  the cap, is drained (a batch takes all of it; clients that resent while the cluster was paused send
  their copies in waves, which a drain merely under the cap would refuse), or at the latest after
  :data:`CATCHUP_FACTOR` times the stall (how long the oldest buffered request had waited for a
  batch), at least :data:`CATCHUP_MIN_PACES` epochs' worth: an overload that coincides with a stall
  is still refused after that, and so are requests behind a hot entity. The epochs taken before a
  new generation are forgotten (a recovery ended them, and the new generation reuses their numbers).

The decisions read the clock, so they are not deterministic; like the batch itself they are written
to the sequencer log (``Refused`` entries, :mod:`styx_worker.batch`) before any reply leaves, and a
replay re-forms the batch from the log: the same requests are refused again, each answered once.

:class:`Admission` is pure (the caller passes the time); :class:`AdmissionGate` reads the worker's
clock and ingress.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from styx_py.core.ports import Clock, Ingress
from styx_py.core.wire import IngressRecord
from styx_worker.batch import BatchFormer
from styx_worker.effects import Take, Taken

__all__ = [
    "CATCHUP_FACTOR",
    "CATCHUP_MIN_PACES",
    "MIN_EPOCH_SIZE",
    "STALL_PACES",
    "Admission",
    "AdmissionGate",
    "Decision",
]

MIN_EPOCH_SIZE = 8  # the smallest batch the sizing chooses (an epoch's fixed cost needs some work)
MAX_TRACKED = 64  # epochs whose start is kept (those a recovery ended never close)
GROWTH = 2.0  # at most this factor up, and down, from one epoch to the next
CATCHUP_FACTOR = 4.0  # a stall's backlog is admitted for up to this many times the stall (a fifth of
# the capacity left over drains it in that time)
CATCHUP_MIN_PACES = 4  # and at least this many epochs' worth (a stall too short to measure)
STALL_PACES = 8.0  # no epoch end here for this many times the epochs' duration is a stall, not load
# (a batch twice too large runs twice as long; the sizing halves it)


@dataclass(frozen=True, slots=True)
class Decision:
    """What the next batch takes from the ingress buffer: ``admit`` new requests run, the next
    ``refuse`` new ones are refused (copies of known ones are answered as they come)."""

    admit: int
    refuse: int


class Admission:
    """The admission policy of one worker (module docstring). ``epoch_ms`` 0 turns it off (batches
    of ``epoch_size_max``, nothing refused); ``queue_ms`` 0 never refuses."""

    __slots__ = (
        "catchup_from",
        "catchup_over",
        "catchup_until",
        "epoch_ms",
        "epoch_size_max",
        "kept_up",
        "last_end",
        "queue_ms",
        "refused_total",
        "size",
        "started",
        "took_ms",
        "waiting_since",
    )

    def __init__(self, epoch_size_max: int, epoch_ms: float, queue_ms: float) -> None:
        self.epoch_size_max = epoch_size_max
        self.epoch_ms = epoch_ms
        self.queue_ms = queue_ms
        self.size = epoch_size_max  # the batch size now, rescheduled transactions included
        # epoch -> (taken at, batch, requests it refused, size then)
        self.started: dict[int, tuple[float, int, int, int]] = {}
        self.took_ms = 0.0  # how long recent epochs took here (a moving average)
        self.refused_total = 0  # records refused since the start (metrics)
        self.waiting_since: float | None = None  # since when buffered records wait for a batch
        self.catchup_until = 0.0  # nothing is refused before this (after a stall; 0: not catching up)
        self.catchup_over = False  # the buffer was over the cap during the catch-up
        self.catchup_from = 0.0  # when the last catch-up began (the epochs taken before are not measured)
        self.last_end: float | None = None  # when an epoch last ended here (or a catch-up began)
        self.kept_up = False  # the last batch took everything buffered

    @property
    def backlog_max(self) -> int:
        """How many records may stay buffered after a batch: ``queue_ms`` worth of batches, at the
        pace epochs run (``epoch_ms`` each, or longer when they took longer)."""
        return math.ceil(self.size * self.queue_ms / self.pace_ms)

    @property
    def pace_ms(self) -> float:
        return max(self.epoch_ms, self.took_ms)

    @property
    def depth_max(self) -> int:
        """How many rescheduled transactions may wait behind one root entity before new requests for
        it are refused: one of them runs per epoch, so a request that joins a queue ``n`` deep runs
        ``n + 1`` epochs later (after its own first one, as a request from the backlog waits for its
        epoch); it is admitted while those fit in ``queue_ms`` at the duration epochs took here lately.
        -1: none refused (off, unbounded, or catching up after a stall)."""
        if self.epoch_ms <= 0 or self.queue_ms <= 0 or self.catching_up:
            return -1
        return max(0, math.floor(self.queue_ms / self.measured_ms) - 1)

    @property
    def measured_ms(self) -> float:
        """How long epochs took here lately (``epoch_ms`` until one was measured): a light load runs
        epochs far shorter than ``epoch_ms``."""
        return self.took_ms if self.took_ms > 0 else self.epoch_ms

    @property
    def catching_up(self) -> bool:
        return self.catchup_until > 0

    def late(self, since: float | None, now: float) -> bool:
        """Whether ``since`` is :data:`STALL_PACES` times the measured epoch duration or more before
        ``now``."""
        return since is not None and (now - since) * 1000 >= STALL_PACES * self.measured_ms

    def stalled(self, now: float) -> bool:
        """No epoch ended here for :data:`STALL_PACES` epochs' durations while one runs or records
        wait that long (an idle worker has neither)."""
        if self.epoch_ms <= 0 or self.queue_ms <= 0 or self.catching_up or not self.late(self.last_end, now):
            return False
        return bool(self.started) or self.late(self.waiting_since, now)

    def arrived(self, now: float) -> None:
        """Records came into an empty buffer at ``now``."""
        if self.waiting_since is None:
            self.waiting_since = now

    def resumed(self, now: float) -> None:
        """A new generation takes its first batch here at ``now``: work through the stall's backlog
        (module docstring)."""
        self.started.clear()
        self.catch_up(now)

    def catch_up(self, now: float) -> None:
        """A stall ends at ``now``: work through its backlog (module docstring)."""
        self.last_end = self.catchup_from = now
        if self.epoch_ms <= 0 or self.queue_ms <= 0:
            return
        stall_s = 0.0 if self.waiting_since is None else max(0.0, now - self.waiting_since)
        bound_s = max(CATCHUP_MIN_PACES * self.pace_ms / 1000, CATCHUP_FACTOR * stall_s)
        self.catchup_until = now + bound_s
        self.catchup_over = False

    def decide(
        self, room: int, rescheduled: int, pending: int, now: float, fresh: Callable[[], int] | None = None
    ) -> Decision:
        """The next batch at ``now``, given the ``room`` the core leaves for new requests
        (``epoch_size_max`` less the ``rescheduled`` transactions it runs) and the ``pending`` records
        buffered, of which ``fresh()`` counts the new request ids (asked only when ``pending`` is past
        the cap; None: every record is new)."""
        if self.epoch_ms <= 0:
            return Decision(min(room, pending), 0)
        admit = min(room, max(0, self.size - rescheduled), pending)
        refuse = 0
        if self.queue_ms > 0:
            if fresh is not None and pending - admit > self.backlog_max:
                pending = fresh()  # the copies do not count (module docstring)
                admit = min(admit, pending)
            refuse = max(0, pending - admit - self.backlog_max)
            if self.catching_up:
                if now >= self.catchup_until or (self.catchup_over and pending <= admit):
                    self.catchup_until, self.catchup_over = 0.0, False  # worked through, or too long
                else:
                    self.catchup_over = self.catchup_over or refuse > 0
                    refuse = 0
        self.refused_total += refuse
        self.kept_up = pending <= admit + refuse
        self.waiting_since = None if self.kept_up else now
        return Decision(admit, refuse)

    def taken(self, epoch: int, now: float, batch: int, refused: int = 0) -> None:
        """``epoch``'s batch (``batch`` transactions, rescheduled ones included, and ``refused``
        requests) was formed at ``now``."""
        if self.epoch_ms <= 0:
            return
        self.started[epoch] = (now, batch, refused, self.size)
        if len(self.started) > MAX_TRACKED:
            del self.started[min(self.started)]

    def finished(self, epoch: int, now: float) -> None:
        """``epoch`` ended here at ``now``: adapt the size to how long it took."""
        start = self.started.pop(epoch, None)
        last_end, self.last_end = self.last_end, now
        if start is None:
            return  # a replayed epoch (its batch came from the log), or one taken before a restart
        taken_at, batch, refused, size = start
        if self.catching_up and taken_at < self.catchup_from:
            return  # taken before the stall ended: it measured the stall
        if not self.catching_up and self.late(max(taken_at, last_end or taken_at), now):
            self.catch_up(now)  # it ran through a stall (module docstring)
            return
        elapsed_ms = (now - taken_at) * 1000
        self.took_ms = elapsed_ms if self.took_ms == 0 else (self.took_ms + elapsed_ms) / 2
        if elapsed_ms > self.epoch_ms and refused > batch:
            pass  # the refusals took the time: a smaller batch would only refuse more
        elif elapsed_ms > self.epoch_ms and batch * GROWTH < size:
            pass  # a small batch that ran long: the epoch's fixed cost (a slow store, a loaded machine)
        elif elapsed_ms > self.epoch_ms:
            factor = max(1 / GROWTH, self.epoch_ms / elapsed_ms)
            shrunk = max(math.floor(batch * factor), math.floor(size / GROWTH))
            self.size = max(MIN_EPOCH_SIZE, min(self.size, shrunk))
        elif batch >= size:
            factor = GROWTH if elapsed_ms <= 0 else min(GROWTH, self.epoch_ms / elapsed_ms)
            self.size = max(self.size, math.ceil(batch * factor))
        self.size = max(min(MIN_EPOCH_SIZE, self.epoch_size_max), min(self.size, self.epoch_size_max))


class AdmissionGate:
    """The shell's side: answers the core's :class:`Take` with the records the policy admits and
    refuses, and tells the policy when each epoch ends. ``batch`` says which records are new requests
    (not copies of known ones)."""

    __slots__ = ("batch", "clock", "gen", "policy")

    def __init__(self, policy: Admission, clock: Clock, batch: BatchFormer) -> None:
        self.policy = policy
        self.clock = clock
        self.batch = batch
        self.gen = -1  # the generation of the last batch taken

    def take(self, e: Take, ingress: Ingress) -> Taken:
        now = self.clock.now()
        policy, batch = self.policy, self.batch
        if e.gen != self.gen:
            self.gen = e.gen
            policy.resumed(now)
        elif policy.stalled(now) or self.delivered_late(ingress, now):
            policy.catch_up(now)
        fresh = lambda: batch.count_new(ingress.buffered(), batch.in_flight())  # noqa: E731 (asked lazily)
        d = policy.decide(e.room, e.rescheduled, ingress.pending(), now, fresh)
        # Records until the batch holds ``admit + refuse`` new requests, or the buffer is empty.
        records: list[IngressRecord] = []
        running, new = batch.in_flight(), 0
        while new < d.admit + d.refuse and (chunk := ingress.take(d.admit + d.refuse - new)):
            records += chunk
            new += batch.count_new(chunk, running)
        admitted = min(d.admit, new)
        policy.taken(e.epoch, now, admitted + e.rescheduled, new - admitted)
        return Taken(e, records, admitted, policy.depth_max)

    def delivered_late(self, ingress: Ingress, now: float) -> bool:
        """Since a batch that took all of it, the buffer filled past what a batch and the cap hold
        with records written over :data:`STALL_PACES` epochs' durations and over twice as long as
        they took to come: the broker held them (a fetch that stalled: Tansu reading its log back
        from S3 after a restart), a stall upstream, not a load this worker cannot take. A burst that
        clients sent at once was written at once."""
        p = self.policy
        if not p.kept_up or p.catching_up or p.queue_ms <= 0 or p.epoch_ms <= 0:
            return False
        if ingress.pending() <= p.size + p.backlog_max:
            return False
        stamps = [rec.ts_ms for rec in ingress.buffered() if rec.ts_ms > 0]
        if not stamps or p.waiting_since is None:
            return False
        written_ms, came_ms = max(stamps) - min(stamps), (now - p.waiting_since) * 1000
        return written_ms >= max(STALL_PACES * p.measured_ms, 2 * came_ms)

    def arrived(self) -> None:
        """Records came into the empty ingress buffer."""
        self.policy.arrived(self.clock.now())

    def closed(self, epoch: int) -> None:
        self.policy.finished(epoch, self.clock.now())
