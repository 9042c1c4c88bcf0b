"""A deliberately slow app: every call burns CPU, so a cluster serves only a few hundred per second.

The driver test offers more than that and checks that the latency it reports includes the queueing.
"""

from __future__ import annotations

import time

from styx_py import Context, Graph, Operator

item = Operator("item", partitions=2)

BURN_S = 0.004


@item.function
async def work(ctx: Context) -> int:
    end = time.perf_counter() + BURN_S  # CPU, not sleep: the worker's loop is really busy
    while time.perf_counter() < end:
        pass
    count = await ctx.get(default=0) + 1
    await ctx.put(count)
    return int(count)


app = Graph("slow", [item])
