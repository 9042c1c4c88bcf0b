"""Versions of one bank app, for code updates: every reply says which version ran it.

``v2`` changes what existing functions do (a transfer pays a fee into a new operator), adds a function
to an existing operator and a new operator. The others are updates a cluster must refuse.
"""

from __future__ import annotations

from styx_py import Abort, Context, Graph, Operator


def build(
    version: int, *, acct_partitions: int = 4, fees_partitions: int = 3, with_ledger: bool = True
) -> Graph:
    """Fresh operators each time: versions never share an Operator object (or its functions)."""
    tag = f"v{version}"
    acct = Operator("acct", partitions=acct_partitions)
    ledger = Operator("ledger", partitions=2)
    fees = Operator("fees", partitions=fees_partitions)

    @acct.function
    async def deposit(ctx: Context, amount: int) -> list[object]:
        bal = int(await ctx.get(default=0)) + amount
        await ctx.put(bal)
        return [tag, bal]

    @acct.function
    async def transfer(ctx: Context, to: str, amount: int) -> list[object]:
        bal = int(await ctx.get(default=0))
        fee = 1 if version >= 2 else 0
        if bal < amount + fee:
            raise Abort(f"{tag}: insufficient credit in {ctx.key}")
        await ctx.put(bal - amount - fee)
        ctx.call_async(acct, "deposit", to, amount)
        if fee:
            ctx.call_async(fees, "collect", "total", fee)
        return [tag, bal - amount - fee]

    @acct.function
    async def chain(ctx: Context, rest: list[str], amount: int) -> list[object]:
        """Synchronous calls down a chain of accounts (the call graph spans workers)."""
        bal = int(await ctx.get(default=0)) + amount
        await ctx.put(bal)
        if not rest:
            return [tag, bal]
        tail: list[object] = await ctx.call(acct, "chain", rest[0], rest[1:], amount)
        return [tag, bal, *tail[1:]]

    @acct.function
    async def peek(ctx: Context) -> list[object]:
        return [tag, int(await ctx.get(default=0))]

    @ledger.function
    async def record(ctx: Context, who: str, amount: int) -> list[object]:
        entries = await ctx.get(default=[])
        entries.append([tag, who, amount])
        await ctx.put(entries)
        return [tag, len(entries)]

    operators = [acct, ledger] if with_ledger else [acct]
    if version >= 2:

        @acct.function
        async def bonus(ctx: Context) -> list[object]:
            bal = int(await ctx.get(default=0)) + 5
            await ctx.put(bal)
            ctx.call_async(ledger, "record", "bonuses", ctx.key, 5)
            return [tag, bal]

        @fees.function
        async def collect(ctx: Context, amount: int) -> list[object]:
            total = int(await ctx.get(default=0)) + amount
            await ctx.put(total)
            return [tag, total]

        operators.append(fees)
    return Graph(f"bank-{tag}", operators)


v1 = build(1)
v2 = build(2)
v3 = build(3)
repartitioned = build(2, acct_partitions=8)  # moves acct's keys: refused
too_wide = build(2, fees_partitions=6)  # a new operator with more partitions than the topics: refused
dropped = build(2, with_ledger=False)  # removes an operator with state: refused
