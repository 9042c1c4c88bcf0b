"""Invocations without a task each (worker.runner): run to the first suspension, then a task."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import msgspec
import pytest

from styx_py.core.wire import Invoke, Phase, Status, encode_value
from styx_worker.effects import Called, Deliver, Invoked, Run
from styx_worker.executor import Calls
from styx_worker.runner import InvocationRunner
from styx_worker.txn import CachedInvocation, TxnView

VIEW: TxnView = None  # type: ignore[assignment]  # the stand-in runs below read nothing


def invoke(tid: int) -> Invoke:
    raw = msgspec.Raw(encode_value([]))
    return Invoke(1, tid, Phase.OPTIMISTIC, [], "w1", "w1", "op", "f", "k", raw, 1, 1, False, 0, 0)


class Group:
    """Collects spawned coroutines as tasks of a real task group."""

    def __init__(self, tg: asyncio.TaskGroup) -> None:
        self.tg = tg
        self.tasks: list[asyncio.Task[None]] = []

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(self.tg.create_task(coro))


def _done(ev: Invoked) -> None:
    pass


def _dispatch(ev: Called) -> None:
    pass


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_one_step_invocations_need_no_task_and_keep_fifo_order() -> None:
    order: list[int] = []

    async def run(view: TxnView, calls: Calls, inv: Invoke, cached: CachedInvocation | None) -> Any:
        order.append(inv.tid)
        if inv.tid < 3:
            runner.start(Run(invoke(inv.tid + 10), None, VIEW))  # started by a running invocation: queued

    async with asyncio.TaskGroup() as tg:
        group = Group(tg)
        runner = InvocationRunner(_done, _dispatch, group.spawn, run=run)
        for tid in (1, 2, 3):
            runner.start(Run(invoke(tid), None, VIEW))
        assert order == [], "nothing runs inside start()"
        await settle()
    assert order == [1, 2, 3, 11, 12]
    assert group.tasks == []


async def test_a_suspended_invocation_becomes_a_task_and_resumes_with_the_value() -> None:
    loop = asyncio.get_running_loop()
    slot: asyncio.Future[str] = loop.create_future()
    got: list[str] = []

    async def run(view: TxnView, calls: Calls, inv: Invoke, cached: CachedInvocation | None) -> Any:
        got.append("before")
        got.append(await slot)
        got.append(await asyncio.sleep(0, "after a bare yield"))

    async with asyncio.TaskGroup() as tg:
        group = Group(tg)
        runner = InvocationRunner(_done, _dispatch, group.spawn, run=run)
        runner.start(Run(invoke(1), None, VIEW))
        await settle()
        assert got == ["before"] and len(group.tasks) == 1 and not group.tasks[0].done()
        slot.set_result("result")
        await settle()
    assert got == ["before", "result", "after a bare yield"]


async def test_cancelling_the_task_reaches_the_invocation() -> None:
    loop = asyncio.get_running_loop()
    slot: asyncio.Future[None] = loop.create_future()
    seen: list[str] = []

    async def run(view: TxnView, calls: Calls, inv: Invoke, cached: CachedInvocation | None) -> Any:
        try:
            await slot
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async with asyncio.TaskGroup() as tg:
        group = Group(tg)
        runner = InvocationRunner(_done, _dispatch, group.spawn, run=run)
        runner.start(Run(invoke(1), None, VIEW))
        await settle()
        group.tasks[0].cancel()
        await settle()
    assert seen == ["cancelled"] and slot.cancelled() and group.tasks[0].cancelled()


async def test_an_exception_thrown_in_is_relayed_and_can_be_handled() -> None:
    loop = asyncio.get_running_loop()
    slot: asyncio.Future[None] = loop.create_future()
    seen: list[str] = []

    async def run(view: TxnView, calls: Calls, inv: Invoke, cached: CachedInvocation | None) -> Any:
        try:
            await slot
        except KeyError as exc:
            seen.append(f"handled {exc}")

    async with asyncio.TaskGroup() as tg:
        group = Group(tg)
        runner = InvocationRunner(_done, _dispatch, group.spawn, run=run)
        runner.start(Run(invoke(1), None, VIEW))
        await settle()
        slot.set_exception(KeyError("x"))
        await settle()
    assert seen == ["handled 'x'"]


async def test_a_raising_invocation_ends_the_group_and_drops_the_queue() -> None:
    ran: list[int] = []

    async def run(view: TxnView, calls: Calls, inv: Invoke, cached: CachedInvocation | None) -> Any:
        ran.append(inv.tid)
        if inv.tid == 2:
            raise AssertionError("a bug")

    with pytest.raises(ExceptionGroup) as caught:
        async with asyncio.TaskGroup() as tg:
            group = Group(tg)
            runner = InvocationRunner(_done, _dispatch, group.spawn, run=run)
            for tid in (1, 2, 3):
                runner.start(Run(invoke(tid), None, VIEW))
            await asyncio.Future()  # until the group is cancelled by the failure
    assert caught.group_contains(AssertionError, match="a bug")
    assert ran == [1, 2], "what was queued behind the failure never runs"


async def test_clear_drops_what_has_not_started() -> None:
    ran: list[int] = []

    async def run(view: TxnView, calls: Calls, inv: Invoke, cached: CachedInvocation | None) -> Any:
        ran.append(inv.tid)

    async with asyncio.TaskGroup() as tg:
        runner = InvocationRunner(_done, _dispatch, Group(tg).spawn, run=run)
        runner.start(Run(invoke(1), None, VIEW))
        runner.clear()
        await settle()
        runner.start(Run(invoke(2), None, VIEW))
        await settle()
    assert ran == [2]


async def test_a_closed_runner_runs_nothing_and_a_refused_spawn_leaves_no_unawaited_coroutine() -> None:
    loop = asyncio.get_running_loop()
    slot: asyncio.Future[None] = loop.create_future()
    ran: list[int] = []

    async def run(view: TxnView, calls: Calls, inv: Invoke, cached: CachedInvocation | None) -> Any:
        ran.append(inv.tid)
        await slot

    def refuse(coro: Coroutine[Any, Any, None]) -> None:
        raise RuntimeError("the task group is shutting down")

    runner = InvocationRunner(_done, _dispatch, refuse, run=run)
    runner.start(Run(invoke(1), None, VIEW))
    runner.start(Run(invoke(2), None, VIEW))
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert ran == [1], "after the refusal the runner is closed"
    assert [type(e["exception"]) for e in errors] == [RuntimeError], "not swallowed"
    assert runner.closed
    runner.start(Run(invoke(3), None, VIEW))
    await asyncio.sleep(0)
    assert ran == [1]


async def test_a_synchronous_call_waits_for_its_result_and_the_end_goes_to_done() -> None:
    """The runner is the executor's Calls: a call dispatches its child and waits for the Deliver of its
    slot; the invocation's end (its Invoked) goes to ``done``; a slot still open when its epoch is
    forgotten is cancelled, so no invocation waits forever."""
    ended: list[Any] = []
    dispatched: list[Called] = []

    async def run(view: TxnView, calls: Calls, inv: Invoke, cached: CachedInvocation | None) -> Any:
        child = invoke(inv.tid)
        child.path = [0]
        status, value = await calls.call(child, True)
        return (inv.tid, status, bytes(value))

    async with asyncio.TaskGroup() as tg:
        runner = InvocationRunner(ended.append, dispatched.append, Group(tg).spawn, run=run)
        runner.start(Run(invoke(1), None, VIEW))
        runner.start(Run(invoke(2), None, VIEW))
        await settle()
        assert [d.child.tid for d in dispatched] == [1, 2] and ended == []
        runner.deliver(Deliver(1, (Phase.OPTIMISTIC, 1, (0,)), Status.OK, msgspec.Raw(b"\x01")))
        await settle()
        assert ended == [(1, Status.OK, b"\x01")]
        runner.forget(1)  # the epoch is over: tid 2's call never comes back
        await settle()
    assert ended == [(1, Status.OK, b"\x01")]
