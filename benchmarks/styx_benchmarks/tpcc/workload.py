"""The TPC-C workload: load the population, draw the NewOrder/Payment mix, read the state back.

Mix: 50 % NewOrder / 50 % Payment by default (the spec's 45/43 of its five transactions normalised
to these two would be 51/49); ``Options.extra["new_order_share"]`` changes it.

Loading (:meth:`Tpcc.load`): rows are grouped by (operator, partition) into ``bulk_put`` transactions
of 500 rows rooted at a key of that same partition, so each row's ``put`` is a local call; 24 of them
run at once. Measured on the 2-core development machine while other test suites ran on it (local
Tansu, coordinator, 2 workers): W=1 (309 011 rows) in 41-49 s, W=10 (2 190 110 rows) in 507 s, about
4 300-7 500 rows/s, bound by the engine's per-invocation cost; each worker held ~750 MB at W=10.
:meth:`Tpcc.read_state` reads through ``get_many`` (40 entities per transaction, the same grouping).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from styx_benchmarks.tpcc.batches import bulk_batches, read_batches
from styx_benchmarks.tpcc.check import check_state
from styx_benchmarks.tpcc.population import (
    C_ID_RUN,
    C_LAST_RUN,
    OL_I_ID_RUN,
    Sizes,
    generate,
    last_name,
    nurand,
)
from styx_benchmarks.tpcc.schema import (
    CUSTOMER,
    DISTRICT,
    DISTRICT_YTD,
    DISTRICTS,
    HISTORY,
    ORDER,
    WAREHOUSE,
    WAREHOUSE_YTD,
    order_page,
)
from styx_benchmarks.workload import Op, Options, Progress, State, Workload, submit_checks
from styx_py.core.partitioning import Key

if TYPE_CHECKING:
    from styx_client import StyxClient

LOAD_CONCURRENCY = 24  # loading transactions in flight
READ_CONCURRENCY = 200  # reading transactions in flight


class Tpcc(Workload):
    """TPC-C NewOrder + Payment over ``Options.warehouses`` warehouses (see the package docstring)."""

    name = "tpcc"
    app = "styx_benchmarks.tpcc:app"
    description = "TPC-C NewOrder + Payment (50/50) over W warehouses"

    def __init__(self, options: Options | None = None) -> None:
        super().__init__(options)
        self.sizes = Sizes(self.options.warehouses, self.options.scale)
        share = self.options.extra.get("new_order_share", 0.5)
        if not isinstance(share, int | float) or not 0 <= share <= 1:
            raise ValueError(f"new_order_share must be a number in [0, 1], got {share!r}")
        self.new_order_share = float(share)

    # ---- load ---------------------------------------------------------------------------------------

    def load_ops(self) -> Iterator[Op]:
        """The loading transactions (``bulk_put`` calls), generated lazily in population order."""
        return bulk_batches(generate(self.sizes, self.options.seed))

    async def load(self, client: StyxClient, progress: Progress = print) -> None:
        started = time.monotonic()
        rows = self.sizes.rows()
        total = sum(rows.values())
        loaded = transactions = 0
        step = max(1, total // 10)
        reported = 0
        window = asyncio.Semaphore(LOAD_CONCURRENCY)

        async def run(op: Op) -> None:
            nonlocal loaded, transactions, reported
            try:
                reply = await client.submit(op.operator, op.key, op.function, *op.args)
            finally:
                window.release()
            if reply.status != "committed":
                raise RuntimeError(f"tpcc load failed: {op.operator}.bulk_put: {reply.status} {reply.error}")
            loaded += len(op.args[0])
            transactions += 1
            if loaded - reported >= step:
                reported = loaded
                progress(f"tpcc: loaded {loaded}/{total} rows ({time.monotonic() - started:.1f} s)")

        try:
            async with asyncio.TaskGroup() as tg:
                for op in self.load_ops():
                    await window.acquire()
                    tg.create_task(run(op))
        except* RuntimeError as group:
            raise group.exceptions[0] from None
        assert loaded == total, f"loaded {loaded} rows, expected {total}"
        counts = ", ".join(f"{n} {op}" for op, n in rows.items())
        progress(
            f"tpcc: loaded W={self.sizes.warehouses} scale={self.options.scale}: {total} rows ({counts}) "
            f"in {transactions} transactions, {time.monotonic() - started:.1f} s"
        )

    # ---- the mix ------------------------------------------------------------------------------------

    def next_op(self, rng: random.Random) -> Op:
        sizes = self.sizes
        w = rng.randint(1, sizes.warehouses)
        d = rng.randint(1, DISTRICTS)
        if rng.random() < self.new_order_share:
            return self._new_order(rng, w, d)
        c_w, c_d = w, d
        if sizes.warehouses > 1 and rng.random() < 0.15:
            c_w, c_d = self._other_warehouse(rng, w), rng.randint(1, DISTRICTS)
        amount = rng.randint(100, 500_000)
        if rng.random() < 0.6:
            last = last_name(nurand(rng, 255, 0, sizes.names - 1, C_LAST_RUN))
            return Op("payment", DISTRICT_YTD, f"{w}:{d}", "payment", (c_w, c_d, None, last, amount))
        c_id = nurand(rng, 1023, 1, sizes.customers, C_ID_RUN)
        return Op("payment", DISTRICT_YTD, f"{w}:{d}", "payment", (c_w, c_d, c_id, None, amount))

    def _new_order(self, rng: random.Random, w: int, d: int) -> Op:
        sizes = self.sizes
        c_id = nurand(rng, 1023, 1, sizes.customers, C_ID_RUN)
        count = rng.randint(5, 15)
        # Distinct items: two lines on one stock row would be two parallel calls to one entity.
        items: list[int] = []
        while len(items) < count:
            i = nurand(rng, 8191, 1, sizes.items, OL_I_ID_RUN)
            if i not in items:
                items.append(i)
        if rng.random() < 0.01:
            items[-1] = sizes.items + 1  # an unused item id: the transaction rolls back
        lines = []
        for i in items:
            remote = sizes.warehouses > 1 and rng.random() < 0.01
            lines.append([i, self._other_warehouse(rng, w) if remote else w, rng.randint(1, 10)])
        return Op("new_order", DISTRICT, f"{w}:{d}", "new_order", (c_id, lines))

    def _other_warehouse(self, rng: random.Random, w: int) -> int:
        other = rng.randint(1, self.sizes.warehouses - 1)
        return other + 1 if other >= w else other

    # ---- check --------------------------------------------------------------------------------------

    async def read_state(self, client: StyxClient) -> State:
        """Warehouses and districts (both parts of each) and customers; then every order page up to
        D_NEXT_O_ID's (one past it, to see rows beyond) and every customer's history rows
        1 … C_PAYMENT_CNT."""
        sizes = self.sizes
        state: dict[tuple[str, Key], Any] = {}
        districts = [(w, d) for w in range(1, sizes.warehouses + 1) for d in range(1, DISTRICTS + 1)]
        first = [(op, str(w)) for w in range(1, sizes.warehouses + 1) for op in (WAREHOUSE, WAREHOUSE_YTD)]
        first += [(op, f"{w}:{d}") for w, d in districts for op in (DISTRICT, DISTRICT_YTD)]
        first += [(CUSTOMER, f"{w}:{d}:{c}") for w, d in districts for c in range(1, sizes.customers + 1)]
        await _read(client, first, state)
        second: list[tuple[str, str]] = []
        for w, d in districts:
            district = state.get((DISTRICT, f"{w}:{d}"))
            if district is not None:
                for p in range(order_page(district["next_o_id"]) + 2):
                    second.append((ORDER, f"{w}:{d}:{p}"))
        for (op, key), value in list(state.items()):
            if op == CUSTOMER:
                second += [(HISTORY, f"{key}:{n}") for n in range(1, value["payment_cnt"] + 1)]
        await _read(client, second, state)
        return state

    def check_state(self, state: State) -> list[str]:
        return check_state(self.sizes, state)


async def _read(client: StyxClient, keys: list[tuple[str, str]], into: dict[tuple[str, Key], Any]) -> None:
    """Read ``(operator, key)`` pairs through ``get_many``; absent entities are left out of ``into``."""
    ops = list(read_batches(keys))
    replies = await submit_checks(
        client, ((op.operator, op.key, op.function, op.args) for op in ops), READ_CONCURRENCY
    )
    for op, reply in zip(ops, replies, strict=True):
        if reply.status != "committed":
            raise RuntimeError(f"tpcc: reading {op.operator} failed: {reply.status} {reply.error}")
        for key, value in zip(op.args[0], reply.value, strict=True):
            if value is not None:
                into[(op.operator, key)] = value
