"""A function that is not deterministic in the state it writes only (it stores a draw of the global
``random`` and always answers "ok"): a replay writes another number, which no reply of its own shows;
a later read does. For the divergence test of the write digests (tests/test_recovery.py)."""

from __future__ import annotations

import random

from styx_py import Context, Graph, Operator

counter = Operator("counter", partitions=4)


@counter.function
async def stir(ctx: Context) -> str:
    await ctx.put(random.random())  # wrong on purpose (ctx.random() is the deterministic one)
    return "ok"


@counter.function
async def read(ctx: Context) -> float:
    value: float = await ctx.get(default=0.0)
    return value


app = Graph("quiet_nondeterministic", [counter])
