"""Invocations without a task each (worker.runner): run to the first suspension, then a task."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import msgspec
import pytest

from styx_py.core.wire import Invoke, Phase, encode_value
from styx_worker.runner import InvocationRunner
from styx_worker.txn import CachedInvocation, EpochState


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


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_one_step_invocations_need_no_task_and_keep_fifo_order() -> None:
    order: list[int] = []
    es = EpochState(1, 0)

    async def run(es: EpochState, inv: Invoke, cached: CachedInvocation | None) -> None:
        order.append(inv.tid)
        if inv.tid < 3:
            runner.start(es, invoke(inv.tid + 10), None)  # started by a running invocation: queued

    async with asyncio.TaskGroup() as tg:
        group = Group(tg)
        runner = InvocationRunner(run, group.spawn)
        for tid in (1, 2, 3):
            runner.start(es, invoke(tid), None)
        assert order == [], "nothing runs inside start()"
        await settle()
    assert order == [1, 2, 3, 11, 12]
    assert group.tasks == []


async def test_a_suspended_invocation_becomes_a_task_and_resumes_with_the_value() -> None:
    loop = asyncio.get_running_loop()
    slot: asyncio.Future[str] = loop.create_future()
    got: list[str] = []

    async def run(es: EpochState, inv: Invoke, cached: CachedInvocation | None) -> None:
        got.append("before")
        got.append(await slot)
        got.append(await asyncio.sleep(0, "after a bare yield"))

    async with asyncio.TaskGroup() as tg:
        group = Group(tg)
        runner = InvocationRunner(run, group.spawn)
        runner.start(EpochState(1, 0), invoke(1), None)
        await settle()
        assert got == ["before"] and len(group.tasks) == 1 and not group.tasks[0].done()
        slot.set_result("result")
        await settle()
    assert got == ["before", "result", "after a bare yield"]


async def test_cancelling_the_task_reaches_the_invocation() -> None:
    loop = asyncio.get_running_loop()
    slot: asyncio.Future[None] = loop.create_future()
    seen: list[str] = []

    async def run(es: EpochState, inv: Invoke, cached: CachedInvocation | None) -> None:
        try:
            await slot
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async with asyncio.TaskGroup() as tg:
        group = Group(tg)
        runner = InvocationRunner(run, group.spawn)
        runner.start(EpochState(1, 0), invoke(1), None)
        await settle()
        group.tasks[0].cancel()
        await settle()
    assert seen == ["cancelled"] and slot.cancelled() and group.tasks[0].cancelled()


async def test_an_exception_thrown_in_is_relayed_and_can_be_handled() -> None:
    loop = asyncio.get_running_loop()
    slot: asyncio.Future[None] = loop.create_future()
    seen: list[str] = []

    async def run(es: EpochState, inv: Invoke, cached: CachedInvocation | None) -> None:
        try:
            await slot
        except KeyError as exc:
            seen.append(f"handled {exc}")

    async with asyncio.TaskGroup() as tg:
        group = Group(tg)
        runner = InvocationRunner(run, group.spawn)
        runner.start(EpochState(1, 0), invoke(1), None)
        await settle()
        slot.set_exception(KeyError("x"))
        await settle()
    assert seen == ["handled 'x'"]


async def test_a_raising_invocation_ends_the_group_and_drops_the_queue() -> None:
    ran: list[int] = []

    async def run(es: EpochState, inv: Invoke, cached: CachedInvocation | None) -> None:
        ran.append(inv.tid)
        if inv.tid == 2:
            raise AssertionError("a bug")

    with pytest.raises(ExceptionGroup) as caught:
        async with asyncio.TaskGroup() as tg:
            group = Group(tg)
            runner = InvocationRunner(run, group.spawn)
            for tid in (1, 2, 3):
                runner.start(EpochState(1, 0), invoke(tid), None)
            await asyncio.Future()  # until the group is cancelled by the failure
    assert caught.group_contains(AssertionError, match="a bug")
    assert ran == [1, 2], "what was queued behind the failure never runs"


async def test_clear_drops_what_has_not_started() -> None:
    ran: list[int] = []

    async def run(es: EpochState, inv: Invoke, cached: CachedInvocation | None) -> None:
        ran.append(inv.tid)

    async with asyncio.TaskGroup() as tg:
        runner = InvocationRunner(run, Group(tg).spawn)
        runner.start(EpochState(1, 0), invoke(1), None)
        runner.clear()
        await settle()
        runner.start(EpochState(1, 0), invoke(2), None)
        await settle()
    assert ran == [2]


async def test_a_closed_runner_runs_nothing_and_a_refused_spawn_leaves_no_unawaited_coroutine() -> None:
    loop = asyncio.get_running_loop()
    slot: asyncio.Future[None] = loop.create_future()
    ran: list[int] = []

    async def run(es: EpochState, inv: Invoke, cached: CachedInvocation | None) -> None:
        ran.append(inv.tid)
        await slot

    def refuse(coro: Coroutine[Any, Any, None]) -> None:
        raise RuntimeError("the task group is shutting down")

    runner = InvocationRunner(run, refuse)
    runner.start(EpochState(1, 0), invoke(1), None)
    runner.start(EpochState(1, 0), invoke(2), None)
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert ran == [1], "after the refusal the runner is closed"
    assert [type(e["exception"]) for e in errors] == [RuntimeError], "not swallowed"
    assert runner.closed
    runner.start(EpochState(1, 0), invoke(3), None)
    await asyncio.sleep(0)
    assert ran == [1]
