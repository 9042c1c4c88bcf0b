"""The bank transfer app (DESIGN.md §2): YCSB-T's transaction, and the `styx up --demo` workload."""

from __future__ import annotations

from styx_py import Abort, Context, Graph, Operator

account = Operator("account", partitions=4)


@account.function
async def transfer(ctx: Context, to_key: str, amount: int) -> int:
    """Move ``amount`` from this account to ``to_key``; abort on insufficient credit."""
    balance = await ctx.get(default=0)
    if balance < amount:
        raise Abort(f"insufficient credit in {ctx.key}: {balance} < {amount}")
    await ctx.put(balance - amount)
    ctx.call_async(account, "deposit", to_key, amount)
    return int(balance - amount)


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
    """Bulk load: one transaction opens many accounts (one async call each, on their own partitions)."""
    for key in keys:
        ctx.call_async(account, "deposit", key, amount)
    return len(keys)


app = Graph("bank", [account])
