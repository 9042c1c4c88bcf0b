"""TPC-C NewOrder + Payment as styx-py function call graphs, with a bulk loader and the consistency check.

Data model (one entity per row of the tables these two transactions touch; keys are ``str``)::

    operator        key               value
    warehouse       "w"               {name, address, tax, ytd}
    district        "w:d"             {name, address, tax, ytd, next_o_id}
    customer        "w:d:c"           {first, middle, last, address, phone, since, credit, credit_lim,
                                       discount, balance, ytd_payment, payment_cnt, delivery_cnt, data}
    customer_name   "w:d:LAST"        [c_id, …] sorted by (C_FIRST, c_id): the last-name index
    history         "w:d:c:n"         {c_w, c_d, c_id, w, d, date, amount, data}: the customer's n-th payment
    item            "i"               {im_id, name, price, data}
    stock           "w:i"             {quantity, ytd, order_cnt, remote_cnt, dist: [10 strings of 24], data}
    order           "w:d:o"           {c_id, entry_d, carrier_id, ol_cnt, all_local,
                                       lines: [[i_id, supply_w, quantity, amount, dist_info], …]}
    new_order       "w:d:o"           o_id (the row's presence is what counts)

Order lines live inside their order (they are only ever written with it), which keeps the entity count
at one per order instead of ten. History rows are keyed by the customer's payment count, so the rows of
a customer are enumerable (``1 … C_PAYMENT_CNT``) without a scan. Money is integer cents; tax and
discount are integer basis points (1/10 000), so sums are exact.

Transactions (both rooted at the district entity ``w:d``; :func:`new_order` and :func:`payment`):

* **NewOrder** takes ``D_NEXT_O_ID`` and increments it, then fans out in parallel (``asyncio.gather`` of
  ``ctx.call``) to the warehouse (W_TAX), the customer (discount, credit) and one ``stock.order_line``
  per order line (5-15, distinct items), which reads the item — an unused item id raises ``Abort``
  there, two calls deep, and rolls back the whole transaction — and updates the stock row. The root
  then inserts the order (with its lines) and the new-order row with ``call_async``. 1 % of NewOrders
  carry an unused item id; a line is supplied by a remote warehouse with probability 1 % (W > 1).
* **Payment** adds the amount to D_YTD, then (in parallel) to W_YTD through ``warehouse.pay`` and, for
  60 % of payments, resolves the customer by last name through the ``customer_name`` index (the
  middle customer by C_FIRST, position ⌈n/2⌉, as the spec says); ``customer.pay`` updates balance,
  YTD payment, payment count (and C_DATA for bad credit) and inserts the history row. 15 % of payments
  are for a customer of a remote warehouse (W > 1).

Contention is TPC-C's own: every Payment writes its warehouse row, which every NewOrder of that
warehouse reads (W_TAX), and both write the district row. With W=1 most transactions of an epoch
conflict and commit in the fallback phase; more warehouses spread them out.

Mix: 50 % NewOrder / 50 % Payment by default (the spec's 45/43 of its five transactions normalised
to these two would be 51/49); ``Options.extra["new_order_share"]`` changes it. Customer ids, item ids
and last names are drawn with NURand (A = 1023, 8191 and 255) with fixed C constants.

Cardinalities per warehouse at ``scale=1.0`` are the spec's: 10 districts, 3 000 customers per district
(and one history row each), 100 000 stock rows, 3 000 initial orders per district (one per customer,
random permutation) with 5-15 lines each, the last 900 of them undelivered with a new-order row; plus
100 000 items in all. ``Options.scale`` multiplies the customers (hence initial orders and history)
and the items (hence stock): ``scale=0.01`` gives 30 customers per district and 1 000 items. The 70/30
split of delivered/undelivered initial orders is kept. The initial D_YTD is 10.00 per customer
(30 000.00 at scale 1, as in the spec) and W_YTD is ten times that, so the YTD conditions hold from the
start at every scale. Entities per warehouse at scale 1: 1 + 10 + 30 000 customers + 10 000 last names
+ 30 000 history + 100 000 stock + 30 000 orders + 9 000 new-orders ≈ 209 000, plus 100 000 items.

Loading (:meth:`Tpcc.load`): rows are grouped by (operator, partition) into ``bulk_put`` transactions
of 500 rows rooted at a key of that same partition, so each row's ``put`` is a local call; 24 of them
run at once. Measured on the 2-core development machine while other test suites ran on it (local
Tansu, coordinator, 2 workers): W=1 (309 011 rows) in 41-49 s, W=10 (2 190 110 rows) in 507 s, about
4 300-7 500 rows/s, bound by the engine's per-invocation cost; each worker held ~750 MB at W=10.
:meth:`Tpcc.read_state` reads through ``get_many`` (40 entities per transaction, the same grouping).

Consistency conditions checked (:meth:`Tpcc.check_state`; the spec's numbering, those that NewOrder and
Payment can affect):

1. W_YTD = Σ D_YTD of the warehouse's districts;
2. D_NEXT_O_ID - 1 = max(O_ID) = max(NO_O_ID) per district;
3. max(NO_O_ID) - min(NO_O_ID) + 1 = the number of new-order rows per district;
4. Σ O_OL_CNT = the number of order-line rows per district (and per order);
5. O_CARRIER_ID is null exactly for the orders that have a new-order row;
8. W_YTD = Σ H_AMOUNT of the payments made at the warehouse;
9. D_YTD = Σ H_AMOUNT of the payments made at the district;
10. C_BALANCE = Σ OL_AMOUNT of the customer's delivered orders - Σ H_AMOUNT of the customer's payments
    (there is no Delivery here, so only the initially delivered orders count), and also
    C_YTD_PAYMENT = Σ H_AMOUNT and C_PAYMENT_CNT = the number of the customer's history rows.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from styx_py import Abort, Context, Graph, Operator
from styx_py.benchmarks.workload import Op, Options, Progress, State, Workload
from styx_py.core.operator import UserFunction
from styx_py.core.partitioning import Key, partition_of

if TYPE_CHECKING:
    from styx_py.client import StyxClient

Row = dict[str, Any]

# ---- the app ----------------------------------------------------------------------------------------

# Operator names: functions call each other by name, so every graph build_app makes can share them.
WAREHOUSE = "warehouse"
DISTRICT = "district"
CUSTOMER = "customer"
CUSTOMER_NAME = "customer_name"
HISTORY = "history"
ITEM = "item"
STOCK = "stock"
ORDER = "order"
NEW_ORDER = "new_order"

# Partitions per operator: the big, evenly accessed tables get 8; the small or read-mostly ones 4.
PARTITIONS: dict[str, int] = {
    WAREHOUSE: 4,
    DISTRICT: 8,
    CUSTOMER: 8,
    CUSTOMER_NAME: 4,
    HISTORY: 8,
    ITEM: 4,
    STOCK: 8,
    ORDER: 8,
    NEW_ORDER: 8,
}


def _ints(key: Key) -> list[int]:
    return [int(p) for p in str(key).split(":")]


async def put(ctx: Context, value: Any) -> None:
    """Write this entity (the loader's per-row function)."""
    await ctx.put(value)


async def get(ctx: Context) -> Any:
    """This entity's value, or None (read-only)."""
    return await ctx.get()


async def bulk_put(ctx: Context, rows: list[list[Any]]) -> int:
    """Load ``[[key, value], …]`` of this operator in one transaction: one ``put`` call per row."""
    for key, value in rows:
        ctx.call_async(ctx.operator, "put", key, value)
    return len(rows)


async def get_many(ctx: Context, keys: list[str]) -> list[Any]:
    """Read many entities of this operator in one transaction (``None`` for absent ones).

    Each synchronous call halves the caller's ack share and shares travel as 64-bit integers, so one
    invocation must make far fewer than 64 of them: callers pass at most :data:`READ_CHUNK` keys.
    """
    return list(await asyncio.gather(*(ctx.call(ctx.operator, "get", key) for key in keys)))


# NewOrder ------------------------------------------------------------------------------------------


async def new_order(ctx: Context, c_id: int, lines: list[list[int]]) -> Row:
    """TPC-C NewOrder on district ``w:d`` for customer ``c_id``; ``lines`` are ``[i_id, supply_w, qty]``."""
    w, d = _ints(ctx.key)
    district = await ctx.get()
    if district is None:
        raise Abort(f"no district {ctx.key}")
    o_id = district["next_o_id"]
    district["next_o_id"] = o_id + 1
    await ctx.put(district)
    w_tax, customer, *supplied = await asyncio.gather(
        ctx.call(WAREHOUSE, "tax", str(w)),
        ctx.call(CUSTOMER, "for_order", f"{w}:{d}:{c_id}"),
        *(ctx.call(STOCK, "order_line", f"{sw}:{i}", i, qty, d, sw != w) for i, sw, qty in lines),
    )
    discount, _last, credit = customer
    rows: list[list[Any]] = []
    amounts = 0
    for (i, sw, qty), (price, _name, dist_info, _brand) in zip(lines, supplied, strict=True):
        amount = qty * price
        amounts += amount
        rows.append([i, sw, qty, amount, dist_info])
    order = {
        "c_id": c_id,
        "entry_d": int(ctx.now() * 1000),
        "carrier_id": None,
        "ol_cnt": len(lines),
        "all_local": all(sw == w for _i, sw, _q in lines),
        "lines": rows,
    }
    ctx.call_async(ORDER, "insert", f"{w}:{d}:{o_id}", order)
    ctx.call_async(NEW_ORDER, "insert", f"{w}:{d}:{o_id}", o_id)
    total = amounts * (10_000 - discount) * (10_000 + w_tax + district["tax"]) // 100_000_000
    return {"o_id": o_id, "ol_cnt": len(lines), "total": total, "credit": credit}


async def warehouse_tax(ctx: Context) -> int:
    row = await ctx.get()
    if row is None:
        raise Abort(f"no warehouse {ctx.key}")
    return int(row["tax"])


async def customer_for_order(ctx: Context) -> list[Any]:
    """[C_DISCOUNT, C_LAST, C_CREDIT] (read-only)."""
    row = await ctx.get()
    if row is None:
        raise Abort(f"no customer {ctx.key}")
    return [row["discount"], row["last"], row["credit"]]


async def item_info(ctx: Context) -> list[Any]:
    """[I_PRICE, I_NAME, I_DATA]; an unused item id aborts the transaction (the spec's 1 % rollback)."""
    row = await ctx.get()
    if row is None:
        raise Abort(f"item number {ctx.key} is not valid")
    return [row["price"], row["name"], row["data"]]


async def stock_order_line(ctx: Context, i_id: int, qty: int, d_id: int, remote: bool) -> list[Any]:
    """One order line: read the item, take ``qty`` from this stock row; [price, name, dist_info, brand]."""
    price, name, i_data = await ctx.call(ITEM, "info", str(i_id))
    row = await ctx.get()
    if row is None:
        raise Abort(f"no stock row {ctx.key}")
    q = row["quantity"]
    row["quantity"] = q - qty if q >= qty + 10 else q - qty + 91
    row["ytd"] += qty
    row["order_cnt"] += 1
    if remote:
        row["remote_cnt"] += 1
    await ctx.put(row)
    brand = "B" if "ORIGINAL" in i_data and "ORIGINAL" in row["data"] else "G"
    return [price, name, row["dist"][d_id - 1], brand]


async def insert(ctx: Context, value: Any) -> None:
    """Insert a row NewOrder creates (order, new-order); the entity must not exist yet."""
    if await ctx.get() is not None:
        raise Abort(f"{ctx.operator} {ctx.key} already exists")
    await ctx.put(value)


# Payment -------------------------------------------------------------------------------------------


async def payment(ctx: Context, c_w: int, c_d: int, c_id: int | None, c_last: str | None, amount: int) -> Row:
    """TPC-C Payment of ``amount`` cents at district ``w:d`` by customer ``c_w:c_d:c_id`` (or, with
    ``c_id=None``, the customer found by last name ``c_last``)."""
    w, d = _ints(ctx.key)
    district = await ctx.get()
    if district is None:
        raise Abort(f"no district {ctx.key}")
    district["ytd"] += amount
    await ctx.put(district)
    if c_id is None:
        w_name, c_id = await asyncio.gather(
            ctx.call(WAREHOUSE, "pay", str(w), amount),
            ctx.call(CUSTOMER_NAME, "middle", f"{c_w}:{c_d}:{c_last}"),
        )
    else:
        w_name = await ctx.call(WAREHOUSE, "pay", str(w), amount)
    h_data = f"{w_name}    {district['name']}"
    balance = await ctx.call(CUSTOMER, "pay", f"{c_w}:{c_d}:{c_id}", w, d, amount, h_data)
    return {"c_id": c_id, "balance": balance}


async def warehouse_pay(ctx: Context, amount: int) -> str:
    """W_YTD += amount; returns W_NAME."""
    row = await ctx.get()
    if row is None:
        raise Abort(f"no warehouse {ctx.key}")
    row["ytd"] += amount
    await ctx.put(row)
    return str(row["name"])


async def customer_name_middle(ctx: Context) -> int:
    """The customer at position ⌈n/2⌉ of the ``n`` with this last name, sorted by C_FIRST."""
    ids = await ctx.get()
    if not ids:
        raise Abort(f"no customer with last name {ctx.key}")
    return int(ids[(len(ids) - 1) // 2])


async def customer_pay(ctx: Context, w: int, d: int, amount: int, h_data: str) -> int:
    """The customer's side of a Payment made at district ``w:d``; inserts the history row."""
    row = await ctx.get()
    if row is None:
        raise Abort(f"no customer {ctx.key}")
    c_w, c_d, c_id = _ints(ctx.key)
    row["balance"] -= amount
    row["ytd_payment"] += amount
    row["payment_cnt"] += 1
    if row["credit"] == "BC":
        row["data"] = f"{c_id} {c_d} {c_w} {d} {w} {amount}|{row['data']}"[:500]
    await ctx.put(row)
    history = {
        "c_w": c_w,
        "c_d": c_d,
        "c_id": c_id,
        "w": w,
        "d": d,
        "date": int(ctx.now() * 1000),
        "amount": amount,
        "data": h_data,
    }
    ctx.call_async(HISTORY, "insert", f"{ctx.key}:{row['payment_cnt']}", history)
    return int(row["balance"])


# Per operator: function name -> (function, read-only); every operator also has the COMMON ones.
FUNCTIONS: dict[str, dict[str, tuple[UserFunction, bool]]] = {
    WAREHOUSE: {"tax": (warehouse_tax, True), "pay": (warehouse_pay, False)},
    DISTRICT: {"new_order": (new_order, False), "payment": (payment, False)},
    CUSTOMER: {"for_order": (customer_for_order, True), "pay": (customer_pay, False)},
    CUSTOMER_NAME: {"middle": (customer_name_middle, True)},
    HISTORY: {"insert": (insert, False)},
    ITEM: {"info": (item_info, True)},
    STOCK: {"order_line": (stock_order_line, False)},
    ORDER: {"insert": (insert, False)},
    NEW_ORDER: {"insert": (insert, False)},
}
COMMON: dict[str, tuple[UserFunction, bool]] = {
    "put": (put, False),
    "get": (get, True),
    "bulk_put": (bulk_put, False),
    "get_many": (get_many, True),
}


def build_app(name: str = "tpcc", overrides: Mapping[tuple[str, str], UserFunction] | None = None) -> Graph:
    """The TPC-C graph; ``overrides`` replaces functions by (operator, function) (fault injection in tests).

    Functions name their targets by string, so one set of functions serves every graph built here.
    """
    overrides = dict(overrides or {})
    operators: list[Operator] = []
    for op_name, partitions in PARTITIONS.items():
        op = Operator(op_name, partitions=partitions)
        for fname, (fn, read_only) in {**COMMON, **FUNCTIONS[op_name]}.items():
            op.function(overrides.pop((op_name, fname), fn), name=fname, read_only=read_only)
        operators.append(op)
    if overrides:
        raise ValueError(f"overrides of unknown functions: {sorted(overrides)}")
    return Graph(name, operators)


app = build_app()

# ---- population -------------------------------------------------------------------------------------

DISTRICTS = 10
CUSTOMERS = 3000  # per district
ITEMS = 100_000
UNDELIVERED = 900 / 3000  # share of the initial orders with a new-order row (the last ones)
LOAD_TS_MS = 1_700_000_000_000  # O_ENTRY_D, C_SINCE and H_DATE of the initial population
INITIAL_PAYMENT = 1000  # H_AMOUNT of each customer's initial history row: 10.00
C_LAST_LOAD, C_LAST_RUN, C_ID_RUN, OL_I_ID_RUN = 157, 223, 259, 7911  # NURand's C (delta 66 as required)
SYLLABLES = ("BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING")
ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
LOAD_CHUNK = 500  # rows per loading transaction (one put call each, all on one partition)
LOAD_CONCURRENCY = 24  # loading transactions in flight
READ_CHUNK = 40  # entities per reading transaction (sync calls; see get_many)
READ_CONCURRENCY = 200


def last_name(n: int) -> str:
    """C_LAST of the number ``n`` in 0…999: three syllables, by digit."""
    return SYLLABLES[n // 100] + SYLLABLES[n // 10 % 10] + SYLLABLES[n % 10]


def nurand(rng: random.Random, a: int, x: int, y: int, c: int) -> int:
    return (((rng.randint(0, a) | rng.randint(x, y)) + c) % (y - x + 1)) + x


class _Gen:
    """The loader's random values: ints from ``random()`` (``randint`` costs 4x more) and alphanumeric
    strings cut from one random pool. Generating W=1 took 6.3 s with ``randint`` and fresh strings."""

    def __init__(self, rng: random.Random, size: int = 1 << 16) -> None:
        self.rng = rng
        self.random = rng.random
        self.pool = "".join(rng.choices(ALNUM, k=size))

    def num(self, lo: int, hi: int) -> int:
        return lo + int(self.random() * (hi - lo + 1))

    def a(self, lo: int, hi: int) -> str:
        n = lo + int(self.random() * (hi - lo + 1))
        start = int(self.random() * (len(self.pool) - n))
        return self.pool[start : start + n]

    def pieces(self, count: int, size: int) -> list[str]:
        """``count`` random strings of ``size`` characters (cut from one slice)."""
        s = self.a(count * size, count * size)
        return [s[k : k + size] for k in range(0, count * size, size)]

    def data(self, lo: int, hi: int) -> str:
        """I_DATA / S_DATA: 10 % contain "ORIGINAL" at a random position."""
        s = self.a(lo, hi)
        if self.random() < 0.1:
            at = self.num(0, len(s) - 8)
            s = s[:at] + "ORIGINAL" + s[at + 8 :]
        return s

    def address(self) -> str:
        street, city = f"{self.a(10, 20)}|{self.a(10, 20)}", self.a(10, 20)
        return f"{street}|{city}|{self.a(2, 2)}|{self.num(0, 9999):04d}11111"


class Sizes:
    """The cardinalities of one TPC-C population."""

    def __init__(self, warehouses: int, scale: float) -> None:
        if warehouses < 1:
            raise ValueError(f"tpcc needs at least 1 warehouse, got {warehouses}")
        if not scale > 0:
            raise ValueError(f"tpcc scale must be > 0, got {scale}")
        self.warehouses = warehouses
        self.customers = max(1, round(CUSTOMERS * scale))  # per district; also the initial orders
        self.items = max(15, round(ITEMS * scale))  # 15: a NewOrder needs that many distinct items
        self.orders = self.customers
        self.undelivered = max(1, round(self.orders * UNDELIVERED))
        self.names = min(1000, self.customers)  # last names 0 … names-1 all exist

    def rows(self) -> dict[str, int]:
        """Entities per operator (customers 1 … 1000 of a district use every last name 0 … 999)."""
        w, dc = self.warehouses, self.warehouses * DISTRICTS
        return {
            ITEM: self.items,
            WAREHOUSE: w,
            DISTRICT: dc,
            STOCK: w * self.items,
            CUSTOMER: dc * self.customers,
            CUSTOMER_NAME: dc * self.names,
            HISTORY: dc * self.customers,
            ORDER: dc * self.orders,
            NEW_ORDER: dc * self.undelivered,
        }


def _names_of(customers: int, rng: random.Random) -> list[str]:
    """C_LAST of customers 1 … n: the first 1000 by number, the rest NURand(255, 0, 999)."""
    return [
        last_name(c - 1) if c <= 1000 else last_name(nurand(rng, 255, 0, 999, C_LAST_LOAD))
        for c in range(1, customers + 1)
    ]


def generate(sizes: Sizes, seed: int) -> Iterator[tuple[str, str, Any]]:
    """Every row of the initial population as (operator, key, value), deterministic by ``seed``."""
    g = _Gen(random.Random(seed))
    for i in range(1, sizes.items + 1):
        item = {"im_id": g.num(1, 10_000), "name": g.a(14, 24), "price": g.num(100, 10_000)}
        yield ITEM, str(i), {**item, "data": g.data(26, 50)}
    for w in range(1, sizes.warehouses + 1):
        yield from _warehouse_rows(sizes, w, _Gen(random.Random(seed * 100_003 + w)))


def _warehouse_rows(sizes: Sizes, w: int, g: _Gen) -> Iterator[tuple[str, str, Any]]:
    d_ytd = sizes.customers * INITIAL_PAYMENT
    warehouse = {"name": g.a(6, 10), "address": g.address(), "tax": g.num(0, 2000)}
    yield WAREHOUSE, str(w), {**warehouse, "ytd": DISTRICTS * d_ytd}
    for i in range(1, sizes.items + 1):
        stock = {"quantity": g.num(10, 100), "ytd": 0, "order_cnt": 0, "remote_cnt": 0}
        dist = g.pieces(DISTRICTS, 24)
        yield STOCK, f"{w}:{i}", {**stock, "dist": dist, "data": g.data(26, 50)}
    for d in range(1, DISTRICTS + 1):
        district = {"name": g.a(6, 10), "address": g.address(), "tax": g.num(0, 2000)}
        yield DISTRICT, f"{w}:{d}", {**district, "ytd": d_ytd, "next_o_id": sizes.orders + 1}
        yield from _customer_rows(sizes, w, d, g)
        yield from _order_rows(sizes, w, d, g)


def _customer_rows(sizes: Sizes, w: int, d: int, g: _Gen) -> Iterator[tuple[str, str, Any]]:
    """Customers, their initial history rows and the district's last-name index."""
    by_name: defaultdict[str, list[tuple[str, int]]] = defaultdict(list)
    for c, last in enumerate(_names_of(sizes.customers, g.rng), start=1):
        first = g.a(8, 16)
        by_name[last].append((first, c))
        customer = {
            "first": first,
            "middle": "OE",
            "last": last,
            "address": g.address(),
            "phone": f"{g.num(0, 10**16 - 1):016d}",
            "since": LOAD_TS_MS,
            "credit": "BC" if g.random() < 0.1 else "GC",
            "credit_lim": 5_000_000,
            "discount": g.num(0, 5000),
            "balance": -INITIAL_PAYMENT,
            "ytd_payment": INITIAL_PAYMENT,
            "payment_cnt": 1,
            "delivery_cnt": 0,
            "data": g.a(300, 500),
        }
        yield CUSTOMER, f"{w}:{d}:{c}", customer
        history = {"c_w": w, "c_d": d, "c_id": c, "w": w, "d": d, "date": LOAD_TS_MS}
        yield HISTORY, f"{w}:{d}:{c}:1", {**history, "amount": INITIAL_PAYMENT, "data": g.a(12, 24)}
    for last, people in sorted(by_name.items()):
        yield CUSTOMER_NAME, f"{w}:{d}:{last}", [c for _first, c in sorted(people)]


def _order_rows(sizes: Sizes, w: int, d: int, g: _Gen) -> Iterator[tuple[str, str, Any]]:
    """Orders 1 … n, one per customer (a random permutation), the last ones undelivered."""
    owners = list(range(1, sizes.customers + 1))
    g.rng.shuffle(owners)
    first_new = sizes.orders - sizes.undelivered + 1
    for o in range(1, sizes.orders + 1):
        delivered = o < first_new
        lines = [
            [g.num(1, sizes.items), w, 5, 0 if delivered else g.num(1, 999_999), dist_info]
            for dist_info in g.pieces(g.num(5, 15), 24)
        ]
        carrier = g.num(1, 10) if delivered else None
        order = {"c_id": owners[o - 1], "entry_d": LOAD_TS_MS, "carrier_id": carrier, "ol_cnt": len(lines)}
        yield ORDER, f"{w}:{d}:{o}", {**order, "all_local": True, "lines": lines}
        if not delivered:
            yield NEW_ORDER, f"{w}:{d}:{o}", o


def _root_keys(partitions: int) -> list[str]:
    """A key on each partition ``p``: a bulk transaction rooted there makes only local calls."""
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < partitions:
        keys.setdefault(partition_of(f"~bulk{i}", partitions), f"~bulk{i}")
        i += 1
    return [keys[p] for p in range(partitions)]


def bulk_batches(rows: Iterable[tuple[str, str, Any]], chunk: int = LOAD_CHUNK) -> Iterator[Op]:
    """Group rows by (operator, partition) into ``bulk_put`` calls of up to ``chunk`` rows.

    Each call is rooted at a key of the rows' own partition, so its puts never leave the worker.
    """
    roots = {op: _root_keys(n) for op, n in PARTITIONS.items()}
    buffers: dict[tuple[str, int], list[list[Any]]] = defaultdict(list)
    for op, key, value in rows:
        p = partition_of(key, PARTITIONS[op])
        buf = buffers[(op, p)]
        buf.append([key, value])
        if len(buf) >= chunk:
            yield Op("load", op, roots[op][p], "bulk_put", (buf,))
            buffers[(op, p)] = []
    for (op, p), buf in sorted(buffers.items()):
        if buf:
            yield Op("load", op, roots[op][p], "bulk_put", (buf,))


def read_batches(keys: Iterable[tuple[str, str]], chunk: int = READ_CHUNK) -> Iterator[Op]:
    """``get_many`` calls reading ``(operator, key)`` pairs, grouped like :func:`bulk_batches`."""
    roots = {op: _root_keys(n) for op, n in PARTITIONS.items()}
    buffers: dict[tuple[str, int], list[str]] = defaultdict(list)
    for op, key in keys:
        p = partition_of(key, PARTITIONS[op])
        buf = buffers[(op, p)]
        buf.append(key)
        if len(buf) >= chunk:
            yield Op("read", op, roots[op][p], "get_many", (buf,))
            buffers[(op, p)] = []
    for (op, p), buf in sorted(buffers.items()):
        if buf:
            yield Op("read", op, roots[op][p], "get_many", (buf,))


# ---- the workload -----------------------------------------------------------------------------------

MAX_MESSAGES_PER_CONDITION = 20


class _Report:
    """Violations by condition, at most :data:`MAX_MESSAGES_PER_CONDITION` spelled out for each."""

    def __init__(self) -> None:
        self.by_condition: dict[str, list[str]] = defaultdict(list)

    def add(self, condition: str, message: str) -> None:
        self.by_condition[condition].append(f"{condition}: {message}")

    def messages(self) -> list[str]:
        out: list[str] = []
        for condition, messages in self.by_condition.items():
            out += messages[:MAX_MESSAGES_PER_CONDITION]
            if len(messages) > MAX_MESSAGES_PER_CONDITION:
                out.append(f"{condition}: … and {len(messages) - MAX_MESSAGES_PER_CONDITION} more violations")
        return out


def _ids(values: Iterable[int], limit: int = 5) -> str:
    ordered = sorted(values)
    shown = ", ".join(map(str, ordered[:limit]))
    return shown + (", …" if len(ordered) > limit else "")


class _Tables:
    """The rows of a state map that the check needs, parsed from their keys."""

    def __init__(self, state: State, report: _Report) -> None:
        self.warehouses: dict[int, Row] = {}
        self.districts: dict[tuple[int, int], Row] = {}
        self.customers: dict[tuple[int, int, int], Row] = {}
        self.orders: defaultdict[tuple[int, int], dict[int, Row]] = defaultdict(dict)
        self.new_orders: defaultdict[tuple[int, int], set[int]] = defaultdict(set)
        self.history: list[Row] = []
        arity = {WAREHOUSE: 1, DISTRICT: 2, CUSTOMER: 3, ORDER: 3, NEW_ORDER: 3, HISTORY: 4}
        for (op, key), value in state.items():
            n = arity.get(op)
            if n is None or value is None:
                continue  # another table, or an absent row
            try:
                ids = _ints(key)
            except ValueError:
                ids = []
            if len(ids) != n:
                report.add("keys", f"{op} key {key!r} is not {n} integers joined by ':'")
                continue
            if op == WAREHOUSE:
                self.warehouses[ids[0]] = value
            elif op == DISTRICT:
                self.districts[(ids[0], ids[1])] = value
            elif op == CUSTOMER:
                self.customers[(ids[0], ids[1], ids[2])] = value
            elif op == ORDER:
                self.orders[(ids[0], ids[1])][ids[2]] = value
            elif op == NEW_ORDER:
                self.new_orders[(ids[0], ids[1])].add(ids[2])
            else:
                self.history.append(value)


class Tpcc(Workload):
    """TPC-C NewOrder + Payment over ``Options.warehouses`` warehouses (see the module docstring)."""

    name = "tpcc"
    app = "styx_py.benchmarks.tpcc:app"
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
            return Op("payment", DISTRICT, f"{w}:{d}", "payment", (c_w, c_d, None, last, amount))
        c_id = nurand(rng, 1023, 1, sizes.customers, C_ID_RUN)
        return Op("payment", DISTRICT, f"{w}:{d}", "payment", (c_w, c_d, c_id, None, amount))

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
        """Warehouses, districts and customers; then every order and new-order row up to D_NEXT_O_ID
        (one past it, to see rows beyond) and every customer's history rows 1 … C_PAYMENT_CNT."""
        sizes = self.sizes
        state: dict[tuple[str, Key], Any] = {}
        districts = [(w, d) for w in range(1, sizes.warehouses + 1) for d in range(1, DISTRICTS + 1)]
        first = [(WAREHOUSE, str(w)) for w in range(1, sizes.warehouses + 1)]
        first += [(DISTRICT, f"{w}:{d}") for w, d in districts]
        first += [(CUSTOMER, f"{w}:{d}:{c}") for w, d in districts for c in range(1, sizes.customers + 1)]
        await _read(client, first, state)
        second: list[tuple[str, str]] = []
        for w, d in districts:
            district = state.get((DISTRICT, f"{w}:{d}"))
            if district is not None:
                for o in range(1, district["next_o_id"] + 1):
                    second += [(ORDER, f"{w}:{d}:{o}"), (NEW_ORDER, f"{w}:{d}:{o}")]
        for (op, key), value in list(state.items()):
            if op == CUSTOMER:
                second += [(HISTORY, f"{key}:{n}") for n in range(1, value["payment_cnt"] + 1)]
        await _read(client, second, state)
        return state

    def check_state(self, state: State) -> list[str]:
        report = _Report()
        t = _Tables(state, report)
        sizes = self.sizes
        paid_at_w: defaultdict[int, int] = defaultdict(int)
        paid_at_d: defaultdict[tuple[int, int], int] = defaultdict(int)
        paid_by: defaultdict[tuple[int, int, int], list[int]] = defaultdict(list)
        for h in t.history:
            paid_at_w[h["w"]] += h["amount"]
            paid_at_d[(h["w"], h["d"])] += h["amount"]
            paid_by[(h["c_w"], h["c_d"], h["c_id"])].append(h["amount"])
        delivered: defaultdict[tuple[int, int, int], int] = defaultdict(int)
        for (w, d), orders in t.orders.items():
            for order in orders.values():
                if order["carrier_id"] is not None:
                    delivered[(w, d, order["c_id"])] += sum(line[3] for line in order["lines"])

        for w in range(1, sizes.warehouses + 1):
            self._check_warehouse(report, t, w, paid_at_w[w])
            for d in range(1, DISTRICTS + 1):
                self._check_district(report, t, w, d, paid_at_d[(w, d)])
        for w in range(1, sizes.warehouses + 1):
            for d in range(1, DISTRICTS + 1):
                for c in range(1, sizes.customers + 1):
                    self._check_customer(report, t, (w, d, c), paid_by[(w, d, c)], delivered[(w, d, c)])
        return report.messages()

    @staticmethod
    def _check_warehouse(report: _Report, t: _Tables, w: int, paid: int) -> None:
        warehouse = t.warehouses.get(w)
        if warehouse is None:
            report.add("missing", f"warehouse {w} is missing")
            return
        d_ytd = sum(t.districts[(w, d)]["ytd"] for d in range(1, DISTRICTS + 1) if (w, d) in t.districts)
        if warehouse["ytd"] != d_ytd:
            report.add(
                "condition 1",
                f"warehouse {w}: W_YTD = {warehouse['ytd']} but its districts' D_YTD sum to {d_ytd} "
                f"(cents, difference {warehouse['ytd'] - d_ytd:+d})",
            )
        if warehouse["ytd"] != paid:
            report.add(
                "condition 8",
                f"warehouse {w}: W_YTD = {warehouse['ytd']} but the sum of H_AMOUNT of the payments made "
                f"there = {paid} (cents, difference {warehouse['ytd'] - paid:+d})",
            )

    @staticmethod
    def _check_district(report: _Report, t: _Tables, w: int, d: int, paid: int) -> None:
        district = t.districts.get((w, d))
        if district is None:
            report.add("missing", f"district {w}:{d} is missing")
            return
        name = f"district {w}:{d}"
        orders = t.orders.get((w, d), {})
        new_orders = t.new_orders.get((w, d), set())
        last = district["next_o_id"] - 1
        max_o = max(orders, default=0)
        max_no = max(new_orders, default=0)
        if max_o != last:
            report.add("condition 2", f"{name}: D_NEXT_O_ID - 1 = {last} but max(O_ID) = {max_o}")
        if max_no != last:
            report.add("condition 2", f"{name}: D_NEXT_O_ID - 1 = {last} but max(NO_O_ID) = {max_no}")
        if new_orders:
            span = max_no - min(new_orders) + 1
            if span != len(new_orders):
                missing = set(range(min(new_orders), max_no + 1)) - new_orders
                report.add(
                    "condition 3",
                    f"{name}: max(NO_O_ID) - min(NO_O_ID) + 1 = {max_no} - {min(new_orders)} + 1 = {span} "
                    f"but there are {len(new_orders)} new-order rows (missing NO_O_ID {_ids(missing)})",
                )
        ol_cnt = sum(o["ol_cnt"] for o in orders.values())
        ol_rows = sum(len(o["lines"]) for o in orders.values())
        if ol_cnt != ol_rows:
            wrong = [o for o, order in orders.items() if order["ol_cnt"] != len(order["lines"])]
            report.add(
                "condition 4",
                f"{name}: sum of O_OL_CNT = {ol_cnt} but there are {ol_rows} order-line rows "
                f"(orders whose O_OL_CNT differs from their lines: {_ids(wrong)})",
            )
        undelivered = {o for o, order in orders.items() if order["carrier_id"] is None}
        if undelivered - new_orders:
            lost = undelivered - new_orders
            report.add(
                "condition 5",
                f"{name}: {len(lost)} orders with a null O_CARRIER_ID have no new-order row "
                f"(O_ID {_ids(lost)})",
            )
        if new_orders - undelivered:
            stray = new_orders - undelivered
            report.add(
                "condition 5",
                f"{name}: {len(stray)} new-order rows have no order or a delivered one "
                f"(NO_O_ID {_ids(stray)})",
            )
        if district["ytd"] != paid:
            report.add(
                "condition 9",
                f"{name}: D_YTD = {district['ytd']} but the sum of H_AMOUNT of the payments made there = "
                f"{paid} "
                f"(cents, difference {district['ytd'] - paid:+d})",
            )

    @staticmethod
    def _check_customer(
        report: _Report, t: _Tables, c_key: tuple[int, int, int], paid: list[int], delivered: int
    ) -> None:
        customer = t.customers.get(c_key)
        name = "customer {}:{}:{}".format(*c_key)
        if customer is None:
            report.add("missing", f"{name} is missing")
            return
        total = sum(paid)
        if customer["balance"] != delivered - total:
            report.add(
                "condition 10",
                f"{name}: C_BALANCE = {customer['balance']} but delivered OL_AMOUNT - paid H_AMOUNT = "
                f"{delivered} - {total} = {delivered - total} (cents)",
            )
        if customer["ytd_payment"] != total:
            report.add(
                "customer payments",
                f"{name}: C_YTD_PAYMENT = {customer['ytd_payment']} but its history amounts sum to {total} "
                "(cents)",
            )
        if customer["payment_cnt"] != len(paid):
            report.add(
                "customer payments",
                f"{name}: C_PAYMENT_CNT = {customer['payment_cnt']} but it has {len(paid)} history rows",
            )


async def _read(client: StyxClient, keys: list[tuple[str, str]], into: dict[tuple[str, Key], Any]) -> None:
    """Read ``(operator, key)`` pairs through ``get_many``; absent entities are left out of ``into``."""
    from styx_py.core.wire import decode_value

    ops = list(read_batches(keys))
    replies = await client.submit_many(
        ((op.operator, op.key, op.function, op.args) for op in ops), concurrency=READ_CONCURRENCY
    )
    for op, reply in zip(ops, replies, strict=True):
        if reply.status != "committed":
            raise RuntimeError(f"tpcc: reading {op.operator} failed: {reply.status} {reply.error}")
        for key, value in zip(op.args[0], decode_value(reply.result), strict=True):
            if value is not None:
                into[(op.operator, key)] = value
