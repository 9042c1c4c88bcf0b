"""Reconfiguration: a worker's part of a recovery (a full restore from S3 and the logs) or of a planned
shape change (partitions moved straight between workers).

The coordinator sends :class:`~styx_py.core.wire.Recover` for a new generation; :meth:`Reconfiguration.
recover` runs as a task of the worker: everything in flight is cancelled and forgotten, the core starts
the generation (:meth:`~styx_worker.core.WorkerCore.apply_view`), then either

* **keeps** its state (a shape change at a barrier, ``Recover.keep``): the partitions it still owns stay
  as they are, the ones that moved away are dropped, the ones gained are installed from the old owners'
  handoff pieces (:mod:`styx_worker.handoff`); nothing is replayed; or
* **restores** the last complete snapshot and the sequencer log (:mod:`styx_worker.recovery`); the
  coordinator then replays the logged epochs and continues live.

It ends with :class:`~styx_py.core.wire.RecoverDone`. Only operating errors (:data:`RECOVERY_ERRORS`: a
store or the broker unreachable, a piece that never came, code that cannot be loaded, a stored object
that does not decode) are reported as a failed recovery, which the coordinator retries; anything else is
a bug and ends the worker process (its supervisor restarts it, and the failure is in its log).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from styx_py.core.errors import GraphError
from styx_py.core.ports import Clock, Egress, Ingress, LogReader
from styx_py.core.wire import Message, Recover, RecoverDone
from styx_worker import recovery
from styx_worker.core import WorkerCore
from styx_worker.effects import Effect
from styx_worker.handoff import HandoffRefused, Pieces
from styx_worker.versions import CodeVersions

if TYPE_CHECKING:
    from styx_py.core.blobs import BlobStore

__all__ = ["RECOVERY_ERRORS", "Reconfiguration"]

log = logging.getLogger("styx.worker")

RECOVERY_ERRORS = (
    HandoffRefused,
    GraphError,
    OSError,  # the blob store and the log reader (their ports raise BackendError, an OSError)
    TimeoutError,
    msgspec.DecodeError,  # a stored snapshot object or log entry that is not what it should be
    msgspec.ValidationError,
)
"""What a recovery may fail with and be retried by the coordinator; anything else ends the worker."""


class Reconfiguration:
    """A worker's recoveries and partition moves; ``apply`` carries out the core's effects, ``send`` sends
    to the coordinator, ``cancel_inflight`` stops every invocation and upload of the worker."""

    def __init__(
        self,
        core: WorkerCore,
        versions: CodeVersions,
        ports: tuple[Ingress, Egress, LogReader | None, BlobStore | None, Clock],
        failure_timeout_s: float,
        replies_per_partition: int,
        hooks: tuple[Callable[[list[Effect]], None], Callable[[Message], None], Callable[[], None]],
        observe: Callable[[bool, float], None],
    ) -> None:
        self.core = core
        self.versions = versions
        self.ingress, self.egress, self.logs, self.blobs, self.clock = ports
        self.wait_s = failure_timeout_s
        self.replies_per_partition = replies_per_partition
        self.apply, self.send, self.cancel_inflight = hooks
        self.observe = observe  # (ok, seconds): the worker's metrics
        self.pieces = Pieces()  # partitions handed to this worker at a planned change
        self.task: asyncio.Task[None] | None = None  # the recovery running, or the last one

    def start(self, tasks: asyncio.TaskGroup, msg: Recover) -> None:
        """Run the recovery ``msg`` asks for, instead of one still running."""
        if self.task is not None:
            self.task.cancel()
        self.task = tasks.create_task(self.recover(msg))

    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    async def recover(self, msg: Recover) -> None:
        """Roll back to the last complete snapshot and prepare to replay the logged epochs, or move the
        partitions of a shape change (module docstring)."""
        core = self.core
        if core.view is None or core.view.gen != msg.gen:
            return  # a newer generation's view came since the Recover: its own Recover follows
        self.cancel_inflight()
        keep, owned_before = core.begin_recovery(msg)
        self.ingress.live(msg.segment)  # a fresh process would start at segment 0
        self.egress.live(msg.segment)
        self.apply(core.flush())  # the view's: read these partitions, load this code
        started = time.perf_counter()
        core.recovering = True
        try:
            if keep:
                await self._move_partitions(msg, owned_before)
            elif msg.keep:
                at = core.epochs.completed_epoch
                raise HandoffRefused(
                    f"cannot keep: this worker's state is of epoch {at}, not {msg.replay_until}"
                )
            else:
                await self._restore(msg)
        except RECOVERY_ERRORS as exc:
            log.error("%s: recovery to generation %d failed: %s", core.node_id, msg.gen, exc)
            self.observe(False, time.perf_counter() - started)
            self.send(RecoverDone(core.node_id, False, f"{type(exc).__name__}: {exc}", msg.gen))
            return
        finally:
            core.recovering = False
        core.consistent = True  # no restore left the state half-done
        self.observe(True, time.perf_counter() - started)
        self.send(RecoverDone(core.node_id, True, "", msg.gen))

    async def _move_partitions(self, msg: Recover, owned_before: set[int]) -> None:
        """Keep the partitions still owned as they are; drop the ones moved away; take the ones gained
        from their old owners' handoffs (nothing is replayed: every worker is at the last epoch)."""
        core = self.core
        owned = set(core.table.owned())
        gone, gained = owned_before - owned, sorted(owned - owned_before)
        # Each old owner sent its pieces when it saw the view, before it answered Fenced: they are
        # here or on their way. One that never comes (its sender died, or the link broke) fails this
        # recovery after a failure timeout, and a full one follows.
        try:
            async with self.clock.timeout(self.wait_s):
                moved = await self.pieces.take(msg.gen, gained, msg.replay_until)
        except TimeoutError:
            raise HandoffRefused(
                f"partitions {gained} not all handed over within {self.wait_s:.1f}s"
            ) from None
        self.pieces.forget_before(msg.gen + 1)
        for piece in moved.values():
            self.egress.reset_offsets(piece.last.egress_offsets)
        self.ingress.seek(core.install_moved(msg, gone, moved))
        log.warning(
            "%s: partitions moved: kept %s, gave %s, took %s",
            core.node_id,
            sorted(owned & owned_before),
            sorted(gone),
            gained,
        )

    async def _restore(self, msg: Recover) -> None:
        core = self.core
        assert self.logs is not None, "recovery needs a log reader"
        r = await recovery.restore(
            msg, core.table.owned(), core.node_id, self.blobs, self.logs, self.replies_per_partition
        )
        self.pieces.forget_before(msg.gen + 1)
        self.versions.for_replay(r.replay, core.versions)
        core.install_restored(msg, r)
        self.ingress.seek(r.positions)
        self.egress.reset_offsets(r.egress_offsets)
        # Replies the previous generation queued may still be on their way to the log: wait for them,
        # or replay would not find them there and would send them a second time.
        await self.egress.flush()
        # The same for changelog records; then where each partition's changelog ends: the replay
        # appends only what comes after it (styx_worker.changelog).
        if (changelog := core.epochs.changelog).enabled:
            changelog.restored(await self.logs.changelog_tail(core.table.owned()))
        if msg.replay_until > msg.manifest.epoch:  # replies of epochs to replay may be on the log
            logs = self.logs
            core.replies.on_log = await recovery.replies_on_log(logs, r.egress_offsets, msg.manifest.epoch)
