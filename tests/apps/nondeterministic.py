"""A function that is not deterministic (it draws from the global ``random``): a replay gives it
another number than the run its client saw. For the terminal-divergence tests."""

from __future__ import annotations

import random

from styx_py import Context, Graph, Operator

counter = Operator("counter", partitions=4)


@counter.function
async def bump(ctx: Context) -> float:
    value = random.random()  # wrong on purpose: ctx.random() is the deterministic one
    await ctx.put(value)
    return value


@counter.function
async def read(ctx: Context) -> float:
    value: float = await ctx.get(default=0.0)
    return value


app = Graph("nondeterministic", [counter])
