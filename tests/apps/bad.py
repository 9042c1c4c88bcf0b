"""An app whose functions misbehave in every way user code can, for the bad-input tests."""

from __future__ import annotations

from typing import Any

from styx_py import Abort, Context, Graph, Operator

thing = Operator("thing", partitions=4)
other = Operator("other", partitions=3)


@thing.function
async def add(ctx: Context, amount: int) -> int:
    """The well-behaved function: proves the cluster still works, and that no bad write leaked."""
    value = await ctx.get(default=0) + amount
    await ctx.put(value)
    return int(value)


@thing.function
async def explode(ctx: Context) -> None:
    await ctx.put(1000)
    raise ValueError(f"explode: cannot handle {ctx.key}")


@thing.function
async def unencodable_result(ctx: Context) -> Any:
    await ctx.put(1000)
    return object()


@thing.function
async def unencodable_state(ctx: Context) -> None:
    await ctx.put({"handle": object()})


@thing.function
async def call_unknown_function(ctx: Context) -> None:
    await ctx.put(1000)
    ctx.call_async(other, "nothere", ctx.key)


@thing.function
async def call_unknown_function_sync(ctx: Context) -> None:
    await ctx.put(1000)
    await ctx.call(other, "nothere", ctx.key)


@thing.function
async def call_unknown_operator(ctx: Context) -> None:
    await ctx.put(1000)
    ctx.call_async("ghost", "touch", ctx.key)


@thing.function
async def call_with_float_key(ctx: Context) -> None:
    await ctx.put(1000)
    ctx.call_async(other, "touch", 1.5)


@thing.function
async def call_failing(ctx: Context) -> None:
    """The callee fails: the whole transaction fails with the callee's error."""
    await ctx.put(1000)
    ctx.call_async(other, "touch", ctx.key)
    await ctx.call(other, "fail", ctx.key)


@thing.function
async def swallow_failure(ctx: Context) -> str:
    """A user ``except Exception`` cannot hide a failed synchronous callee."""
    await ctx.put(1000)
    try:
        await ctx.call(other, "fail", ctx.key)
    except Exception:  # noqa: BLE001 - the point: try to swallow the failure
        return "swallowed"
    return "unreachable"


@thing.function
async def abort_downstream(ctx: Context) -> None:
    await ctx.put(1000)
    ctx.call_async(other, "touch", ctx.key)
    ctx.call_async(other, "refuse", ctx.key)


@other.function
async def touch(ctx: Context) -> int:
    value = await ctx.get(default=0) + 1
    await ctx.put(value)
    return int(value)


@other.function
async def fail(ctx: Context) -> None:
    await ctx.put(-1)
    raise KeyError(f"inner failure at {ctx.key}")


@other.function
async def refuse(ctx: Context) -> None:
    raise Abort(f"refused by {ctx.key}")


app = Graph("bad", [thing, other])
