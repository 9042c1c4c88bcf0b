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
* **After a stall.** A recovery, a replaced worker or a partition move holds every epoch for a while
  (each ends in a new generation), and what arrived meanwhile is more than ``admission_queue_ms``
  worth: the cluster was paused, not overloaded. So from the first batch of a new generation the
  backlog is worked through: batches of the usual size, nothing refused, until the buffer, once over
  the cap, is drained (a batch takes all of it; clients that resent while the cluster was paused send
  their copies in waves, which a drain merely under the cap would refuse), or at the latest after
  :data:`CATCHUP_FACTOR` times the stall (how long the oldest buffered request had waited for a
  batch), at least :data:`CATCHUP_MIN_PACES` epochs' worth: an overload that coincides with a stall
  is still refused after that. The epochs taken before the stall are forgotten (a recovery ended
  them, and the new generation reuses their numbers).

The decisions read the clock, so they are not deterministic; like the batch itself they are written
to the sequencer log (``Refused`` entries, :mod:`styx_worker.batch`) before any reply leaves, and a
replay re-forms the batch from the log: the same requests are refused again, each answered once.

:class:`Admission` is pure (the caller passes the time); :class:`AdmissionGate` reads the worker's
clock and ingress.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from styx_py.core.ports import Clock, Ingress
from styx_worker.effects import Take, Taken

__all__ = ["CATCHUP_FACTOR", "CATCHUP_MIN_PACES", "MIN_EPOCH_SIZE", "Admission", "AdmissionGate", "Decision"]

MIN_EPOCH_SIZE = 8  # the smallest batch the sizing chooses (an epoch's fixed cost needs some work)
MAX_TRACKED = 64  # epochs whose start is kept (those a recovery ended never close)
GROWTH = 2.0  # at most this factor up, and down, from one epoch to the next
CATCHUP_FACTOR = 4.0  # a stall's backlog is admitted for up to this many times the stall (a fifth of
# the capacity left over drains it in that time)
CATCHUP_MIN_PACES = 4  # and at least this many epochs' worth (a stall too short to measure)


@dataclass(frozen=True, slots=True)
class Decision:
    """What the next batch takes from the ingress buffer: the first ``admit`` records run, the next
    ``refuse`` are refused."""

    admit: int
    refuse: int


class Admission:
    """The admission policy of one worker (module docstring). ``epoch_ms`` 0 turns it off (batches
    of ``epoch_size_max``, nothing refused); ``queue_ms`` 0 never refuses."""

    __slots__ = (
        "catchup_over",
        "catchup_until",
        "epoch_ms",
        "epoch_size_max",
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

    @property
    def backlog_max(self) -> int:
        """How many records may stay buffered after a batch: ``queue_ms`` worth of batches, at the
        pace epochs run (``epoch_ms`` each, or longer when they took longer)."""
        return math.ceil(self.size * self.queue_ms / self.pace_ms)

    @property
    def pace_ms(self) -> float:
        return max(self.epoch_ms, self.took_ms)

    @property
    def catching_up(self) -> bool:
        return self.catchup_until > 0

    def arrived(self, now: float) -> None:
        """Records came into an empty buffer at ``now``."""
        if self.waiting_since is None:
            self.waiting_since = now

    def resumed(self, now: float) -> None:
        """A new generation takes its first batch here at ``now``: work through the stall's backlog
        (module docstring)."""
        self.started.clear()
        if self.epoch_ms <= 0 or self.queue_ms <= 0:
            return
        stall_s = 0.0 if self.waiting_since is None else max(0.0, now - self.waiting_since)
        bound_s = max(CATCHUP_MIN_PACES * self.pace_ms / 1000, CATCHUP_FACTOR * stall_s)
        self.catchup_until = now + bound_s
        self.catchup_over = False

    def decide(self, room: int, rescheduled: int, pending: int, now: float) -> Decision:
        """The next batch at ``now``, given the ``room`` the core leaves for new requests
        (``epoch_size_max`` less the ``rescheduled`` transactions it runs) and the ``pending`` records
        buffered."""
        if self.epoch_ms <= 0:
            return Decision(min(room, pending), 0)
        admit = min(room, max(0, self.size - rescheduled), pending)
        refuse = 0
        if self.queue_ms > 0:
            refuse = max(0, pending - admit - self.backlog_max)
            if self.catching_up:
                if now >= self.catchup_until or (self.catchup_over and pending <= admit):
                    self.catchup_until, self.catchup_over = 0.0, False  # worked through, or too long
                else:
                    self.catchup_over = self.catchup_over or refuse > 0
                    refuse = 0
        self.refused_total += refuse
        self.waiting_since = now if pending > admit + refuse else None
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
        if start is None:
            return  # a replayed epoch (its batch came from the log), or one taken before a restart
        taken_at, batch, refused, size = start
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
    refuses, and tells the policy when each epoch ends."""

    __slots__ = ("clock", "gen", "policy")

    def __init__(self, policy: Admission, clock: Clock) -> None:
        self.policy = policy
        self.clock = clock
        self.gen = -1  # the generation of the last batch taken

    def take(self, e: Take, ingress: Ingress) -> Taken:
        now = self.clock.now()
        if e.gen != self.gen:
            self.gen = e.gen
            self.policy.resumed(now)
        d = self.policy.decide(e.room, e.rescheduled, ingress.pending(), now)
        n = d.admit + d.refuse
        records = ingress.take(n) if n else []
        admitted = min(d.admit, len(records))
        self.policy.taken(e.epoch, now, admitted + e.rescheduled, len(records) - admitted)
        return Taken(e, records, admitted)

    def arrived(self) -> None:
        """Records came into the empty ingress buffer."""
        self.policy.arrived(self.clock.now())

    def closed(self, epoch: int) -> None:
        self.policy.finished(epoch, self.clock.now())
