"""Running invocations for the shell: no task each unless they wait, and their synchronous calls' slots.

Most invocations never wait for anything: ``get``, ``put`` and ``call_async`` complete without
suspending, so the whole function runs in one step. Giving each of them an ``asyncio.Task`` cost a
Task, a loop callback to start it, a done callback and the task group's bookkeeping: ~15 % of a
worker's busy time on YCSB-T (py-spy, 2 workers at 1 500/s). The :class:`InvocationRunner` instead
queues the invocations started in a loop tick and runs them from one loop callback, each to its end or
to its first real suspension (a synchronous call's result); only an invocation that suspends becomes a
task, a child of the worker's task group like every task. Each one's end goes to ``done`` (the shell
steps the core with it).

Nothing about the order in which invocations run changes what they compute (every epoch's outcome is a
function of the tids, not of the schedule, DESIGN.md §3), and the order stays the same FIFO the tasks'
first steps had. User code always starts at the same stack depth (this loop callback, never nested
inside another invocation: an invocation started by another one is queued, and the queue is drained
iteratively), so a function's recursion limit, and so its result, does not depend on where it was
called from; a suspended invocation resumes from its task at another constant depth.

An invocation that raises (a bug: :func:`~styx_worker.executor.run_invocation` catches everything user
code does) is re-raised inside a task of the group, so the worker process ends; the invocations still
queued are dropped, as the task group's cancellation would drop their tasks.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from styx_py.core.wire import Invoke
from styx_worker.effects import Called, Deliver, Invoked, Run, SlotKey
from styx_worker.executor import CallOutcome, Calls, run_invocation
from styx_worker.txn import CachedInvocation, TxnView

__all__ = ["InvocationRunner"]

Spawn = Callable[[Coroutine[Any, Any, None]], None]
RunFunction = Callable[[TxnView, Calls, Invoke, CachedInvocation | None], Coroutine[Any, Any, Invoked]]


class InvocationRunner:
    """Runs :class:`~styx_worker.effects.Run` effects; ``done`` gets each invocation's
    :class:`~styx_worker.effects.Invoked`, ``dispatch`` each synchronous call (a :class:`Called`);
    ``spawn`` makes a task of the worker's task group. Also the executor's
    :class:`~styx_worker.executor.Calls`."""

    __slots__ = ("closed", "dispatch", "done", "ready", "run", "scheduled", "slots", "spawn")

    def __init__(
        self,
        done: Callable[[Invoked], None],
        dispatch: Callable[[Called], None],
        spawn: Spawn,
        run: RunFunction = run_invocation,
    ) -> None:
        self.run = run  # the executor's run_invocation (a stand-in in the runner's own tests)
        self.done = done
        self.dispatch = dispatch
        self.spawn = spawn
        self.ready: deque[Run] = deque()
        self.scheduled = False
        self.closed = False
        # Per epoch, the futures of synchronous calls' results, made by whichever comes first: the
        # waiting caller or the result (a cached callee's may come before its caller asks).
        self.slots: dict[int, dict[SlotKey, asyncio.Future[CallOutcome]]] = {}

    # ---- Calls (what an invocation's synchronous calls use) ------------------------------------------
    def call(self, child: Invoke, dispatch: bool) -> asyncio.Future[CallOutcome]:
        slot = self._slot(child.epoch, (child.phase, child.tid, tuple(child.path)))
        if dispatch:
            self.dispatch(Called(child))
        return slot

    def deliver(self, d: Deliver) -> None:
        slot = self._slot(d.epoch, d.key)
        if not slot.done():
            slot.set_result((d.status, d.value))

    def forget(self, epoch: int) -> None:
        """``epoch`` is over here: a result nobody waited for (an unneeded cached call's) goes too, and
        so does an invocation still waiting for one (none should be: it would never end)."""
        for slot in self.slots.pop(epoch, {}).values():
            slot.cancel()

    def _slot(self, epoch: int, key: SlotKey) -> asyncio.Future[CallOutcome]:
        slots = self.slots.get(epoch)
        if slots is None:
            slots = self.slots[epoch] = {}
        fut = slots.get(key)
        if fut is None:
            fut = slots[key] = asyncio.get_running_loop().create_future()
        return fut

    # ---- running -------------------------------------------------------------------------------------
    def start(self, run: Run) -> None:
        """Run ``run.inv`` soon (in a later loop callback, as a new task's first step would)."""
        if self.closed:
            return  # the worker stopped: its task would have been cancelled before it ran
        self.ready.append(run)
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    def clear(self) -> None:
        """Recovery or a halt: invocations that have not started never will; no result is awaited."""
        self.ready.clear()
        self.slots.clear()

    def close(self) -> None:
        """The worker's task group is ending: nothing queued or started later runs."""
        self.closed = True
        self.clear()

    def _drain(self) -> None:
        ready, done, invocation = self.ready, self.done, self.run
        try:
            while ready:
                run = ready.popleft()
                coro = invocation(run.view, self, run.inv, run.cached)
                try:
                    waiting_for = coro.send(None)
                except StopIteration as stop:
                    done(stop.value)  # the common case: done in one step, no task
                    continue
                self._spawn(self._resume(coro, waiting_for), coro)
        except BaseException as exc:  # noqa: BLE001 - not swallowed: re-raised in the task group
            self.ready.clear()
            self._spawn(_raise(exc))
        finally:
            self.scheduled = False

    async def _resume(self, coro: Coroutine[Any, Any, Invoked], waiting_for: Any) -> None:
        """The rest of an invocation that already ran to its first suspension, as a task's body."""
        self.done(await _Suspended(coro, waiting_for))

    def _spawn(self, task_body: Coroutine[Any, Any, None], *started: Coroutine[Any, Any, Any]) -> None:
        try:
            self.spawn(task_body)
        except BaseException:
            # The task group is already shutting down (it refuses new tasks): like the tasks it
            # cancels, nothing more runs here. Closed, the coroutines raise no "never awaited".
            task_body.close()
            for coro in started:
                coro.close()
            self.close()
            raise


async def _raise(exc: BaseException) -> None:
    raise exc


class _Suspended:
    """Awaiting it hands ``coro``'s pending future to the task, then relays every resumption, and gives
    ``coro``'s return value.

    What ``yield from coro`` would do, starting after ``coro``'s first yield: the task sees the
    same future (with its ``_asyncio_future_blocking`` flag set by the future's own ``__await__``)
    and its sends, throws (a cancellation) and close reach ``coro`` unchanged.
    """

    __slots__ = ("coro", "waiting_for")

    def __init__(self, coro: Coroutine[Any, Any, Invoked], waiting_for: Any) -> None:
        self.coro = coro
        self.waiting_for = waiting_for

    def __await__(self) -> Generator[Any, Any, Invoked]:
        coro, waiting_for = self.coro, self.waiting_for
        while True:
            try:
                sent = yield waiting_for
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - relayed to the coroutine, as yield from does
                try:
                    waiting_for = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
            else:
                try:
                    waiting_for = coro.send(sent)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
