"""The running client: what connects the core (:mod:`.core`) to the transport (:mod:`.transport`).

:class:`Shell` exists once a :class:`~styx_client.sdk.StyxClient` has started. It feeds every transport
event to the core (it is the transport's :class:`~styx_client.sdk.transport.TransportEvents`), carries
out what the core returns (produce, write again, push, ask for the workers), and runs the client's two
loops of its own, both children of the client's task group: the look for a newer ingress segment every
``segment_poll_s``, and the deadline sweep (the core's ``wake_at``). Time is the event loop's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math

from styx_client.sdk.core import ClientCore
from styx_client.sdk.entry import Pending, Waiter
from styx_client.sdk.transport import ClientTransport
from styx_py.core.errors import StyxError
from styx_py.core.segments import LIVE
from styx_py.core.wire import Reply

__all__ = ["Caller", "Shell"]

log = logging.getLogger("styx.client")


class Shell:
    """One started client's I/O side (module docstring)."""

    __slots__ = ("_wake", "core", "loop", "name", "reply_partition", "segment_poll_s", "transport")

    def __init__(
        self, core: ClientCore, transport: ClientTransport, segment_poll_s: float, name: str
    ) -> None:
        self.core = core
        self.transport = transport
        self.reply_partition = -1  # the egress partition read (-1: every one), once the transport opened
        self.segment_poll_s = segment_poll_s
        self.name = name
        self.loop = asyncio.get_running_loop()
        self._wake: asyncio.Future[None] | None = None  # set to wake the deadline sweep early

    def start(self, group: asyncio.TaskGroup) -> None:
        self.transport.start(group)
        group.create_task(self._follow_segments(), name=f"{self.name}-segments")
        group.create_task(self._sweep(), name=f"{self.name}-deadlines")

    # ---- requests ------------------------------------------------------------------------------------

    def produce(self, entry: Pending) -> None:
        """Queue ``entry``'s record for its partition's next batch, in the newest segment known."""
        entry.stamp = self.transport.produce(
            entry.segment, entry.partition, entry.rid.encode(), entry.fingerprint, entry
        )

    def deadline_added(self, deadline: float) -> None:
        """A waiter with ``deadline`` was added: wake the sweep if that is now the earliest."""
        if deadline <= self.core.wake_at:
            wake = self._wake
            if wake is not None and not wake.done():
                wake.set_result(None)

    # ---- what the transport tells ----------------------------------------------------------------------

    def acknowledged(self, entry: Pending, segment: int, offset: int) -> None:
        if self.core.acknowledged(entry, segment, offset, self.loop.time()):
            self.transport.push_request(entry, segment, offset)

    def undelivered(self, entry: Pending, exc: BaseException, unavailable: bool) -> None:
        self.core.undelivered(entry, exc, unavailable)

    def from_log(self, key: bytes | None, value: bytes | None) -> None:
        transport = self.transport
        if self.core.from_log(key, value, transport.pushes_healthy):
            # Every worker this client knows pushes to it, and still this reply came through the log
            # only: its request's partition may belong to a worker that joined since the client last
            # asked (styx_client.sdk.push). Asking now ends that sooner than the next regular look.
            transport.ask_workers_soon()

    def pushed(self, reply: Reply) -> None:
        self.core.pushed(reply)

    def marks(self, ends: list[tuple[int, int]]) -> None:
        self.core.marks(ends, self.loop.time())

    # ---- the loops -------------------------------------------------------------------------------------

    async def _follow_segments(self) -> None:
        """Write to the newest ingress segment (core module docstring), looking for a newer one every
        ``segment_poll_s``."""
        core, transport = self.core, self.transport
        while True:
            await asyncio.sleep(self.segment_poll_s)
            asked = self.loop.time()
            newest = await transport.newest_segment(core.segment)
            if newest is None:
                continue  # not asked: nothing learnt, not even that the known one is still the newest
            moved = newest > core.segment
            if moved and not await transport.follow_egress(newest):
                continue
            again = core.segment_seen(newest, asked)
            if again:
                log.info("%s: writing %d requests again to ingress segment %d", self.name, len(again), newest)
            for entry in again:
                self.produce(entry)
            if moved:
                # Write (and ask the broker about) the newest segments only: earlier ones are dropped
                # from the producer once nothing of theirs is in flight.
                transport.retire({s for s in range(newest - LIVE + 1, newest + 1) if s >= 0})

    async def _sweep(self) -> None:
        """Time out the waiters due, at the core's ``wake_at``, or sooner when woken."""
        core, loop = self.core, self.loop
        while True:
            wake = self._wake = loop.create_future()
            at = core.wake_at
            if at == math.inf:
                await wake
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(at):
                        await wake
            core.tick(loop.time())


class Caller:
    """One :meth:`StyxClient.submit_future` caller: the ``done`` of its waiter, which settles its future,
    and its future's done callback, which only does anything when the caller cancelled the future."""

    __slots__ = ("core", "future", "waiter")

    def __init__(self, core: ClientCore, future: asyncio.Future[Reply]) -> None:
        self.core = core
        self.future = future
        self.waiter: Waiter | None = None

    def __call__(self, reply: Reply | None, error: StyxError | None) -> None:
        future = self.future
        future.remove_done_callback(self.cancelled)
        if future.done():
            return  # cancelled, its callback not run yet: the core counted it out already
        if error is None:
            future.set_result(reply)  # type: ignore[arg-type]
        else:
            future.set_exception(error)

    def cancelled(self, _: asyncio.Future[Reply]) -> None:
        if self.waiter is not None:
            self.core.give_up(self.waiter)
