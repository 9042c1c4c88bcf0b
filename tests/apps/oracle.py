"""An app with every call shape the engine supports, for the serializability oracle: reads, writes and
deletes (an insert after a delete, a delete of a missing key, a read after a delete), blind adds,
asynchronous and
synchronous calls, fan-outs that meet, aborts, user errors and deterministic randomness."""

from __future__ import annotations

from typing import Any

from styx_py import Abort, Context, Graph, Operator

acct = Operator("acct", partitions=8)
ledger = Operator("ledger", partitions=3)
counter = Operator("counter", partitions=4)


@acct.function
async def deposit(ctx: Context, amount: int) -> int:
    bal = await ctx.get(default=0) + amount
    await ctx.put(bal)
    return int(bal)


@acct.function
async def transfer(ctx: Context, to: str, amount: int) -> int:
    bal = await ctx.get(default=0)
    if bal < amount:
        raise Abort(f"insufficient credit in {ctx.key}")
    await ctx.put(bal - amount)
    ctx.call_async(acct, "deposit", to, amount)
    return int(bal - amount)


@acct.function
async def fan_out(ctx: Context, targets: list[str], amount: int) -> int:
    """Withdraw amount*len(targets) and deposit to each target asynchronously."""
    bal = await ctx.get(default=0)
    total = amount * len(targets)
    if bal < total:
        raise Abort(f"insufficient credit in {ctx.key} for fan-out")
    await ctx.put(bal - total)
    for t in targets:
        ctx.call_async(acct, "deposit", t, amount)
    ctx.call_async(ledger, "record", ctx.key, ctx.key, total)
    return len(targets)


@acct.function
async def chain(ctx: Context, rest: list[str], amount: int) -> list[int]:
    """Synchronous call chain: each hop adds amount and returns the balances seen down the chain."""
    bal = await ctx.get(default=0) + amount
    await ctx.put(bal)
    if not rest:
        return [int(bal)]
    tail: list[int] = await ctx.call(acct, "chain", rest[0], rest[1:], amount)
    return [int(bal), *tail]


@acct.function
async def sum_read(ctx: Context, others: list[str]) -> int:
    """Reads through synchronous calls only (a read-only transaction)."""
    total = int(await ctx.get(default=0))
    for o in others:
        total += await ctx.call(acct, "peek", o)
    return total


@acct.function
async def peek(ctx: Context) -> int:
    return int(await ctx.get(default=0))


@acct.function
async def move_if_rich(ctx: Context, to: str, threshold: int) -> str:
    """Reads a remote balance synchronously, then decides: the call graph depends on state."""
    other = await ctx.call(acct, "peek", to)
    mine = await ctx.get(default=0)
    if mine > other + threshold:
        await ctx.put(mine - threshold)
        ctx.call_async(acct, "deposit", to, threshold)
        return "moved"
    return "kept"


@acct.function
async def bump(ctx: Context, cfg: str) -> int:
    """Adds one plus what ``cfg`` holds (read through a call): writers of one account conflict, and
    every one of them reads the same entity."""
    rate = await ctx.call(acct, "peek", cfg)
    value = int(await ctx.get(default=0)) + rate + 1
    await ctx.put(value)
    return value


@acct.function
async def skim(ctx: Context, threshold: int) -> int:
    """Takes off what this account holds beyond ``threshold`` plus what ``<key>-ref`` holds (read
    first, through a call): a reader of its entity in one run, a writer in another, depending on the
    state read."""
    bal = int(await ctx.get(default=0))
    threshold += await ctx.call(acct, "peek", f"{ctx.key}-ref")
    if bal <= threshold:
        return 0
    await ctx.put(threshold)
    return bal - threshold


@acct.function
async def close(ctx: Context, to: str) -> list[int]:
    """Deletes this account and moves its balance to ``to``. Read again in the same transaction, the
    account has no value (the default); closing one that has none deletes a missing key."""
    bal = int(await ctx.get(default=0))
    await ctx.delete()
    after = int(await ctx.get(default=-1))
    if bal:
        ctx.call_async(acct, "deposit", to, bal)
    return [bal, after]


@acct.function
async def reopen(ctx: Context, amount: int) -> list[int]:
    """Deletes this account and inserts it again in one transaction: the insert after the delete is
    what commits."""
    before = int(await ctx.get(default=-1))
    await ctx.delete()
    await ctx.put(amount)
    return [before, int(await ctx.get(default=-1))]


@acct.function
async def boom(ctx: Context, when: int) -> int:
    bal = await ctx.get(default=0)
    if bal % 7 == when:
        raise ValueError(f"boom at {bal}")
    await ctx.put(bal + 1)
    return int(bal + 1)


@acct.function
async def lucky(ctx: Context) -> list[Any]:
    """Deterministic randomness and uuid: same values on every replay of this tid."""
    r = ctx.random()
    u = str(ctx.uuid())
    await ctx.put(int(r * 1000))
    return [r, u, ctx.now()]


@acct.function
async def via(ctx: Context, target: str, tag: str) -> None:
    """One hop of a parallel branch on its way to ``target``'s ledger entry."""
    ctx.call_async(ledger, "record", target, tag, 1)


@acct.function
async def converge(ctx: Context, hops: list[str], target: str) -> int:
    """Parallel branches through different entities (so different workers) that all end on one
    ledger entry: the order of the appends must be the serial order of the branches (each branch's
    subtree in call order), whatever order the branches' messages arrive in."""
    for i, hop in enumerate(hops):
        ctx.call_async(acct, "via", hop, target, f"{ctx.key}/{i}")
    return len(hops)


@acct.function
async def tip(ctx: Context, amount: int) -> None:
    """A blind add: it commutes with the other adds of its epoch and conflicts with reads and puts."""
    await ctx.add(amount)


@acct.function
async def tip_and_look(ctx: Context, amount: int) -> int:
    """An add read back in the same transaction: then it reads the account like any update."""
    await ctx.add(amount)
    return int(await ctx.get(default=0))


@acct.function
async def spread(ctx: Context, targets: list[str], amount: int, stats: str) -> int:
    """Adds to several accounts (asynchronous calls) and to two fields of a stats entry, one of them
    twice; on a ledger entry (a list) the add fails the transaction."""
    for t in targets:
        ctx.call_async(acct, "tip", t, amount)
    ctx.call_async(counter, "tally", stats, amount)
    return len(targets)


@counter.function
async def tally(ctx: Context, amount: int) -> None:
    await ctx.add(1, "n")
    await ctx.add(amount, "sum")
    await ctx.add(amount, "sum")


@ledger.function
async def record(ctx: Context, who: str, amount: int) -> None:
    entries = await ctx.get(default=[])
    entries.append([who, amount])
    await ctx.put(entries)


@counter.function
async def open_order(ctx: Context, amount: int) -> int:
    """Takes this counter's next number and records the order under it: the callee's key depends on
    the state read, like TPC-C's NewOrder and ``D_NEXT_O_ID``. Two of these on one counter in one
    epoch always change the second one's call graph in the fallback (it is rescheduled)."""
    n = int(await ctx.get(default=0)) + 1
    await ctx.put(n)
    ctx.call_async(ledger, "record", f"{ctx.key}:{n}", ctx.key, amount)
    return n


app = Graph("oracle", [acct, ledger, counter])
