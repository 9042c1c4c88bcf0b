"""TPC-C with two injected bugs, for the end-to-end test of the consistency check.

NewOrder forgets to insert the new-order row (conditions 2 and 5 must notice) and Payment forgets to
add the amount to W_YTD (conditions 1 and 8 must notice). Everything else is the real app.
"""

from __future__ import annotations

from typing import Any

from styx_benchmarks.tpcc import build_app
from styx_benchmarks.tpcc.transactions import next_order_id
from styx_py import Abort, Context


async def insert_without_new_order(ctx: Context, order: dict[str, Any]) -> None:
    """Like the real ``order.insert``, but the new-order row is never written."""
    page = await ctx.get() or {"orders": {}, "new": []}
    page["orders"][str(next_order_id(ctx.key, page))] = order
    await ctx.put(page)


async def pay_without_ytd(ctx: Context, amount: int) -> None:
    """Like the real ``warehouse_ytd.pay``, but leaves W_YTD as it was."""
    if await ctx.get() is None:
        raise Abort(f"no warehouse {ctx.key}")


app = build_app(
    "tpcc-broken", {("order", "insert"): insert_without_new_order, ("warehouse_ytd", "pay"): pay_without_ytd}
)
