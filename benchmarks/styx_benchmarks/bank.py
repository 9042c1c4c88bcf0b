"""The bank transfer app (DESIGN.md §2): YCSB-T's transaction, and the `styx up --demo` workload.

``app`` has 4 partitions; ``app16`` and ``app64`` are the same functions over 16 and 64 partitions
(``styx bench ycsbt --partitions N``), the shape for a cluster meant to grow to that many workers
without re-partitioning its keys (docs/operations.md has the measured cost of more partitions).
"""

from __future__ import annotations

from styx_py import Abort, Context, Graph, Operator

PARTITION_CHOICES = (4, 16, 64)


def build(partitions: int) -> tuple[Operator, Graph]:
    """The bank's ``account`` operator over ``partitions`` partitions, and its graph."""
    account = Operator("account", partitions=partitions)

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

    return account, Graph("bank", [account])


account, app = build(4)
account16, app16 = build(16)
account64, app64 = build(64)


def app_path(partitions: int) -> str:
    """Import path of the bank graph with ``partitions`` partitions (one of :data:`PARTITION_CHOICES`)."""
    if partitions not in PARTITION_CHOICES:
        raise ValueError(f"the bank app has {PARTITION_CHOICES} partitions, not {partitions}")
    return "styx_benchmarks.bank:app" + ("" if partitions == 4 else str(partitions))
