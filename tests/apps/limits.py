"""An app for the request limits (tests/test_bad_input.py): functions that take any value."""

from __future__ import annotations

from typing import Any

from styx_py import Context, Graph, Operator

box = Operator("box", partitions=4)


def nested(depth: int) -> Any:
    """``depth`` levels of lists around 1 (``nested(2) == [[1]]``)."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@box.function
async def keep(ctx: Context, value: Any) -> str:
    await ctx.put(value)
    return "kept"


@box.function
async def count(ctx: Context, amount: int) -> int:
    """The well-behaved function: proves the cluster still works and no bad write leaked."""
    total = int(await ctx.get(default=0)) + amount
    await ctx.put(total)
    return total


@box.function
async def forward(ctx: Context, depth: int) -> str:
    """Calls ``keep`` with an argument nested ``depth`` levels: the limit holds for calls too."""
    await ctx.put("forwarded")
    await ctx.call(box, "keep", f"{ctx.key}-next", nested(depth))
    return "forwarded"


app = Graph("limits", [box])
