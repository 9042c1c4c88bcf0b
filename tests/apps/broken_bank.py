"""The bank app with a bug: ``transfer`` debits the source and forgets to credit the destination.

Deployed by the benchmark tests to prove that the YCSB-T ``check()`` catches a broken run.
"""

from __future__ import annotations

from styx_py import Abort, Context, Graph, Operator

account = Operator("account", partitions=4)


@account.function
async def transfer(ctx: Context, to_key: str, amount: int) -> int:
    balance = await ctx.get(default=0)
    if balance < amount:
        raise Abort(f"insufficient credit in {ctx.key}: {balance} < {amount}")
    await ctx.put(balance - amount)
    return int(balance - amount)  # the bug: no deposit on to_key


@account.function
async def deposit(ctx: Context, amount: int) -> int:
    balance = await ctx.get(default=0) + amount
    await ctx.put(balance)
    return int(balance)


@account.function(read_only=True)
async def balance(ctx: Context) -> int:
    return int(await ctx.get(default=0))


@account.function
async def open_accounts(ctx: Context, keys: list[str], amount: int) -> int:
    for key in keys:
        ctx.call_async(account, "deposit", key, amount)
    return len(keys)


app = Graph("bank", [account])
