"""Starting invocations without a task each: run to their first suspension, then become a task.

Most invocations never wait for anything: ``get``, ``put`` and ``call_async`` complete without
suspending, so the whole function runs in one step. Giving each of them an ``asyncio.Task`` cost a
Task, a loop callback to start it, a done callback and the task group's bookkeeping: ~15 % of a
worker's busy time on YCSB-T (py-spy, 2 workers at 1 500/s). The :class:`InvocationRunner` instead
queues the invocations started in a loop tick and runs them from one loop callback, each to its
end or to its first real suspension (a synchronous call's result, a fallback lock); only an
invocation that suspends becomes a task, a child of the worker's task group like every task.

Nothing about the order in which invocations run changes what they compute (every epoch's outcome is
a function of the tids, not of the schedule, DESIGN.md §3), and the order stays the same FIFO the
tasks' first steps had. User code still starts at a constant stack depth (the loop's callback, never
nested inside another invocation: an invocation started by another one is queued, and the queue is
drained iteratively), so a function's recursion limit, and so its result, does not depend on where
it was called from; a suspended invocation resumes from its task at another constant depth.

An invocation that raises (a bug: :func:`~styx_worker.executor.run_invocation` catches everything
user code does) is re-raised inside a task of the group, so the process ends exactly as when the
invocation was a task; the invocations still queued are dropped, as the task group's cancellation
would have dropped their tasks.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from styx_py.core.wire import Invoke
from styx_worker.txn import CachedInvocation, EpochState

Spawn = Callable[[Coroutine[Any, Any, None]], None]
Run = tuple[EpochState, Invoke, CachedInvocation | None]
RunFunction = Callable[[EpochState, Invoke, CachedInvocation | None], Coroutine[Any, Any, None]]


class InvocationRunner:
    """``run(es, inv, cached)`` makes an invocation's coroutine (the executor's ``run_invocation``
    bound to its host); ``spawn`` makes a task of the worker's task group."""

    def __init__(self, run: RunFunction, spawn: Spawn) -> None:
        self.run = run
        self.spawn = spawn
        self.ready: deque[Run] = deque()
        self.scheduled = False
        self.closed = False

    def start(self, es: EpochState, inv: Invoke, cached: CachedInvocation | None) -> None:
        """Run ``inv`` soon (in a later loop callback, as a new task's first step would)."""
        if self.closed:
            return  # the worker stopped: its task would have been cancelled before it ran
        self.ready.append((es, inv, cached))
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    def clear(self) -> None:
        """Recovery or a halt: invocations that have not started never will."""
        self.ready.clear()

    def close(self) -> None:
        """The worker's task group is ending: nothing queued or started later runs."""
        self.closed = True
        self.ready.clear()

    def _drain(self) -> None:
        ready, run = self.ready, self.run
        try:
            while ready:
                coro = run(*ready.popleft())
                try:
                    waiting_for = coro.send(None)
                except StopIteration:
                    continue  # the common case: done in one step, no task
                except BaseException as exc:  # noqa: BLE001 - not swallowed: re-raised in the task group
                    self.ready.clear()
                    self._spawn(_raise(exc))
                    return
                self._spawn(_resume(coro, waiting_for), coro)
        finally:
            self.scheduled = False

    def _spawn(self, task_body: Coroutine[Any, Any, None], *started: Coroutine[Any, Any, None]) -> None:
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


async def _resume(coro: Coroutine[Any, Any, None], waiting_for: Any) -> None:
    """The rest of a coroutine that already ran to its first suspension, as a task's body."""
    await _Suspended(coro, waiting_for)


class _Suspended:
    """Awaiting it hands ``coro``'s pending future to the task, then relays every resumption.

    What ``yield from coro`` would do, starting after ``coro``'s first yield: the task sees the
    same future (with its ``_asyncio_future_blocking`` flag set by the future's own ``__await__``)
    and its sends, throws (a cancellation) and close reach ``coro`` unchanged.
    """

    __slots__ = ("coro", "waiting_for")

    def __init__(self, coro: Coroutine[Any, Any, None], waiting_for: Any) -> None:
        self.coro = coro
        self.waiting_for = waiting_for

    def __await__(self) -> Generator[Any, Any, None]:
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
                except StopIteration:
                    return
            else:
                try:
                    waiting_for = coro.send(sent)
                except StopIteration:
                    return
