"""An app whose transactions read ranges (``ctx.scan``) while others insert, update and delete in them:
accounts opened and closed and money moved between them, concurrently with reports that scan a prefix
or a range and sum the balances. A phantom (a scan that misses an insert or a delete a lower tid made in
its range) makes a report's sum differ from the serial execution's."""

from __future__ import annotations

from typing import Any

from styx_py import Abort, Context, Graph, Operator

acct = Operator("acct", partitions=4)
report = Operator("report", partitions=2)


@acct.function
async def open_account(ctx: Context, amount: int) -> int:
    """An insert into the scanned key space (an abort if the account is open already)."""
    if await ctx.get() is not None:
        raise Abort(f"{ctx.key} is open")
    await ctx.put(amount)
    return amount


@acct.function
async def deposit(ctx: Context, amount: int) -> int:
    bal = int(await ctx.get(default=0)) + amount
    await ctx.put(bal)
    return bal


@acct.function
async def transfer(ctx: Context, to: str, amount: int) -> int:
    bal = await ctx.get()
    if bal is None or bal < amount:
        raise Abort(f"insufficient credit in {ctx.key}")
    await ctx.put(bal - amount)
    ctx.call_async(acct, "deposit", to, amount)
    return int(bal - amount)


@acct.function
async def close(ctx: Context, to: str) -> int:
    """A delete from the scanned key space; the balance moves to ``to``."""
    bal = await ctx.get()
    if bal is None:
        raise Abort(f"{ctx.key} is not open")
    await ctx.delete()
    ctx.call_async(acct, "deposit", to, bal)
    return int(bal)


@acct.function
async def count_into_self(ctx: Context, prefix: str) -> int:
    """An entity that scans its own operator (its own partition included) and writes itself."""
    rows = await ctx.scan(acct, prefix=prefix)
    await ctx.put(len(rows))
    return len(rows)


@acct.function
async def deposit_and_report(ctx: Context, other: str, prefix: str) -> None:
    """Two branches of one transaction: a write into the range and a scan of it (they race unless the
    transaction runs alone, in the serial model's order: the deposit first)."""
    ctx.call_async(acct, "deposit", other, 1)
    ctx.call_async(report, "snapshot_total", "r-branch", prefix)


@acct.function
async def report_and_deposit(ctx: Context, other: str, prefix: str) -> None:
    """The same branches the other way round: serially the scan runs first and misses the deposit."""
    ctx.call_async(report, "snapshot_total", "r-branch", prefix)
    ctx.call_async(acct, "deposit", other, 1)


@report.function
async def total(ctx: Context, prefix: str) -> list[int]:
    """The number of accounts under ``prefix`` and the sum of their balances."""
    rows = await ctx.scan(acct, prefix=prefix)
    keys = [k for k, _ in rows]
    assert keys == sorted(keys), keys
    return [len(rows), sum(int(v) for _, v in rows)]


@report.function
async def window(ctx: Context, start: str, end: str, limit: int) -> list[Any]:
    """The first ``limit`` accounts in [start, end), then the page after them."""
    rows = await ctx.scan(acct, start=start, end=end, limit=limit)
    page: list[Any] = []
    if rows:
        page = await ctx.scan(acct, after=rows[-1][0], end=end, limit=limit)
    return [[k for k, _ in rows], sum(int(v) for _, v in rows), [k for k, _ in page]]


@report.function
async def snapshot_total(ctx: Context, prefix: str) -> int:
    """Read a range and write what it saw (a read-write transaction on the range)."""
    rows = await ctx.scan(acct, prefix=prefix)
    s = sum(int(v) for _, v in rows)
    await ctx.put(s)
    return s


@report.function
async def top_up_smallest(ctx: Context, prefix: str, amount: int) -> str:
    """Find the poorest account under ``prefix`` by a scan and deposit into it (the call depends on the
    range: a changed range changes the call graph)."""
    rows = await ctx.scan(acct, prefix=prefix)
    if not rows:
        raise Abort("no accounts")
    key = min(rows, key=lambda kv: (int(kv[1]), kv[0]))[0]
    await ctx.call(acct, "deposit", key, amount)
    return str(key)


@report.function
async def too_many(ctx: Context) -> int:
    """A limit past the most a scan may return (ScanLimitExceeded fails the transaction)."""
    return len(await ctx.scan(acct, limit=10**6))


app = Graph("index", [acct, report])
