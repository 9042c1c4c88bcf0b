"""The bank app under the simulation kit (docs/simulate.md): a workload, its invariant, a planted bug.

``styx simulate styx_benchmarks.bank:app --workload styx_benchmarks.bank_sim:workload --invariant
styx_benchmarks.bank_sim:money_is_conserved`` runs the bank under crashes and reshapes and passes;
``buggy_app`` is the same bank with a bug money conservation does not see (a fee drawn from the
process's random generator instead of ``ctx.random()``), which the kit's comparison with a serial
execution finds.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from styx_py import Abort, Context, Graph, Operator

__all__ = ["ACCOUNTS", "OPENING", "buggy_app", "money_is_conserved", "workload"]

ACCOUNTS = 20
OPENING = 100  # each account's first deposit


def workload(rng: random.Random) -> Iterator[tuple[str, str, str, tuple[Any, ...]]]:
    """Open the accounts, then transfers between random ones (a few reads of a balance among them)."""
    for i in range(ACCOUNTS):
        yield ("account", f"a{i}", "deposit", (OPENING,))
    while True:
        a, b = rng.sample(range(ACCOUNTS), 2)
        if rng.random() < 0.1:
            yield ("account", f"a{a}", "balance", ())
        else:
            yield ("account", f"a{a}", "transfer", (f"a{b}", rng.randint(1, 60)))


def money_is_conserved(state: dict[tuple[str, Any], Any]) -> Iterator[str]:
    """Transfers move money, they neither make nor lose any."""
    total = sum(v for (op, _), v in state.items() if op == "account")
    if total != ACCOUNTS * OPENING:
        yield f"the accounts hold {total}, not {ACCOUNTS * OPENING}"


account = Operator("account", partitions=4)


@account.function
async def transfer(ctx: Context, to_key: str, amount: int) -> int:
    """The bank's transfer with a fee now and then, moved to the ``fees`` account (money is conserved).

    The planted bug: the fee is drawn from the process's random generator, not from ``ctx.random()``.
    The transaction's outcome then depends on where and when it runs: a serial execution of the same
    requests, or a replay after a crash, draws other numbers, and replies and state differ."""
    balance: int = await ctx.get(default=0)
    fee = 1 if random.random() < 0.2 else 0  # the bug: should be ctx.random()
    if balance < amount + fee:
        raise Abort(f"insufficient credit in {ctx.key}: {balance} < {amount + fee}")
    await ctx.put(balance - amount - fee)
    ctx.call_async(account, "deposit", to_key, amount)
    if fee:
        ctx.call_async(account, "deposit", "fees", fee)
    return balance - amount - fee


@account.function
async def deposit(ctx: Context, amount: int) -> int:
    balance: int = await ctx.get(default=0) + amount
    await ctx.put(balance)
    return balance


@account.function(read_only=True)
async def balance(ctx: Context) -> int:
    return int(await ctx.get(default=0))


buggy_app = Graph("bank", [account])
